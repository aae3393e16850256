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
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// TestServeFilterBodies: the console's filter by body text is off unless serve is given
// --filter-bodies (bodies hold customer data).
func TestServeFilterBodies(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.seed(t, "perm-1")
	for _, tc := range []struct {
		name string
		args []string
		want int
		text string
	}{
		{"off by default", nil, http.StatusBadRequest, "filtering by body text is off"},
		{"--filter-bodies", []string{"--filter-bodies"}, http.StatusOK, "1 dead letter match"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := startServe(t, append([]string{"--connection-string", h.Em.ConnectionString(), "--queue", sbtest.Queue}, tc.args...)...)
			resp, err := (&http.Client{Timeout: sbtest.Timeout}).Get("http://" + addr + "/deadletters?e=orders&body=perm-1")
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			require.NoError(t, err)
			assert.Equal(t, tc.want, resp.StatusCode)
			assert.Contains(t, string(body), tc.text)
		})
	}
}

// startServe runs sbretry with args followed by serve on a free loopback port until the test ends, and
// returns the address it listens on.
func startServe(t *testing.T, args ...string) string {
	t.Helper()
	addrs := make(chan string, 1)
	var errOut bytes.Buffer
	a := &app{stdin: strings.NewReader(""), stdout: io.Discard, stderr: &errOut, getenv: func(string) string { return "" }, now: time.Now,
		hooks: hooks{serving: func(addr string) { addrs <- addr }}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	// serve's own flags follow it; the rest are the entity flags, which may come first.
	var entityFlags, serveFlags []string
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "--filter-bodies":
			serveFlags = append(serveFlags, args[i])
		case "--wake-to":
			serveFlags = append(serveFlags, args[i], args[i+1])
			i++
		default:
			entityFlags = append(entityFlags, args[i])
		}
	}
	go func() {
		done <- a.run(ctx, append(append(entityFlags, "serve", "--listen", "127.0.0.1:0"), serveFlags...))
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(sbtest.Timeout):
			t.Error("serve did not stop")
		}
	})
	select {
	case addr := <-addrs:
		return addr
	case code := <-done:
		t.Fatalf("serve exited %d: %s", code, errOut.String())
	case <-time.After(sbtest.Timeout):
		t.Fatal("serve did not listen")
	}
	return ""
}

// TestServeSessionSubscription: serve shows a session subscription given as --topic and
// --subscription without a retry queue, and with --wake-to offers the release of its held sessions.
func TestServeSessionSubscription(t *testing.T) {
	t.Parallel()
	em := sbemu.StartT(t, sbemu.Config{Topics: []broker.TopicConfig{{Name: "events", Subscriptions: []broker.SubscriptionConfig{{Name: "billing", RequiresSession: true}}}}})
	for _, tc := range []struct {
		name string
		wake []string
		want string
	}{
		{"listed", nil, "would reach every subscription"},
		{"--wake-to", []string{"--wake-to", "events"}, "A release sends its wake-up to events carrying sbretry-wake-to=events/Subscriptions/billing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := startServe(t, append([]string{"--connection-string", em.ConnectionString(), "--topic", "events", "--subscription", "billing"}, tc.wake...)...)
			resp, err := (&http.Client{Timeout: sbtest.Timeout}).Get("http://" + addr + "/sessions?e=events%2FSubscriptions%2Fbilling")
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, resp.StatusCode, string(body))
			assert.Contains(t, string(body), tc.want)
		})
	}
	var errOut bytes.Buffer
	a := &app{stdin: strings.NewReader(""), stdout: io.Discard, stderr: &errOut, getenv: func(string) string { return "" }, now: time.Now}
	code := a.run(context.Background(), []string{"--connection-string", em.ConnectionString(), "--queue", "orders", "serve", "--wake-to", "events"})
	assert.Equal(t, exitUsage, code, errOut.String())
}
