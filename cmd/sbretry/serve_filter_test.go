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
			addrs := make(chan string, 1)
			var errOut bytes.Buffer
			a := &app{stdin: strings.NewReader(""), stdout: io.Discard, stderr: &errOut, getenv: func(string) string { return "" }, now: time.Now,
				hooks: hooks{serving: func(addr string) { addrs <- addr }}}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan int, 1)
			go func() {
				done <- a.run(ctx, append([]string{"--connection-string", h.Em.ConnectionString(), "--queue", sbtest.Queue, "serve", "--listen", "127.0.0.1:0"}, tc.args...))
			}()
			defer func() {
				cancel()
				select {
				case <-done:
				case <-time.After(sbtest.Timeout):
					t.Error("serve did not stop")
				}
			}()
			var addr string
			select {
			case addr = <-addrs:
			case code := <-done:
				t.Fatalf("serve exited %d: %s", code, errOut.String())
			case <-time.After(sbtest.Timeout):
				t.Fatal("serve did not listen")
			}
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
