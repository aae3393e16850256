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
