package retry

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
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
	for name, tc := range map[string]struct {
		in, host, addr, namespace string
		emulator                  bool
	}{
		"namespace":         {"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=x", "ns.servicebus.windows.net", "ns.servicebus.windows.net:5671", "ns.servicebus.windows.net", false},
		"emulator":          {"Endpoint=sb://localhost;SharedAccessKeyName=k;SharedAccessKey=x;UseDevelopmentEmulator=true", "localhost", "localhost:5672", "localhost", true},
		"emulator and port": {"Endpoint=sb://127.0.0.1:4000;UseDevelopmentEmulator=true", "127.0.0.1", "127.0.0.1:4000", "127.0.0.1:4000", true},
		"no endpoint":       {"SharedAccessKeyName=k", "", "", "", false},
	} {
		t.Run(name, func(t *testing.T) {
			host, addr, emulator := connectionStringEndpoint(tc.in)
			assert.Equal(t, tc.host, host)
			assert.Equal(t, tc.addr, addr)
			assert.Equal(t, tc.emulator, emulator)
			assert.Equal(t, tc.namespace, connectionStringNamespace(tc.in), "the administration client's host")
		})
	}
}

// A refused endpoint is reported by the dial before the SDK's, at once and with its cause, not after
// the SDK's retries as a deadline.
func TestReachEndpointRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, reachEndpoint(t.Context(), addr, nil), "a listening endpoint passes")
	require.NoError(t, l.Close())
	err = reachEndpoint(t.Context(), addr, nil)
	require.Error(t, err)
	assert.NotErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, "the endpoint "+addr+" does not accept connections")
	assert.ErrorContains(t, err, "connection refused")
	assert.NoError(t, reachEndpoint(t.Context(), "", nil), "no address, no dial")
	// The SDK connects to a custom endpoint or through a custom dialer instead: addr is not dialled.
	assert.NoError(t, reachEndpoint(t.Context(), addr, &azservicebus.ClientOptions{CustomEndpoint: "gateway.internal:5671"}))
	assert.NoError(t, reachEndpoint(t.Context(), addr, &azservicebus.ClientOptions{
		NewWebSocketConn: func(context.Context, azservicebus.NewWebSocketConnArgs) (net.Conn, error) {
			return nil, errors.New("unused")
		},
	}))
}

// CheckSettings with a development emulator's connection string and no ConnectOptions.Admin fails at
// once, saying how to point it at the administration API, instead of asking the AMQP port over HTTPS.
func TestSettingsCheckEmulatorWithoutAdmin(t *testing.T) {
	called := false
	newAdmin := func(*admin.ClientOptions) (*admin.Client, error) {
		called = true
		return nil, errors.New("not reached")
	}
	check := settingsCheck(&ConnectOptions{CheckSettings: true}, "orders", "", "https://127.0.0.1:5672/", true, newAdmin)
	_, err := check(t.Context(), time.Second)
	require.ErrorIs(t, err, errEmulatorAdmin)
	assert.ErrorContains(t, err, "AdminClientOptions")
	assert.False(t, called, "no request to the AMQP port")
	// Not an emulator: the administration client is asked.
	check = settingsCheck(&ConnectOptions{CheckSettings: true}, "orders", "", "https://ns/", false, newAdmin)
	_, err = check(t.Context(), time.Second)
	require.Error(t, err)
	assert.True(t, called)
}

// The default reconnect delays are a fresh slice per call: a config that changes its own cannot change
// another consumer's.
func TestDefaultReconnectDelaysAreNotShared(t *testing.T) {
	d := defaultReconnectDelays()
	d[0] = time.Hour
	assert.Equal(t, 5*time.Second, defaultReconnectDelays()[0])
}
