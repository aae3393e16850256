//go:build !live

package e2e

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// A connector with a custom dialer (here the emulator's in-memory door; in production a WebSocket
// proxy that resolves names itself) must not look the namespace up first: the name need not resolve.
func TestConnectorWithACustomDialer(t *testing.T) {
	parallel(t)
	em := sbemu.StartT(t, sbemu.Config{InMemory: true, Queues: []broker.QueueConfig{{Name: "q", DuplicateDetectionWindow: time.Minute}}})
	clientOpts := &azservicebus.ClientOptions{NewWebSocketConn: em.NewWebSocketConn, RetryOptions: fastRetries}
	connect, err := retry.NewNamespace(em.ConnectionString(), &retry.ConnectOptions{Client: clientOpts}).Queue("q")
	require.NoError(t, err)
	done := make(chan struct{})
	c, err := retry.NewConsumer(connect, func(context.Context, *azservicebus.ReceivedMessage) error {
		close(done)
		return nil
	}, &retry.Options{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	stopped := make(chan error, 1)
	go func() { stopped <- c.Run(ctx) }()

	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), clientOpts)
	require.NoError(t, err)
	defer client.Close(context.Background())
	s, err := client.NewSender("q", nil)
	require.NoError(t, err)
	require.NoError(t, s.SendMessage(t.Context(), sbtest.Message("in-memory-1"), nil))
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatalf("not handled; health %+v", c.Health())
	}
	cancel()
	assert.NoError(t, <-stopped)
}
