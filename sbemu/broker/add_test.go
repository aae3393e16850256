package broker

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAddEntitiesWhileRunning(t *testing.T) {
	b, _ := newTopicBroker(t, []QueueConfig{{Name: "existing"}})
	existing, _ := b.Queue("existing")
	// A receiver parked on an existing queue is not disturbed by additions.
	ch := receiveAsync(t, context.Background(), existing, ReceiveAndDelete)

	require.NoError(t, b.AddQueue(QueueConfig{Name: "later"}))
	require.NoError(t, b.AddTopic(TopicConfig{Name: "events", Subscriptions: []SubscriptionConfig{{Name: "to-later", ForwardTo: "later"}}}))
	assert.Equal(t, []string{"existing", "later"}, b.Queues())
	assert.Equal(t, []string{"events"}, b.Topics())

	events, ok := b.Queue("events")
	require.True(t, ok)
	mustSend(t, events, newMsg("1", "routed"))
	later, _ := b.Queue("later")
	assert.Equal(t, "routed", body(mustReceive(t, later, ReceiveAndDelete)))

	mustSend(t, existing, newMsg("2", "still served"))
	r := await(t, ch)
	require.NoError(t, r.err)
	assert.Equal(t, "still served", body(r.d))
}

func TestAddEntitiesValidatesAgainstWhatExists(t *testing.T) {
	b, _ := newTopicBroker(t, []QueueConfig{{Name: "a"}}, TopicConfig{Name: "t"})
	tests := []struct {
		name     string
		add      func() error
		wantText string
	}{
		{"duplicate queue", func() error { return b.AddQueue(QueueConfig{Name: "A"}) }, "duplicate entity name"},
		{"queue named like a topic", func() error { return b.AddQueue(QueueConfig{Name: "t"}) }, "duplicate entity name"},
		{"unknown forward target", func() error { return b.AddQueue(QueueConfig{Name: "b", ForwardTo: "nowhere"}) }, "no such queue or topic"},
		{"loop through existing entities", func() error {
			return b.AddTopic(TopicConfig{Name: "u", Subscriptions: []SubscriptionConfig{{Name: "s", ForwardTo: "u"}}})
		}, "auto-forwarding loop"},
		{"bad rule", func() error {
			return b.AddTopic(TopicConfig{Name: "v", Subscriptions: []SubscriptionConfig{{Name: "s", Rules: []RuleConfig{{SQLFilter: "x ="}}}}})
		}, "SQLFilter"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.add()
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), tc.wantText)
		})
	}
	assert.Equal(t, []string{"a"}, b.Queues(), "a failed addition changes nothing")
	assert.Equal(t, []string{"t"}, b.Topics())

	b.Close()
	assert.ErrorIs(t, b.AddQueue(QueueConfig{Name: "c"}), ErrClosed)
}
