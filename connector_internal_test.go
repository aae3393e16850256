package retry

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A check that only timed out says why when the endpoint refuses connections.
func TestExplainTimeoutsAddsTheDialError(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens there now
	timedOut := func(context.Context) error { return context.DeadlineExceeded }
	err = explainTimeouts(timedOut, addr)(t.Context())
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, "connection refused")

	other := assert.AnError
	assert.Equal(t, other, explainTimeouts(func(context.Context) error { return other }, addr)(t.Context()), "other errors pass through")
}

func TestConnectionStringEndpoint(t *testing.T) {
	for name, tc := range map[string]struct{ in, host, addr, namespace string }{
		"namespace":         {"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=x", "ns.servicebus.windows.net", "ns.servicebus.windows.net:5671", "ns.servicebus.windows.net"},
		"emulator":          {"Endpoint=sb://localhost;SharedAccessKeyName=k;SharedAccessKey=x;UseDevelopmentEmulator=true", "localhost", "localhost:5672", "localhost"},
		"emulator and port": {"Endpoint=sb://127.0.0.1:4000;UseDevelopmentEmulator=true", "127.0.0.1", "127.0.0.1:4000", "127.0.0.1:4000"},
		"no endpoint":       {"SharedAccessKeyName=k", "", "", ""},
	} {
		t.Run(name, func(t *testing.T) {
			host, addr := connectionStringEndpoint(tc.in)
			assert.Equal(t, tc.host, host)
			assert.Equal(t, tc.addr, addr)
			assert.Equal(t, tc.namespace, connectionStringNamespace(tc.in), "the administration client's host")
		})
	}
}
