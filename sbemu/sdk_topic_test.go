package sbemu

import (
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

func newSubscriptionReceiver(t testing.TB, client *azservicebus.Client, topic, sub string, opts *azservicebus.ReceiverOptions) *azservicebus.Receiver {
	t.Helper()
	r, err := client.NewReceiverForSubscription(topic, sub, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close(ctxT(t)) })
	return r
}

// TestSDKTopicSubscriptions sends to a topic through the SDK and receives
// from its subscriptions, each selecting with its own rule, then reads a
// subscription's dead-letter queue.
func TestSDKTopicSubscriptions(t *testing.T) {
	em := startEmulator(t, Config{Topics: []broker.TopicConfig{{
		Name: "orders",
		Subscriptions: []broker.SubscriptionConfig{
			{Name: "all"},
			{Name: "eu", Rules: []broker.RuleConfig{{Name: "eu", SQLFilter: "region = 'eu' AND sys.Label LIKE 'order%'"}}},
			{Name: "big", Rules: []broker.RuleConfig{{Name: "big", CorrelationFilter: &broker.CorrelationFilter{Properties: map[string]any{"size": "big"}}}}},
		},
	}}})
	client := newClient(t, em)
	sender := newSender(t, client, "orders")
	require.NoError(t, sender.SendMessage(ctxT(t), &azservicebus.Message{
		Body: []byte("eu-small"), Subject: to.Ptr("order.created"),
		ApplicationProperties: map[string]any{"region": "eu", "size": "small"},
	}, nil))
	require.NoError(t, sender.SendMessage(ctxT(t), &azservicebus.Message{
		Body: []byte("us-big"), Subject: to.Ptr("order.created"),
		ApplicationProperties: map[string]any{"region": "us", "size": "big"},
	}, nil))

	receiveBodies := func(sub string, n int) []string {
		r := newSubscriptionReceiver(t, client, "orders", sub, nil)
		var out []string
		for len(out) < n {
			msgs, err := r.ReceiveMessages(ctxT(t), n-len(out), nil)
			require.NoError(t, err)
			for _, m := range msgs {
				out = append(out, string(m.Body))
				require.NoError(t, r.CompleteMessage(ctxT(t), m, nil))
			}
		}
		return out
	}
	assert.ElementsMatch(t, []string{"eu-small", "us-big"}, receiveBodies("all", 2))
	assert.Equal(t, []string{"eu-small"}, receiveBodies("eu", 1))
	assert.Equal(t, []string{"us-big"}, receiveBodies("big", 1))
	for _, sub := range []string{"all", "eu", "big"} {
		q, ok := em.Broker().Subscription("orders", sub)
		require.True(t, ok)
		assert.Equal(t, broker.Stats{}, q.Stats(), sub)
	}

	// Dead-lettering from a subscription, read back from its DLQ.
	require.NoError(t, sender.SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("poison")}, nil))
	r := newSubscriptionReceiver(t, client, "orders", "all", nil)
	msg := receiveOne(t, r)
	require.NoError(t, r.DeadLetterMessage(ctxT(t), msg, &azservicebus.DeadLetterOptions{Reason: to.Ptr("Bad")}))
	dlq := newSubscriptionReceiver(t, client, "orders", "all", &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	dead := receiveOne(t, dlq)
	assert.Equal(t, "poison", string(dead.Body))
	require.NotNil(t, dead.DeadLetterReason)
	assert.Equal(t, "Bad", *dead.DeadLetterReason)
	require.NotNil(t, dead.DeadLetterSource)
	assert.Equal(t, "orders/Subscriptions/all", *dead.DeadLetterSource)
}

// TestSDKTopicScheduleAndCancel schedules two messages on a topic, cancels
// one, and sees the other reach the subscription only when the fake clock
// reaches its time.
func TestSDKTopicScheduleAndCancel(t *testing.T) {
	start := time.Now().Truncate(time.Millisecond)
	fake := newFakeClock(start)
	em := startEmulator(t, Config{Clock: fake, Topics: []broker.TopicConfig{{
		Name: "t", Subscriptions: []broker.SubscriptionConfig{{Name: "s", LockDuration: 30 * time.Second}},
	}}})
	client := newClient(t, em)
	sender := newSender(t, client, "t")
	at := start.Add(time.Hour)
	seqs, err := sender.ScheduleMessages(ctxT(t), []*azservicebus.Message{{Body: []byte("kept")}, {Body: []byte("cancelled")}}, at, nil)
	require.NoError(t, err)
	require.Len(t, seqs, 2)
	require.NoError(t, sender.CancelScheduledMessages(ctxT(t), seqs[1:], nil))

	topic, _ := em.Broker().Queue("t")
	sub, _ := em.Broker().Subscription("t", "s")
	assert.Equal(t, broker.Stats{Scheduled: 1}, topic.Stats(), "held in the topic")
	assert.Equal(t, broker.Stats{}, sub.Stats())

	r := newSubscriptionReceiver(t, client, "t", "s", nil)
	fake.Advance(time.Hour)
	msg := receiveOne(t, r)
	assert.Equal(t, "kept", string(msg.Body))
	require.NotNil(t, msg.ScheduledEnqueueTime)
	assert.True(t, msg.ScheduledEnqueueTime.Equal(at))
	require.NotNil(t, msg.LockedUntil)
	assert.True(t, msg.LockedUntil.Equal(at.Add(30*time.Second)), "the subscription's own lock duration")

	// Renewing and peeking go through the subscription's management node.
	require.NoError(t, r.RenewMessageLock(ctxT(t), msg, nil))
	peeked, err := r.PeekMessages(ctxT(t), 10, nil)
	require.NoError(t, err)
	require.Len(t, peeked, 1)
	require.NoError(t, r.CompleteMessage(ctxT(t), msg, nil))
	assert.Equal(t, broker.Stats{}, topic.Stats())
}

// TestSDKTopicWrongDirection checks that receiving from a topic and sending
// to a subscription are refused with an error, as on Service Bus.
func TestSDKTopicWrongDirection(t *testing.T) {
	em := startEmulator(t, Config{Topics: []broker.TopicConfig{{Name: "t", Subscriptions: []broker.SubscriptionConfig{{Name: "s"}}}}})
	client := newClient(t, em)
	r := newReceiver(t, client, "t", nil)
	_, err := r.ReceiveMessages(ctxT(t), 1, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is a topic")

	s := newSender(t, client, "t/Subscriptions/s")
	err = s.SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("x")}, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is a subscription")
}

// TestSDKAutoForwarding routes a topic subscription into a queue and the
// queue's dead letters into a parking queue, all through the SDK.
func TestSDKAutoForwarding(t *testing.T) {
	em := startEmulator(t, Config{
		Queues: []broker.QueueConfig{
			{Name: "work", ForwardDeadLetteredMessagesTo: "parking"},
			{Name: "parking"},
		},
		Topics: []broker.TopicConfig{{Name: "events", Subscriptions: []broker.SubscriptionConfig{{Name: "to-work", ForwardTo: "work"}}}},
	})
	client := newClient(t, em)
	require.NoError(t, newSender(t, client, "events").SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("event")}, nil))

	work := newReceiver(t, client, "work", nil)
	msg := receiveOne(t, work)
	assert.Equal(t, "event", string(msg.Body))
	require.NoError(t, work.DeadLetterMessage(ctxT(t), msg, &azservicebus.DeadLetterOptions{Reason: to.Ptr("NoHandler")}))

	parked := receiveOne(t, newReceiver(t, client, "parking", nil))
	assert.Equal(t, "event", string(parked.Body))
	require.NotNil(t, parked.DeadLetterReason)
	assert.Equal(t, "NoHandler", *parked.DeadLetterReason)
}

// TestSDKCreateEntitiesWhileRunning adds a queue and a topic to a running
// emulator and uses them through the SDK at once.
func TestSDKCreateEntitiesWhileRunning(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	require.NoError(t, em.CreateQueue(broker.QueueConfig{Name: "late-queue"}))
	require.NoError(t, em.CreateTopic(broker.TopicConfig{Name: "late-topic", Subscriptions: []broker.SubscriptionConfig{{Name: "s", ForwardTo: "late-queue"}}}))
	require.Error(t, em.CreateQueue(broker.QueueConfig{Name: "queue"}), "names stay unique")

	require.NoError(t, newSender(t, client, "late-topic").SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("new")}, nil))
	msg := receiveOne(t, newReceiver(t, client, "late-queue", nil))
	assert.Equal(t, "new", string(msg.Body))
}
