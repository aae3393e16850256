package sbemu

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

// trustingClient is an admin client built by hand, as a program in another
// process would before sbemu had a helper: it trusts pool and sends every
// request to addr.
func trustingClient(t *testing.T, connStr, addr string, pool *x509.CertPool) *admin.Client {
	t.Helper()
	var dialer net.Dialer
	tr := &http.Transport{
		DialContext:     func(ctx context.Context, _, _ string) (net.Conn, error) { return dialer.DialContext(ctx, "tcp", addr) },
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: adminServerName, MinVersion: tls.VersionTLS12},
	}
	t.Cleanup(tr.CloseIdleConnections)
	ac, err := admin.NewClientFromConnectionString(connStr, &admin.ClientOptions{ClientOptions: azcore.ClientOptions{Transport: &http.Client{Transport: tr}}})
	require.NoError(t, err)
	return ac
}

// adminHost is the host:port of an emulator's admin endpoint.
func adminHost(em *Emulator) string {
	return em.admin.ln.Addr().String()
}

// TestAdminCertificateAuthorityIsKeptInTheDataDir restarts an emulator on
// one data directory: the certificate authority it hands out is the same,
// a client that trusted the first run reaches the second, and the key is
// kept with mode 0600. Before, every start made a new self-signed
// certificate, so such a client failed with "x509: certificate signed by
// unknown authority" after a restart, forever.
func TestAdminCertificateAuthorityIsKeptInTheDataDir(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{DataDir: dir, Queues: []broker.QueueConfig{{Name: "orders"}}}
	first, err := Start(cfg)
	require.NoError(t, err)
	trusted := first.AdminRootCAs()
	firstPEM := first.AdminCertificatePEM()
	require.NoError(t, first.Close())

	second := startEmulator(t, cfg)
	assert.Equal(t, string(firstPEM), string(second.AdminCertificatePEM()))
	ac := trustingClient(t, second.ConnectionString(), adminHost(second), trusted)
	q, err := ac.GetQueue(ctxT(t), "orders", nil)
	require.NoError(t, err, "a client trusting the first run reaches the second")
	require.NotNil(t, q)

	onDisk, err := os.ReadFile(filepath.Join(dir, AdminCAFile))
	require.NoError(t, err)
	assert.Equal(t, string(firstPEM), string(onDisk))
	if runtime.GOOS != "windows" {
		fi, err := os.Stat(filepath.Join(dir, AdminCAKeyFile))
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "the key is readable by its owner only")
	}
}

// TestAdminCertificateAuthorityIsFreshWithoutDataDir: without a data
// directory nothing is kept, and two emulators do not share an authority.
func TestAdminCertificateAuthorityIsFreshWithoutDataDir(t *testing.T) {
	a := startEmulator(t, Config{})
	b := startEmulator(t, Config{})
	assert.NotEqual(t, string(a.AdminCertificatePEM()), string(b.AdminCertificatePEM()))
	block, _ := pem.Decode(a.AdminCertificatePEM())
	require.NotNil(t, block)
	ca, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	assert.True(t, ca.IsCA)
}

// TestAdminCertificateAuthorityDamageStopsTheStart: a kept authority that
// is damaged or half there is not replaced behind the clients' backs; the
// start fails naming the file, and the key's content never appears.
func TestAdminCertificateAuthorityDamageStopsTheStart(t *testing.T) {
	const secretish = "MHcCAQEEIBogusKeyMaterialThatMustNotBeEchoed"
	tests := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"certificate without key", map[string]string{AdminCAFile: "x"}, AdminCAKeyFile},
		{"key without certificate", map[string]string{AdminCAKeyFile: secretish}, AdminCAFile},
		{"garbage certificate", map[string]string{AdminCAFile: "not pem", AdminCAKeyFile: secretish}, AdminCAFile},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, content := range tc.files {
				require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600))
			}
			em, err := Start(Config{DataDir: dir})
			if err == nil {
				_ = em.Close()
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), secretish)
		})
	}

	// A key that does not belong to the certificate.
	dir := t.TempDir()
	em, err := Start(Config{DataDir: dir})
	require.NoError(t, err)
	require.NoError(t, em.Close())
	other, err := newAdminCA()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, AdminCAFile), other.certPEM(), 0o644))
	_, err = Start(Config{DataDir: dir})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "does not hold the key")
}

// TestAdminClientOptionsFromDirFollowsRestarts drives a real admin client
// built only from the data directory, as a dead-letter monitor in another
// process would: it works, fails with an error naming the directory while
// the emulator is down, and works again after a restart on new ports,
// with no change on the client's side.
func TestAdminClientOptionsFromDirFollowsRestarts(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{DataDir: dir, StrictAuth: true, Queues: []broker.QueueConfig{{Name: "orders"}}}
	_, err := AdminClientOptionsFromDir(dir)
	require.Error(t, err, "no emulator has run there yet")
	assert.Contains(t, err.Error(), AdminCAFile)

	first, err := Start(cfg)
	require.NoError(t, err)
	connStr := first.ConnectionString()
	ep, err := ReadEndpoints(dir)
	require.NoError(t, err)
	assert.Equal(t, Endpoints{
		AMQPAddr: first.Addr().String(), AdminAddr: adminHost(first), AdminEndpoint: first.AdminEndpoint(),
		AdminCAFile: AdminCAFile, AdminServerName: adminServerName,
	}, ep)

	opts, err := AdminClientOptionsFromDir(dir)
	require.NoError(t, err)
	opts.Retry.MaxRetries = -1 // fail at once while the emulator is down
	ac, err := admin.NewClientFromConnectionString(connStr, opts)
	require.NoError(t, err)
	getOrders := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		_, err := ac.GetQueueRuntimeProperties(ctx, "orders", nil)
		return err
	}
	require.NoError(t, getOrders())

	require.NoError(t, first.Close())
	_, err = ReadEndpoints(dir)
	require.Error(t, err, "Close removes the endpoints file")
	err = getOrders()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no emulator is running with the data directory "+dir)

	second := startEmulator(t, cfg)
	require.NotEqual(t, adminHost(first), adminHost(second), "a new port")
	require.NoError(t, getOrders(), "the same client reaches the restarted emulator")
}

// TestAdminClientOptionsFromDirNamesTheEndpoint: an authority in the
// directory that the running emulator does not use (someone replaced the
// file) fails the handshake with an error naming the admin endpoint and the
// file, not a bare x509 message.
func TestAdminClientOptionsFromDirNamesTheEndpoint(t *testing.T) {
	dir := t.TempDir()
	em := startEmulator(t, Config{DataDir: dir})
	other, err := newAdminCA()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, AdminCAFile), other.certPEM(), 0o644))

	opts, err := AdminClientOptionsFromDir(dir)
	require.NoError(t, err)
	opts.Retry.MaxRetries = -1
	ac, err := admin.NewClientFromConnectionString(em.ConnectionString(), opts)
	require.NoError(t, err)
	_, err = ac.GetQueue(ctxT(t), "queue", nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), em.AdminEndpoint())
	assert.Contains(t, err.Error(), filepath.Join(dir, AdminCAFile))
	assert.Contains(t, err.Error(), "x509")
}

// FuzzParseAdminCA: whatever the two files hold, reading them back never
// panics and never quotes the key file.
func FuzzParseAdminCA(f *testing.F) {
	ca, err := newAdminCA()
	require.NoError(f, err)
	der, err := x509.MarshalPKCS8PrivateKey(ca.key)
	require.NoError(f, err)
	f.Add(ca.certPEM(), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"), []byte("x"))
	f.Fuzz(func(t *testing.T, certPEM, keyPEM []byte) {
		_, err := parseAdminCA(certPEM, keyPEM)
		if err != nil && len(keyPEM) > 16 {
			assert.NotContains(t, err.Error(), string(keyPEM))
		}
	})
}
