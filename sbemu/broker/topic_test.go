package broker

import (
	"context"
	"testing"
	"time"

	"github.com/Azure/go-amqp"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newTopicBroker returns a broker on a mock clock with the given queues and
// topics, closed at test end.
func newTopicBroker(t testing.TB, queues []QueueConfig, topics ...TopicConfig) (*Broker, *clock.Mock) {
	t.Helper()
	mock := clock.NewMock()
	b, err := New(Options{Clock: mock, Topics: topics}, queues...)
	require.NoError(t, err)
	t.Cleanup(b.Close)
	return b, mock
}

func mustSubscription(t testing.TB, b *Broker, topic, sub string) *Queue {
	t.Helper()
	q, ok := b.Subscription(topic, sub)
	require.True(t, ok, "subscription %s/%s", topic, sub)
	return q
}

func withProps(m *amqp.Message, props map[string]any) *amqp.Message {
	m.ApplicationProperties = props
	return m
}

func TestTopicFansOutToEverySubscription(t *testing.T) {
	b, _ := newTopicBroker(t, nil, TopicConfig{Name: "orders", Subscriptions: []SubscriptionConfig{{Name: "billing"}, {Name: "shipping"}}})
	topic, ok := b.Queue("orders")
	require.True(t, ok)
	assert.True(t, topic.IsTopic())
	assert.Equal(t, []string{"orders/Subscriptions/billing", "orders/Subscriptions/shipping"}, topic.Subscriptions())
	assert.Equal(t, []string{"orders"}, b.Topics())
	assert.Empty(t, b.Queues())

	mustSend(t, topic, newMsg("1", "hello"))
	assert.Equal(t, Stats{}, topic.Stats(), "nothing stays in the topic")
	for _, name := range []string{"billing", "shipping"} {
		sub := mustSubscription(t, b, "orders", name)
		assert.True(t, sub.IsSubscription())
		d := mustReceive(t, sub, PeekLock)
		assert.Equal(t, "hello", body(d))
		require.NoError(t, sub.Complete(d.LockToken))
	}
	// Paths are case-insensitive, and subscriptions cannot be sent to.
	sub, ok := b.Queue("ORDERS/subscriptions/BILLING")
	require.True(t, ok)
	_, _, err := sub.Send(newMsg("2", "x"), 10)
	assert.ErrorIs(t, err, ErrNotSupported)
	_, ok = b.Queue("orders/$DeadLetterQueue")
	assert.False(t, ok, "a topic has no reachable dead-letter queue")
}

func TestSubscriptionsKeepTheirOwnSettings(t *testing.T) {
	b, mock := newTopicBroker(t, nil, TopicConfig{Name: "t", Subscriptions: []SubscriptionConfig{
		{Name: "short", LockDuration: 10 * time.Second, MaxDeliveryCount: 1},
		{Name: "ttl", DefaultTTL: time.Minute, DeadLetterOnExpiration: true},
	}})
	topic, _ := b.Queue("t")
	mustSend(t, topic, newMsg("1", "x"))
	short, ttl := mustSubscription(t, b, "t", "short"), mustSubscription(t, b, "t", "ttl")

	d := mustReceive(t, short, PeekLock)
	assert.Equal(t, mock.Now().Add(10*time.Second), d.LockedUntil)
	require.NoError(t, short.Abandon(d.LockToken, nil))
	assert.Equal(t, Stats{DeadLettered: 1}, short.Stats(), "MaxDeliveryCount 1: the first abandon dead-letters")
	dlq, ok := b.Queue("t/Subscriptions/short/$DeadLetterQueue")
	require.True(t, ok)
	dead := mustReceive(t, dlq, ReceiveAndDelete)
	assert.Equal(t, ReasonMaxDeliveryCountExceeded, dead.Message.ApplicationProperties[PropertyDeadLetterReason])
	assert.Equal(t, "t/Subscriptions/short", dead.Message.Annotations[AnnotationDeadLetterSource])

	mock.Add(time.Minute)
	assert.Equal(t, Stats{DeadLettered: 1}, ttl.Stats(), "the TTL subscription dead-letters on expiry")
}

func TestTopicDuplicateDetection(t *testing.T) {
	b, _ := newTopicBroker(t, nil, TopicConfig{Name: "t", DuplicateDetectionWindow: time.Minute, Subscriptions: []SubscriptionConfig{{Name: "s"}}})
	topic, _ := b.Queue("t")
	mustSend(t, topic, newMsg("same", "first"))
	_, dup, err := topic.Send(newMsg("same", "second"), 10)
	require.NoError(t, err)
	assert.True(t, dup)
	assert.Equal(t, Stats{Active: 1}, mustSubscription(t, b, "t", "s").Stats())
}

func TestTopicScheduledMessagesStayInTheTopic(t *testing.T) {
	b, mock := newTopicBroker(t, nil, TopicConfig{Name: "t", Subscriptions: []SubscriptionConfig{{Name: "a"}, {Name: "b"}}})
	topic, _ := b.Queue("t")
	a, bsub := mustSubscription(t, b, "t", "a"), mustSubscription(t, b, "t", "b")
	at := mock.Now().Add(time.Hour)
	keep, err := topic.Schedule(newMsg("1", "kept"), 10, at)
	require.NoError(t, err)
	cancelled, err := topic.Schedule(newMsg("2", "cancelled"), 10, at)
	require.NoError(t, err)
	assert.Equal(t, Stats{Scheduled: 2}, topic.Stats())
	assert.Equal(t, Stats{}, a.Stats(), "nothing reaches a subscription before it is due")
	require.Len(t, topic.ScheduledMessages(), 2)
	require.NoError(t, topic.CancelScheduled(cancelled))

	// A receiver already parked on a subscription wakes when the topic's
	// message falls due.
	ch := receiveAsync(t, context.Background(), a, PeekLock)
	mock.Add(time.Hour)
	r := await(t, ch)
	require.NoError(t, r.err)
	assert.Equal(t, "kept", body(r.d))
	assert.Equal(t, at, r.d.Message.Annotations[AnnotationEnqueuedTime])
	assert.Equal(t, Stats{Active: 1}, bsub.Stats())
	assert.Equal(t, Stats{}, topic.Stats())
	assert.ErrorIs(t, topic.CancelScheduled(keep), ErrNotFound, "activated: no longer cancellable")
}

func TestTopicTTLCapsSubscriptionCopies(t *testing.T) {
	b, mock := newTopicBroker(t, nil, TopicConfig{Name: "t", DefaultTTL: time.Minute, Subscriptions: []SubscriptionConfig{
		{Name: "s", DefaultTTL: time.Hour, DeadLetterOnExpiration: true},
	}})
	topic, _ := b.Queue("t")
	mustSend(t, topic, newMsg("1", "x"))
	mock.Add(time.Minute)
	assert.Equal(t, Stats{DeadLettered: 1}, mustSubscription(t, b, "t", "s").Stats())
}

func TestTopicConfigErrors(t *testing.T) {
	tests := []struct {
		name     string
		queues   []QueueConfig
		topics   []TopicConfig
		wantText string
	}{
		{"topic name clashes with a queue", []QueueConfig{{Name: "x"}}, []TopicConfig{{Name: "X"}}, `duplicate entity name "X"`},
		{"empty topic name", nil, []TopicConfig{{Name: ""}}, "topic \"\": empty name"},
		{"subscription with slash", nil, []TopicConfig{{Name: "t", Subscriptions: []SubscriptionConfig{{Name: "a/b"}}}}, `subscription "a/b": name must not contain '/'`},
		{"duplicate subscription", nil, []TopicConfig{{Name: "t", Subscriptions: []SubscriptionConfig{{Name: "a"}, {Name: "A"}}}}, "duplicate entity name"},
		{"subscription lock too long", nil, []TopicConfig{{Name: "t", Subscriptions: []SubscriptionConfig{{Name: "a", LockDuration: time.Hour}}}}, `topic "t": broker: invalid configuration: subscription "a": LockDuration`},
		{"malformed SQL", nil, []TopicConfig{{Name: "t", Subscriptions: []SubscriptionConfig{{Name: "a", Rules: []RuleConfig{{Name: "r", SQLFilter: "color = "}}}}}}, `subscription "t/Subscriptions/a" rule "r": SQLFilter "color = "`},
		{"malformed action", nil, []TopicConfig{{Name: "t", Subscriptions: []SubscriptionConfig{{Name: "a", Rules: []RuleConfig{{Name: "r", SQLAction: "SET = 1"}}}}}}, `rule "r": SQLAction`},
		{"both filters", nil, []TopicConfig{{Name: "t", Subscriptions: []SubscriptionConfig{{Name: "a", Rules: []RuleConfig{{SQLFilter: "TRUE", CorrelationFilter: &CorrelationFilter{}}}}}}}, "not both"},
		{"duplicate rule", nil, []TopicConfig{{Name: "t", Subscriptions: []SubscriptionConfig{{Name: "a", Rules: []RuleConfig{{Name: "r"}, {Name: "R"}}}}}}, "duplicate rule name"},
		{"unknown forward target", []QueueConfig{{Name: "q", ForwardTo: "nowhere"}}, nil, `queue "q": ForwardTo "nowhere": no such queue or topic`},
		{"forward to itself", []QueueConfig{{Name: "q", ForwardTo: "Q"}}, nil, "cannot forward to itself"},
		{"forward to a subscription", []QueueConfig{{Name: "q", ForwardTo: "t/Subscriptions/a"}}, []TopicConfig{{Name: "t", Subscriptions: []SubscriptionConfig{{Name: "a"}}}}, "a subscription cannot be a forwarding target"},
		{"unknown dead-letter target", []QueueConfig{{Name: "q", ForwardDeadLetteredMessagesTo: "nowhere"}}, nil, "ForwardDeadLetteredMessagesTo \"nowhere\""},
		{"loop", []QueueConfig{{Name: "a", ForwardTo: "b"}, {Name: "b", ForwardTo: "a"}}, nil, "auto-forwarding loop: a -> b -> a"},
		{"loop through a topic", []QueueConfig{{Name: "q", ForwardTo: "t"}}, []TopicConfig{{Name: "t", Subscriptions: []SubscriptionConfig{{Name: "s", ForwardTo: "q"}}}}, "auto-forwarding loop: q -> t -> t/Subscriptions/s -> q"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(Options{Topics: tc.topics}, tc.queues...)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), tc.wantText)
		})
	}
}
