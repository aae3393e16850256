package sbemu

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// The admin API's certificates. A small certificate authority signs a
// server certificate made at every start. Clients trust the authority
// ([Emulator.AdminCertificatePEM], [Emulator.AdminRootCAs], or the
// [AdminCAFile] in [Config.DataDir]), not the server certificate, so what
// they trust can outlive one run: with DataDir the authority's key and
// certificate are kept there and reused by every later start on that
// directory, so a client that trusted one run (a dead-letter monitor, say)
// still trusts the emulator after a restart. Without DataDir the authority
// is made fresh at every start and exists in memory only.

// File names in [Config.DataDir]. The broker ignores files it does not
// know, so they share the directory with its journal.
const (
	// AdminCAFile holds the admin API's certificate authority, PEM-encoded.
	// It is public (no private key): clients trust it, for example through
	// [AdminClientOptionsFromDir], NODE_EXTRA_CA_CERTS, REQUESTS_CA_BUNDLE
	// or curl --cacert.
	AdminCAFile = "admin-ca.pem"
	// AdminCAKeyFile holds the authority's private key (PKCS #8, PEM),
	// written with mode 0600. Whoever reads it can impersonate the
	// emulator's admin API to clients that trust AdminCAFile.
	AdminCAKeyFile = "admin-ca-key.pem"
)

// adminCAValidity is how long a certificate authority made by the emulator
// is valid: long enough that a kept one never needs replacing in practice.
const adminCAValidity = 10 * 365 * 24 * time.Hour

// adminServerValidity is how long the server certificate made at each start
// is valid; an emulator running longer than that needs a restart.
const adminServerValidity = 365 * 24 * time.Hour

// adminCA is the authority that signs the admin server's certificates.
type adminCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// loadOrCreateAdminCA returns the authority kept in dir, creating and
// keeping one when dir has none; with dir empty it returns a fresh one kept
// nowhere. A directory that holds only one of the two files, or files that
// do not parse or do not belong together, is an error naming the file: a
// silent replacement would break every client that trusts the old one.
func loadOrCreateAdminCA(dir string, log *slog.Logger) (*adminCA, error) {
	if dir == "" {
		return newAdminCA()
	}
	certPath, keyPath := filepath.Join(dir, AdminCAFile), filepath.Join(dir, AdminCAKeyFile)
	certPEM, certErr := os.ReadFile(certPath)
	keyPEM, keyErr := os.ReadFile(keyPath)
	switch {
	case errors.Is(certErr, fs.ErrNotExist) && errors.Is(keyErr, fs.ErrNotExist):
		ca, err := newAdminCA()
		if err != nil {
			return nil, err
		}
		if err := ca.store(certPath, keyPath); err != nil {
			return nil, err
		}
		log.Info("sbemu: created the admin API's certificate authority", "file", certPath)
		return ca, nil
	case certErr != nil:
		return nil, fmt.Errorf("sbemu: reading the admin certificate authority: %w (delete %s and %s to make a new one; clients must then trust the new %s)", certErr, AdminCAFile, AdminCAKeyFile, AdminCAFile)
	case keyErr != nil:
		return nil, fmt.Errorf("sbemu: reading the admin certificate authority's key: %w (delete %s and %s to make a new one; clients must then trust the new %s)", keyErr, AdminCAFile, AdminCAKeyFile, AdminCAFile)
	}
	warnIfReadableByOthers(keyPath, log)
	ca, err := parseAdminCA(certPEM, keyPEM)
	if err != nil {
		// The error names the files, never their content.
		return nil, fmt.Errorf("sbemu: the admin certificate authority in %s: %w", dir, err)
	}
	return ca, nil
}

// newAdminCA makes a self-signed ECDSA P-256 certificate authority that may
// sign only server certificates directly (path length 0).
func newAdminCA() (*adminCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("sbemu: creating the admin certificate authority's key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "sbemu admin API certificate authority", Organization: []string{"sbemu"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(adminCAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("sbemu: creating the admin certificate authority: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &adminCA{cert: cert, key: key}, nil
}

// parseAdminCA reads an authority back from its PEM files and checks that
// the key belongs to the certificate and that it can sign certificates.
func parseAdminCA(certPEM, keyPEM []byte) (*adminCA, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s holds no PEM certificate", AdminCAFile)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", AdminCAFile, err)
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("%s is not a certificate authority", AdminCAFile)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil || kb.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%s holds no PEM private key", AdminCAKeyFile)
	}
	parsed, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		// The parser's message says what is malformed, not the key.
		return nil, fmt.Errorf("%s: %w", AdminCAKeyFile, err)
	}
	key, ok := parsed.(*ecdsa.PrivateKey)
	pub, pubOK := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pubOK || !key.PublicKey.Equal(pub) {
		return nil, fmt.Errorf("%s does not hold the key of %s", AdminCAKeyFile, AdminCAFile)
	}
	if time.Now().After(cert.NotAfter) {
		return nil, fmt.Errorf("%s expired on %s", AdminCAFile, cert.NotAfter.Format(time.RFC3339))
	}
	return &adminCA{cert: cert, key: key}, nil
}

// store writes the key (mode 0600) and then the certificate (0644), each
// through a temporary file and a rename, so a crash leaves either nothing
// or a whole file; the key goes first, so a certificate on disk always has
// its key next to it.
func (ca *adminCA) store(certPath, keyPath string) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return fmt.Errorf("sbemu: encoding the admin certificate authority's key: %w", err)
	}
	if err := writeFileAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return fmt.Errorf("sbemu: keeping the admin certificate authority's key: %w", err)
	}
	if err := writeFileAtomic(certPath, ca.certPEM(), 0o644); err != nil {
		return fmt.Errorf("sbemu: keeping the admin certificate authority: %w", err)
	}
	return nil
}

// certPEM is the authority's certificate in PEM form.
func (ca *adminCA) certPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})
}

// serverCertificate makes a server certificate for the admin API, signed by
// the authority, for [adminServerName], localhost, the loopback addresses,
// [InMemoryHost] and the listen host. Its key is new at every start and
// never written anywhere.
func (ca *adminCA) serverCertificate(host string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := randomSerial()
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	notAfter := now.Add(adminServerValidity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "sbemu admin API", Organization: []string{"sbemu"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{adminServerName, "localhost", InMemoryHost},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	if ip := net.ParseIP(host); ip != nil && !ip.IsLoopback() && !ip.IsUnspecified() {
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
	} else if host != "" && ip == nil && !strings.EqualFold(host, "localhost") {
		tmpl.DNSNames = append(tmpl.DNSNames, host)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	// The chain includes the authority, for clients that want to see it.
	return tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

// randomSerial is a random positive 62-bit certificate serial number.
func randomSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
}

// warnIfReadableByOthers logs a warning when the key file can be read by
// anyone but its owner. It does not refuse to start: the emulator is a
// development tool and the key guards only its own admin API.
func warnIfReadableByOthers(path string, log *slog.Logger) {
	if runtime.GOOS == "windows" {
		return // permission bits mean little there
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		log.Warn("sbemu: the admin certificate authority's key is readable by others; chmod 600 it", "file", path, "mode", fi.Mode().Perm().String())
	}
}

// writeFileAtomic writes data to a temporary file next to path with mode
// perm, syncs it and renames it over path.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() { _ = os.Remove(tmp) }() // after a successful rename it is gone already
	if err := f.Chmod(perm); err != nil {
		_ = f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
