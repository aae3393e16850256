package retrytest_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/retrytest"
)

// completeCounter counts the completes that pass through it on their way to the broker.
type completeCounter struct {
	retry.Receiver
	completes *atomic.Int32
}

func (c *completeCounter) CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.CompleteMessageOptions) error {
	c.completes.Add(1)
	return c.Receiver.CompleteMessage(ctx, m, o)
}

// WrapReceiver wraps every receiver the broker hands out, the two sources of a Connector's connection
// included, and the calls still reach the broker through the wrapper.
func TestWrapReceiverWrapsEveryReceiver(t *testing.T) {
	mock := clock.NewMock()
	var wrapped, completes atomic.Int32
	b := newBillingLayout(t, mock, retrytest.BrokerOptions{WrapReceiver: func(r retry.Receiver) retry.Receiver {
		wrapped.Add(1)
		return &completeCounter{Receiver: r, completes: &completes}
	}})
	conn, err := b.Connector()(within(t))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, conn.Close(context.Background())) })
	require.Len(t, conn.Sources, 1)
	audit, err := b.SubscriptionReceiver("audit")
	require.NoError(t, err)
	retries, err := b.RetryQueueReceiver()
	require.NoError(t, err)
	for name, r := range map[string]retry.Receiver{
		"Receiver":                   b.Receiver(),
		"SubscriptionReceiver":       audit,
		"RetryQueueReceiver":         retries,
		"Connector":                  conn.Receiver,
		"Connector, the retry queue": conn.Sources[0].Receiver,
	} {
		assert.IsType(t, &completeCounter{}, r, name)
	}
	assert.Equal(t, int32(5), wrapped.Load(), "once per receiver handed out")

	// A failed attempt from the subscription and its retry from the retry queue: both completes pass
	// through the wrappers and reach the broker.
	p, err := retry.NewProcessor(conn.Sender, failFirstAttempts(1), &retry.Options{Clock: mock, EntityPath: billingPath, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	sendBodies(t, b, "order-1")
	msgs, err := conn.Receiver.ReceiveMessages(within(t), 1, nil)
	require.NoError(t, err)
	require.Equal(t, retry.OutcomeRetryScheduled, p.Process(within(t), conn.Receiver, msgs[0]).Outcome)
	_, ok := b.AdvanceToNextScheduled(mock)
	require.True(t, ok)
	msgs, err = conn.Sources[0].Receiver.ReceiveMessages(within(t), 1, nil)
	require.NoError(t, err)
	require.Equal(t, retry.OutcomeCompleted, p.Process(within(t), conn.Sources[0].Receiver, msgs[0]).Outcome)
	assert.Equal(t, int32(2), completes.Load())
	st := b.Stats()
	assert.Equal(t, 1, st.Retried)
	assert.Equal(t, 1, st.Succeeded)
}
