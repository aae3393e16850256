package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/sbtest"
)

func TestCheckListen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr, token string
		ok          bool
	}{
		{"127.0.0.1:8080", "", true},
		{"[::1]:8080", "", true},
		{"localhost:0", "", true},
		{":8080", "", false},
		{"0.0.0.0:8080", "", false},
		{"10.1.2.3:8080", "", false},
		{"0.0.0.0:8080", "t", true},
		{"nonsense", "", false},
	} {
		err := checkListen(tc.addr, tc.token)
		assert.Equal(t, tc.ok, err == nil, "%s token %q: %v", tc.addr, tc.token, err)
	}
}

// TestServeNeedsATokenOffLoopback: a public address without a token is a usage error, before anything
// connects or listens.
func TestServeNeedsATokenOffLoopback(t *testing.T) {
	t.Parallel()
	const cs = "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=k;SharedAccessKey=x;UseDevelopmentEmulator=true"
	code, _, errOut := cliNoEntity(t, "", "--connection-string", cs, "--queue", "orders", "serve", "--listen", "0.0.0.0:0")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "is not a loopback address: give --token")
	code, _, errOut = cliNoEntity(t, "", "--connection-string", cs, "serve")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "serve needs at least one entity")
}

// TestServeOnLoopback: serve binds the loopback address, serves the console for the entities given
// (the common flags' and --entity), and stops when interrupted.
func TestServeOnLoopback(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.seed(t, "perm-1")
	addrs := make(chan string, 1)
	var out, errOut bytes.Buffer
	a := &app{stdin: strings.NewReader(""), stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }, now: time.Now,
		hooks: hooks{serving: func(addr string) { addrs <- addr }}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- a.run(ctx, []string{"--connection-string", h.Em.ConnectionString(), "--queue", sbtest.Queue, "serve",
			"--listen", "127.0.0.1:0", "--entity", "orders-other"})
	}()
	var addr string
	select {
	case addr = <-addrs:
	case code := <-done:
		t.Fatalf("serve exited %d: %s", code, errOut.String())
	case <-time.After(sbtest.Timeout):
		t.Fatal("serve did not listen")
	}
	assert.True(t, strings.HasPrefix(addr, "127.0.0.1:"), addr)
	client := &http.Client{Timeout: sbtest.Timeout}
	resp, err := client.Get("http://" + addr + "/deadletters?e=orders")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, string(body), "1 dead letter in 1 failure group")
	resp, err = client.Get("http://" + addr + "/")
	require.NoError(t, err)
	body, err = io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.NoError(t, err)
	assert.Contains(t, string(body), `data-entity="orders-other"`, "the --entity one is shown too")
	assert.NotContains(t, errOut.String(), h.Em.ConnectionString())

	// DNS rebinding: another site's name pointed at 127.0.0.1 is refused.
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
	require.NoError(t, err)
	req.Host = "evil.example:8080"
	resp, err = client.Do(req)
	require.NoError(t, err)
	body, err = io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode)
	assert.Contains(t, string(body), "only to loopback names")
	req.Host = "localhost:8080"
	resp, err = client.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	cancel()
	select {
	case code := <-done:
		assert.Equal(t, exitOK, code, errOut.String())
	case <-time.After(sbtest.Timeout):
		t.Fatal("serve did not stop")
	}
}
