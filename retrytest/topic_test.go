package retrytest_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/retrytest"
	"github.com/sbretry/retry/sbemu/broker"
)

// newTopicBroker is a topic "orders" with subscriptions "all" and "eu", on clk (nil: the real one).
func newTopicBroker(t *testing.T, clk retry.Clock) *retrytest.Broker {
	t.Helper()
	b, err := retrytest.New(clk, &retrytest.BrokerOptions{
		EntityPath:       "orders",
		MaxDeliveryCount: 1,
		Subscriptions: []broker.SubscriptionConfig{
			{Name: "all"},
			{Name: "eu", Rules: []broker.RuleConfig{{Name: "eu", SQLFilter: "region = 'eu'"}}, LockDuration: 10 * time.Second},
		},
	})
	require.NoError(t, err)
	return b
}

func TestTopicSubscriptionsAndInspection(t *testing.T) {
	mock := clock.NewMock()
	b := newTopicBroker(t, mock)
	ctx := t.Context()
	_, err := b.Send(&azservicebus.Message{Body: []byte("eu"), ApplicationProperties: map[string]any{"region": "eu"}})
	require.NoError(t, err)
	_, err = b.Send(&azservicebus.Message{Body: []byte("us"), ApplicationProperties: map[string]any{"region": "us"}})
	require.NoError(t, err)
	assert.Equal(t, 3, b.Stats().Active, "two copies in all, one in eu")

	all := b.Receiver() // the first subscription
	msgs, err := all.ReceiveMessages(ctx, 5, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 2)
	for _, m := range msgs {
		require.NoError(t, all.CompleteMessage(ctx, m, nil))
	}
	eu, err := b.SubscriptionReceiver("EU")
	require.NoError(t, err)
	msgs, err = eu.ReceiveMessages(ctx, 5, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	assert.Equal(t, "eu", string(msgs[0].Body))
	assert.Equal(t, mock.Now().Add(10*time.Second), *msgs[0].LockedUntil, "the subscription's own lock")
	assert.Error(t, all.CompleteMessage(ctx, msgs[0], nil), "another subscription's lock")

	// The lock expires on the last allowed delivery: the subscription's dead-letter queue gets it.
	mock.Add(10 * time.Second)
	dl := b.DeadLettered()
	require.Len(t, dl, 1)
	assert.Equal(t, broker.ReasonMaxDeliveryCountExceeded, dl[0].Reason)
	assert.Equal(t, "orders/Subscriptions/eu", *dl[0].Message.DeadLetterSource)
	assert.Len(t, b.Completed(), 2)
	st := b.Stats()
	assert.Equal(t, 2, st.Succeeded)
	assert.Equal(t, 1, st.DeadLettered)

	_, err = b.SubscriptionReceiver("missing")
	assert.Error(t, err)
	_, err = newBroker(t, mock, nil).SubscriptionReceiver("all")
	assert.Error(t, err, "a queue has no subscriptions")
}

// A receiver of a subscription blocked on an empty topic wakes when a message scheduled on the topic
// falls due, inside a synctest bubble on the real clock; the broker leaves no goroutine behind.
func TestTopicScheduledReachesSubscriptionInSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newTopicBroker(t, nil)
		start := time.Now()
		seqs, err := b.Sender().ScheduleMessages(t.Context(), []*azservicebus.Message{{Body: []byte("later"), ApplicationProperties: map[string]any{"region": "eu"}}}, start.Add(time.Hour), nil)
		require.NoError(t, err)
		assert.Equal(t, 1, b.Stats().Pending)

		eu, err := b.SubscriptionReceiver("eu")
		require.NoError(t, err)
		msgs, err := eu.ReceiveMessages(t.Context(), 1, nil)
		require.NoError(t, err)
		assert.Equal(t, time.Hour, time.Since(start))
		assert.Equal(t, "later", string(msgs[0].Body))
		assert.EqualValues(t, 1, seqs[0])
		assert.Equal(t, start.Add(time.Hour), *msgs[0].EnqueuedTime, "enqueued when it fell due")
		assert.Equal(t, 1, b.Stats().Active, "the copy for all waits too")
	})
}
