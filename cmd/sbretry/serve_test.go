package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/console"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/internal/syncbuf"
	"github.com/sbretry/retry/retryindex"
)

func TestCheckListen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr  string
		token bool
		ok    bool
	}{
		{"127.0.0.1:8080", false, true},
		{"[::1]:8080", false, true},
		{"localhost:0", false, true},
		{":8080", false, false},
		{"0.0.0.0:8080", false, false},
		{"10.1.2.3:8080", false, false},
		{"0.0.0.0:8080", true, true},
		{"nonsense", false, false},
	} {
		err := checkListen(tc.addr, tc.token)
		assert.Equal(t, tc.ok, err == nil, "%s token %v: %v", tc.addr, tc.token, err)
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

// TestReadTokensFile: the tokens file gives each token a name and a role; a malformed line is named
// by its number, and its secret is never repeated.
func TestReadTokensFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(text), 0o600))
		return p
	}
	got, err := readTokensFile(write("ok", "# who role secret\n\nalice reader reader-secret-0123456789\n  bob operator operator-secret-0123456789  \n"))
	require.NoError(t, err)
	assert.Equal(t, []console.Token{
		{Name: "alice", Role: console.RoleReader, Secret: "reader-secret-0123456789"},
		{Name: "bob", Role: console.RoleOperator, Secret: "operator-secret-0123456789"},
	}, got)
	for name, text := range map[string]string{
		"fields": "alice reader\n",
		"role":   "alice admin s3cret-s3cret-s3cret\n",
		"empty":  "# nothing\n",
	} {
		_, err := readTokensFile(write(name, text))
		require.Error(t, err, name)
		assert.NotContains(t, err.Error(), "s3cret", name)
	}
	_, err = readTokensFile(filepath.Join(dir, "missing"))
	assert.Error(t, err)
}

// TestServeWithTokensFileAndAuditFile: serve --tokens-file --audit-file serves a reader its pages and
// refuses its action on the server, and the refusal is in the audit file and the log, without the
// secret.
func TestServeWithTokensFileAndAuditFile(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.seed(t, "perm-1")
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("alice reader reader-secret-0123456789\nbob operator operator-secret-0123456789\n"), 0o600))
	audit := filepath.Join(dir, "audit.jsonl")
	addrs := make(chan string, 1)
	var out bytes.Buffer
	errOut := &syncbuf.Buffer{}
	a := &app{stdin: strings.NewReader(""), stdout: &out, stderr: errOut, getenv: func(string) string { return "" }, now: time.Now,
		hooks: hooks{serving: func(addr string) { addrs <- addr }}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- a.run(ctx, []string{"--connection-string", h.Em.ConnectionString(), "--queue", sbtest.Queue, "serve",
			"--listen", "0.0.0.0:0", "--tokens-file", tokens, "--audit-file", audit})
	}()
	var addr string
	select {
	case addr = <-addrs:
	case code := <-done:
		t.Fatalf("serve exited %d: %s", code, errOut.String())
	case <-time.After(sbtest.Timeout):
		t.Fatal("serve did not listen")
	}
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	base := "http://127.0.0.1:" + port
	client := &http.Client{Timeout: sbtest.Timeout}
	do := func(method, path string, body io.Reader) int {
		req, err := http.NewRequest(method, base+path, body)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer reader-secret-0123456789")
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", base)
		resp, err := client.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusOK, do(http.MethodGet, "/deadletters?e=orders", nil))
	assert.Equal(t, http.StatusForbidden, do(http.MethodPost, "/action/preview", strings.NewReader("action=purge&e=orders&ref=orders%2F%24DeadLetterQueue%3A1")))
	raw, err := os.ReadFile(audit)
	require.NoError(t, err)
	assert.Contains(t, string(raw), `"who":"alice"`)
	assert.Contains(t, string(raw), `"outcome":"refused"`)
	assert.Contains(t, errOut.String(), "sbretry console action")
	for _, secret := range []string{"reader-secret-0123456789", "operator-secret-0123456789"} {
		assert.NotContains(t, string(raw), secret)
		assert.NotContains(t, errOut.String(), secret)
	}
	cancel()
	select {
	case code := <-done:
		assert.Equal(t, exitOK, code, errOut.String())
	case <-time.After(sbtest.Timeout):
		t.Fatal("serve did not stop")
	}
}

// TestServeSessionQueue: serve recognises a session queue given without --session-consumer, shows its
// held sessions and never the broker's refusal of a plain receiver.
func TestServeSessionQueue(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	h.Hold(t, "s-1", "", "a-1", "a-2")
	addrs := make(chan string, 1)
	errOut := &syncbuf.Buffer{}
	a := &app{stdin: strings.NewReader(""), stdout: io.Discard, stderr: errOut, getenv: func(string) string { return "" }, now: time.Now,
		hooks: hooks{serving: func(addr string) { addrs <- addr }}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- a.run(ctx, []string{"--connection-string", h.Em.ConnectionString(), "--queue", sessionQueue, "serve", "--listen", "127.0.0.1:0"})
	}()
	var addr string
	select {
	case addr = <-addrs:
	case code := <-done:
		t.Fatalf("serve exited %d: %s", code, errOut.String())
	case <-time.After(sbtest.Timeout):
		t.Fatal("serve did not listen")
	}
	client := &http.Client{Timeout: sbtest.Timeout}
	for path, want := range map[string]string{"/": "session entity: see its held sessions", "/sessions?e=" + sessionQueue: `data-session="s-1" data-status="held"`} {
		resp, err := client.Get("http://" + addr + path)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, resp.StatusCode, path)
		assert.Contains(t, string(body), want, path)
		assert.NotContains(t, string(body), "amqp:", path)
	}
	cancel()
	select {
	case code := <-done:
		assert.Equal(t, exitOK, code, errOut.String())
	case <-time.After(sbtest.Timeout):
		t.Fatal("serve did not stop")
	}
}

// TestServeSearchesTheIndex: serve --index answers the console's search from the index file, with
// the attempt of --max-attempts; without --index it reads the broker; a missing index file and a
// negative --max-attempts are usage errors.
func TestServeSearchesTheIndex(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	path := filepath.Join(t.TempDir(), "index.db")
	store, err := retryindex.OpenSQLite(path, nil)
	require.NoError(t, err)
	at := time.Now().UTC().Truncate(time.Second)
	env := envelope.Envelope{Source: sbtest.Queue, FirstSequenceNumber: 7, OriginalMessageID: "order-42"}
	require.NoError(t, store.Apply(context.Background(), []retryindex.Record{{
		Chain: env.ChainID(), OriginalID: "order-42", Key: "order-42", CorrelationID: "checkout-9", Source: sbtest.Queue,
		Kind: retryindex.KindScheduled, Attempt: 1, NextAttempt: 2, At: at, NextDue: at.Add(time.Hour), Error: "ledger unavailable",
		Entity: sbtest.Queue, SequenceNumber: 12, Process: "billing-1", Feed: retryindex.FeedConsumer,
	}}))
	require.NoError(t, store.Close())

	search := func(t *testing.T, extra ...string) (string, string) {
		addrs := make(chan string, 1)
		var out bytes.Buffer
		errOut := &syncbuf.Buffer{}
		a := &app{stdin: strings.NewReader(""), stdout: &out, stderr: errOut, getenv: func(string) string { return "" }, now: time.Now,
			hooks: hooks{serving: func(addr string) { addrs <- addr }}}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan int, 1)
		go func() {
			done <- a.run(ctx, append([]string{"--connection-string", h.Em.ConnectionString(), "--queue", sbtest.Queue, "serve",
				"--listen", "127.0.0.1:0"}, extra...))
		}()
		var addr string
		select {
		case addr = <-addrs:
		case code := <-done:
			t.Fatalf("serve exited %d: %s", code, errOut.String())
		case <-time.After(sbtest.Timeout):
			t.Fatal("serve did not listen")
		}
		client := &http.Client{Timeout: sbtest.Timeout}
		resp, err := client.Get("http://" + addr + "/search?q=checkout-9")
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		cancel()
		select {
		case code := <-done:
			assert.Equal(t, exitOK, code, errOut.String())
		case <-time.After(sbtest.Timeout):
			t.Fatal("serve did not stop")
		}
		return string(body), errOut.String()
	}

	body, errOut := search(t, "--index", path, "--max-attempts", "5")
	assert.Contains(t, body, `data-from="index"`)
	assert.Contains(t, body, "Will be retried at "+at.Add(time.Hour).Format("2006-01-02 15:04:05Z")+", attempt 2 of 5")
	assert.Contains(t, body, "ledger unavailable")
	assert.Contains(t, errOut, "the console's search answers from index "+path)

	body, errOut = search(t)
	assert.Contains(t, body, `data-from="broker"`)
	assert.Contains(t, body, "No trace.")
	assert.Contains(t, errOut, "the console's search reads each entity up to --max-peek 10000 messages")

	code, _, stderr := cliNoEntity(t, "", "--connection-string", h.Em.ConnectionString(), "--queue", sbtest.Queue, "serve",
		"--index", filepath.Join(t.TempDir(), "missing.db"))
	assert.Equal(t, exitUsage, code, stderr)
	assert.Contains(t, stderr, "--index")
	code, _, stderr = cliNoEntity(t, "", "--connection-string", h.Em.ConnectionString(), "--queue", sbtest.Queue, "serve",
		"--max-attempts", "-1")
	assert.Equal(t, exitUsage, code, stderr)
	assert.Contains(t, stderr, "--max-attempts -1 is negative")
}
