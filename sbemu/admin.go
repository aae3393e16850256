package sbemu

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
)

// The administration API: the HTTPS/ATOM endpoint that the SDK's admin
// client (github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin)
// and the JavaScript and Python administration clients use to create, read,
// update and delete entities and to read their runtime counts.
//
// How the SDK reaches a namespace (azservicebus v1.11.0, internal/atom/
// entity_manager.go, newEntityManagerImpl and execute): the base URL is
// always "https://" + the connection string's host (with its port, if any)
// + "/", whatever UseDevelopmentEmulator says; every request carries
// api-version=2024-05 as a query parameter and, from
// internal/atom/per_retry_auth_policy.go, an Authorization header holding
// a SAS token whose audience is the full request URL. An emulator
// connection string names the AMQP port, which speaks plain AMQP, so the
// admin client cannot reach the emulator by its URL alone: the emulator
// serves the API over TLS on a port of its own and hands out an HTTP
// transport ([Emulator.AdminClientOptions], [Emulator.AdminHTTPClient])
// that sends every request, whatever its URL, to that port and trusts the
// self-signed certificate made at start.

// adminServerName is the TLS server name the emulator's own transport asks
// for; the certificate also names 127.0.0.1, ::1, localhost, the listen
// host and [InMemoryHost], for clients that connect by address.
const adminServerName = "sbemu-admin.localhost"

// adminServer is the HTTPS side of an emulator.
type adminServer struct {
	e       *Emulator
	ln      net.Listener
	mem     *memListener // with Config.InMemory; nil otherwise
	srv     *http.Server
	pool    *x509.CertPool
	cert    *x509.Certificate
	started time.Time
	served  chan struct{} // closed when Serve has returned

	// mu serialises changes, so that "exists?" and "create" are one step,
	// and guards meta and transports.
	mu         sync.Mutex
	meta       map[string]*entityMeta // by lower-case entity path
	transports []*http.Transport
}

// entityMeta is what the broker does not keep but the API reports.
type entityMeta struct {
	created, updated time.Time
	echoedSettings   // admin_echoed.go
}

// startAdmin creates the certificate and starts serving the API on
// cfg.AdminAddr (or in memory).
func (e *Emulator) startAdmin() error {
	a := &adminServer{e: e, meta: map[string]*entityMeta{}, served: make(chan struct{}), started: e.cfg.Clock.Now()}
	host := ""
	if !e.cfg.InMemory {
		host, _, _ = net.SplitHostPort(e.ln.Addr().String())
	}
	cert, err := newAdminCertificate(host)
	if err != nil {
		return fmt.Errorf("sbemu: creating the admin API certificate: %w", err)
	}
	a.cert = cert.Leaf
	a.pool = x509.NewCertPool()
	a.pool.AddCert(cert.Leaf)
	if e.cfg.InMemory {
		a.mem = newMemListener()
		a.ln = a.mem
	} else if a.ln, err = net.Listen("tcp", e.cfg.AdminAddr); err != nil {
		return fmt.Errorf("sbemu: listening for the admin API on %s: %w", e.cfg.AdminAddr, err)
	}
	a.srv = &http.Server{
		Handler:           http.HandlerFunc(a.serveHTTP),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       time.Minute,
		ErrorLog:          slog.NewLogLogger(e.log.Handler(), slog.LevelDebug),
	}
	e.admin = a
	go func() {
		defer close(a.served)
		if err := a.srv.ServeTLS(a.ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			e.log.Warn("sbemu: admin API stopped", "err", err)
		}
	}()
	e.log.Info("sbemu: admin API listening", "addr", a.ln.Addr().String())
	return nil
}

// stopAdmin closes the server, its connections and the idle connections of
// every transport handed out, and waits for the serving goroutine and for
// requests in flight (at most two seconds).
func (e *Emulator) stopAdmin() {
	a := e.admin
	if a == nil {
		return
	}
	// Shutdown lets requests in flight finish (their handlers touch the
	// broker, which closes next); Close cuts whatever is left after a
	// bounded wait.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := a.srv.Shutdown(ctx); err != nil {
		_ = a.srv.Close()
	}
	<-a.served
	a.mu.Lock()
	transports := a.transports
	a.mu.Unlock()
	for _, t := range transports {
		t.CloseIdleConnections()
	}
}

// AdminEndpoint is the base URL the administration API is served on, such
// as "https://127.0.0.1:50123/"; with [Config.InMemory] it names
// [InMemoryHost] and is reachable only through [Emulator.AdminHTTPClient].
// Clients other than the Go SDK (JavaScript, Python, curl) can use its host
// as the namespace if they trust [Emulator.AdminRootCAs].
func (e *Emulator) AdminEndpoint() string {
	if e.admin.mem != nil {
		return "https://" + InMemoryHost + "/"
	}
	return "https://" + e.admin.ln.Addr().String() + "/"
}

// AdminCertificatePEM returns the admin certificate in PEM form, for
// clients that read trust anchors from a file (NODE_EXTRA_CA_CERTS for the
// JavaScript SDK, REQUESTS_CA_BUNDLE or SSL_CERT_FILE for Python, curl
// --cacert). It is public: it holds no private key.
func (e *Emulator) AdminCertificatePEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: e.admin.cert.Raw})
}

// AdminRootCAs returns a pool holding the emulator's self-signed admin
// certificate, made when the emulator started.
func (e *Emulator) AdminRootCAs() *x509.CertPool { return e.admin.pool.Clone() }

// AdminHTTPClient returns an HTTP client that sends every request, whatever
// host its URL names, to the emulator's admin API, and trusts its
// certificate. [Emulator.Close] closes its idle connections.
func (e *Emulator) AdminHTTPClient() *http.Client {
	a := e.admin
	var dialer net.Dialer
	addr := a.ln.Addr().String()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if a.mem != nil {
				return a.mem.dial(ctx)
			}
			return dialer.DialContext(ctx, "tcp", addr)
		},
		TLSClientConfig:     &tls.Config{RootCAs: a.pool, ServerName: adminServerName, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}
	a.mu.Lock()
	a.transports = append(a.transports, tr)
	a.mu.Unlock()
	return &http.Client{Transport: tr, Timeout: time.Minute}
}

// AdminClientOptions returns options for admin.NewClientFromConnectionString
// (or admin.NewClient) that reach this emulator's administration API:
//
//	ac, err := admin.NewClientFromConnectionString(em.ConnectionString(), em.AdminClientOptions())
//
// The SDK builds its URLs from the connection string's host; the transport
// from [Emulator.AdminHTTPClient] delivers them to the admin port instead.
// Retries keep the SDK's defaults.
func (e *Emulator) AdminClientOptions() *admin.ClientOptions {
	return &admin.ClientOptions{ClientOptions: azcore.ClientOptions{Transport: e.AdminHTTPClient()}}
}

// newAdminCertificate makes a self-signed ECDSA P-256 certificate valid for
// a day (longer than any test) for the admin server's names.
func newAdminCertificate(host string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "sbemu admin API", Organization: []string{"sbemu"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{adminServerName, "localhost", InMemoryHost},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	if ip := net.ParseIP(host); ip != nil && !ip.IsLoopback() && !ip.IsUnspecified() {
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
	} else if host != "" && ip == nil && !strings.EqualFold(host, "localhost") {
		tmpl.DNSNames = append(tmpl.DNSNames, host)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}
