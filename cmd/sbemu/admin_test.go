package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu"
)

// TestRunServesTheAdminAPI starts the command with -admin-cert and reaches
// the administration API the way a client in another process would: the
// admin port as the namespace, trusting the written certificate.
func TestRunServesTheAdminAPI(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	certPath := filepath.Join(t.TempDir(), "admin.pem")
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-queue", "orders", "-admin-cert", certPath}, outW, errW)
		_, _ = outW.Close(), errW.Close()
	}()

	// The log line naming the admin address comes before the connection
	// string is printed.
	found := make(chan string, 1)
	go func() {
		logs := bufio.NewScanner(errR)
		re := regexp.MustCompile(`admin API listening"? addr=(\S+)`)
		for logs.Scan() {
			if m := re.FindStringSubmatch(logs.Text()); m != nil {
				found <- m[1]
			}
		}
	}()
	var adminAddr string
	select {
	case adminAddr = <-found:
	case <-time.After(20 * time.Second):
		t.Fatal("the admin address was never logged")
	}
	line, err := bufio.NewReader(outR).ReadString('\n')
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(line, "Endpoint=sb://"))
	go func() { _, _ = io.Copy(io.Discard, outR) }()

	pemBytes, err := os.ReadFile(certPath)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(pemBytes))
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	defer tr.CloseIdleConnections()
	cs := "Endpoint=sb://" + adminAddr + ";SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE"
	ac, err := admin.NewClientFromConnectionString(cs, &admin.ClientOptions{ClientOptions: azcore.ClientOptions{Transport: &http.Client{Transport: tr}}})
	require.NoError(t, err)
	opCtx, opCancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer opCancel()
	q, err := ac.GetQueue(opCtx, "orders", nil)
	require.NoError(t, err)
	require.NotNil(t, q)
	assert.Equal(t, "orders", q.QueueName)
	tr.CloseIdleConnections()

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return after cancellation")
	}
}

// runUntilStopped runs the command with args until the returned stop is
// called, and returns the connection string it printed.
func runUntilStopped(t *testing.T, args ...string) (connStr string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, args, outW, io.Discard)
		_ = outW.Close()
	}()
	line, err := bufio.NewReader(outR).ReadString('\n')
	require.NoError(t, err)
	go func() { _, _ = io.Copy(io.Discard, outR) }()
	return strings.TrimSpace(line), func() {
		t.Helper()
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Fatal("run did not return after cancellation")
		}
	}
}

// TestRunWithDataServesClientsInOtherProcesses is the dead-letter monitor's
// set-up: sbemu -data DIR on a free admin port, and an admin client built
// only from DIR with sbemu.AdminClientOptionsFromDir. The same client keeps
// working after a restart, although the admin port and the server
// certificate are new, because the certificate authority is kept in DIR.
// Before, -data kept no certificate: a client trusting the first run's
// -admin-cert failed with "x509: certificate signed by unknown authority"
// after every restart.
func TestRunWithDataServesClientsInOtherProcesses(t *testing.T) {
	dir := t.TempDir()
	certPath := filepath.Join(t.TempDir(), "admin.pem")
	args := []string{"-addr", "127.0.0.1:0", "-queue", "orders", "-data", dir, "-admin-cert", certPath, "-strict-auth"}
	connStr, stop := runUntilStopped(t, args...)
	for _, name := range []string{sbemu.AdminCAFile, sbemu.AdminCAKeyFile, sbemu.EndpointsFile} {
		assert.FileExists(t, filepath.Join(dir, name))
	}
	firstPEM, err := os.ReadFile(certPath)
	require.NoError(t, err)
	caPEM, err := os.ReadFile(filepath.Join(dir, sbemu.AdminCAFile))
	require.NoError(t, err)
	assert.Equal(t, string(caPEM), string(firstPEM), "-admin-cert writes the authority kept in -data")

	opts, err := sbemu.AdminClientOptionsFromDir(dir)
	require.NoError(t, err)
	ac, err := admin.NewClientFromConnectionString(connStr, opts)
	require.NoError(t, err)
	dlq := func() (int32, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		resp, err := ac.GetQueueRuntimeProperties(ctx, "orders", nil)
		if err != nil {
			return 0, err
		}
		return resp.DeadLetterMessageCount, nil
	}
	_, err = dlq()
	require.NoError(t, err)
	stop()

	// The restarted emulator listens on another AMQP port too; the admin
	// client still names the first one in its URLs, which only matters for
	// the token's audience, signed for that URL and checked against it.
	_, stop = runUntilStopped(t, args...)
	defer stop()
	secondPEM, err := os.ReadFile(certPath)
	require.NoError(t, err)
	assert.Equal(t, string(firstPEM), string(secondPEM), "the certificate authority is stable across restarts")
	_, err = dlq()
	require.NoError(t, err, "the same admin client reaches the restarted emulator")
}
