package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestVerdict(t *testing.T) {
	tests := []struct {
		name, out      string
		status, reason string
	}{
		{name: "pass", out: "=== RUN   TestX\n--- PASS: TestX (0.10s)\nPASS\n", status: "PASS"},
		{
			name:   "testify failure with continuation",
			out:    "=== RUN   TestX\n    x_test.go:12: \n        \tError Trace:\t/a/x_test.go:12\n        \tError:      \tReceived unexpected error:\n        \t            \t(amqp:not-found) gone\n        \tTest:       \tTestX\n--- FAIL: TestX (0.20s)\n",
			status: "FAIL", reason: "Received unexpected error: (amqp:not-found) gone",
		},
		{
			name:   "skip",
			out:    "=== RUN   TestX\n    x_test.go:9: needs sessions\n--- SKIP: TestX (0.00s)\n",
			status: "SKIP", reason: "needs sessions",
		},
		{
			name:   "timeout",
			out:    "=== RUN   TestX\npanic: test timed out after 1m30s\n\trunning tests:\n",
			status: "FAIL", reason: "test timed out after 1m30s",
		},
		{name: "no output", out: "", status: "FAIL"},
		{name: "subtest pass is not the test's", out: "    --- PASS: TestX/sub (0.00s)\n--- FAIL: TestX (0.1s)\n", status: "FAIL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, reason := verdict("TestX", tt.out)
			assert.Equal(t, tt.status, status)
			assert.Equal(t, tt.reason, reason)
		})
	}
}

func TestClipKeepsOneShortLine(t *testing.T) {
	long := ""
	for range 300 {
		long += "é"
	}
	got := clip("a\nb  " + long)
	assert.LessOrEqual(t, len(got), maxReason+len("…"))
	assert.NotContains(t, got, "\n")
	assert.Equal(t, "a b ", got[:4])
}

// TestFrontDoorRoutesAMQPAndHTTPS: on the door's one TLS port, a connection
// that starts with the AMQP header reaches the AMQP address byte for byte,
// and an HTTPS request reaches the admin server with the Host it was sent to.
func TestFrontDoorRoutesAMQPAndHTTPS(t *testing.T) {
	amqpLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	echoed := make(chan struct{})
	go func() {
		defer close(echoed)
		c, err := amqpLn.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()
	hosts := make(chan string, 1)
	admin := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hosts <- r.Host
		_, _ = io.WriteString(w, "admin")
	}))
	defer admin.Close()

	door, caPEM, err := newFrontDoor(amqpLn.Addr().String(), admin.URL+"/", admin.Client().Transport)
	require.NoError(t, err)
	defer door.Close()
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	// go-amqp's server name: the address with its port.
	cfg := &tls.Config{RootCAs: pool, ServerName: door.Addr()}

	c, err := tls.Dial("tcp", door.Addr(), cfg)
	require.NoError(t, err)
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = c.Write([]byte("AMQP\x00\x01\x00\x00"))
	require.NoError(t, err)
	got := make([]byte, 8)
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	assert.Equal(t, "AMQP\x00\x01\x00\x00", string(got))
	require.NoError(t, c.Close())
	<-echoed
	require.NoError(t, amqpLn.Close())

	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("https://" + door.Addr() + "/$namespaceinfo")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, "admin", string(body))
	assert.Equal(t, door.Addr(), <-hosts, "the admin API sees the namespace the client asked for")
}

// TestRunAllReportsInOrder: with tests finishing out of order, results are
// reported in the order of the tests, each once.
func TestRunAllReportsInOrder(t *testing.T) {
	tests := []testCase{{name: "A"}, {name: "B"}, {name: "C"}, {name: "D"}}
	release := map[string]chan struct{}{}
	for _, tc := range tests {
		release[tc.name] = make(chan struct{})
	}
	run := func(_ context.Context, tc testCase) (result, error) {
		<-release[tc.name]
		return result{tc: tc, status: "PASS"}, nil
	}
	// D and B finish first; A's result unblocks the report of A and B.
	go func() {
		close(release["D"])
		close(release["B"])
		close(release["A"])
		close(release["C"])
	}()
	var reported []string
	results, err := runAll(context.Background(), tests, 4, run, func(r result) { reported = append(reported, r.tc.name) })
	require.NoError(t, err)
	assert.Equal(t, []string{"A", "B", "C", "D"}, reported)
	require.Len(t, results, 4)
	assert.Equal(t, "C", results[2].tc.name)
}

// TestRunAllStopsAtARunnerError: an error of the runner itself ends the run
// and is returned; tests not yet started do not start.
func TestRunAllStopsAtARunnerError(t *testing.T) {
	tests := []testCase{{name: "A"}, {name: "B"}, {name: "C"}}
	var started []string
	run := func(_ context.Context, tc testCase) (result, error) {
		started = append(started, tc.name)
		if tc.name == "A" {
			return result{}, errors.New("no emulator")
		}
		return result{tc: tc, status: "PASS"}, nil
	}
	_, err := runAll(context.Background(), tests, 1, run, func(result) {})
	require.EqualError(t, err, "no emulator")
	assert.LessOrEqual(t, len(started), 2, "at most the test already handed to the worker runs after the error")
}

func TestSummarizeHTTPError(t *testing.T) {
	in := "Received unexpected error: PUT https://127.0.0.1:1/queue-1 -------------------------------------------------------------------------------- RESPONSE 400: 400 Bad Request ERROR CODE: 400 -------------------------------------------------------------------------------- <Error><Code>400</Code><Detail>sbemu: rule &#34;$Default&#34;: no</Detail></Error> ---"
	assert.Equal(t, `Received unexpected error: 400 /queue-1: sbemu: rule "$Default": no`, summarizeHTTPError(in))
	assert.Equal(t, "plain", summarizeHTTPError("plain"))
}
