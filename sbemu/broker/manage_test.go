package broker

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRuntimeCounts(t *testing.T) {
	b, mock := newTopicBroker(t, []QueueConfig{{Name: "q"}})
	q, _ := b.Queue("q")
	mustSend(t, q, newMsg("1", "locked"))
	mustSend(t, q, newMsg("2", "dead"))
	mustSend(t, q, newMsg("3", "active"))
	_, err := q.Schedule(newMsg("4", "later"), 10, mock.Now().Add(time.Hour))
	require.NoError(t, err)
	d := mustReceive(t, q, PeekLock) // 1
	require.NoError(t, q.Abandon(d.LockToken, nil))
	mustReceive(t, q, PeekLock) // 1 again, now locked
	d2 := mustReceive(t, q, PeekLock)
	require.NoError(t, q.DeadLetter(d2.LockToken, "r", "d", nil))

	r := q.Runtime()
	assert.Equal(t, 2, r.Active, "available and locked both count as active")
	assert.Equal(t, 1, r.Scheduled)
	assert.Equal(t, 1, r.DeadLettered)
	assert.Equal(t, 4, r.Total())
	assert.Positive(t, r.SizeInBytes)
}

func TestRemoveQueue(t *testing.T) {
	b, _ := newTopicBroker(t, []QueueConfig{{Name: "target"}, {Name: "src", ForwardTo: "target"}, {Name: "busy"}, {Name: "idle"}})
	busy, _ := b.Queue("busy")
	mustSend(t, busy, newMsg("1", "x"))
	d := mustReceive(t, busy, PeekLock)

	err := b.RemoveQueue("target")
	require.ErrorIs(t, err, ErrInUse)
	assert.Contains(t, err.Error(), `"src" forwards to`)
	assert.ErrorIs(t, b.RemoveQueue("nope"), ErrUnknownQueue)

	idle, _ := b.Queue("idle")
	ch := receiveAsync(t, context.Background(), idle, PeekLock)
	require.NoError(t, b.RemoveQueue("IDLE"))
	r := await(t, ch)
	assert.ErrorIs(t, r.err, ErrUnknownQueue, "a blocked receiver learns the queue is gone")
	_, _, err = idle.Send(newMsg("2", "y"), 10)
	assert.ErrorIs(t, err, ErrUnknownQueue)
	_, ok := b.Queue("idle/$DeadLetterQueue")
	assert.False(t, ok)
	assert.Equal(t, []string{"target", "src", "busy"}, b.Queues())

	// A locked message does not hold its queue up, as on Service Bus; its
	// settlement and renewal then learn the queue is gone.
	require.NoError(t, b.RemoveQueue("busy"))
	assert.ErrorIs(t, busy.Complete(d.LockToken), ErrUnknownQueue)
	_, err = busy.RenewLock(d.LockToken)
	assert.ErrorIs(t, err, ErrUnknownQueue)
	require.NoError(t, b.RemoveQueue("src"))
	require.NoError(t, b.RemoveQueue("target"))
	require.NoError(t, b.AddQueue(QueueConfig{Name: "target"}), "the name is free again and validation still passes")
}

func TestRemoveTopicAndSubscription(t *testing.T) {
	b, _ := newTopicBroker(t, []QueueConfig{{Name: "in", ForwardTo: "t"}},
		TopicConfig{Name: "t", Subscriptions: []SubscriptionConfig{{Name: "a"}, {Name: "b"}}})
	require.ErrorIs(t, b.RemoveTopic("t"), ErrInUse)
	require.NoError(t, b.RemoveSubscription("t", "A"))
	_, ok := b.Subscription("t", "a")
	assert.False(t, ok)
	tc, ok := b.TopicConfig("t")
	require.True(t, ok)
	require.Len(t, tc.Subscriptions, 1)
	assert.Equal(t, "b", tc.Subscriptions[0].Name)

	topic, _ := b.Queue("t")
	mustSend(t, topic, newMsg("1", "x"))
	assert.Equal(t, 1, mustSubscription(t, b, "t", "b").Runtime().Active)

	require.NoError(t, b.RemoveQueue("in"))
	require.NoError(t, b.RemoveTopic("t"))
	assert.Empty(t, b.Topics())
	_, ok = b.Subscription("t", "b")
	assert.False(t, ok)
}

func TestRulesChange(t *testing.T) {
	b, _ := newTopicBroker(t, nil, TopicConfig{Name: "t", Subscriptions: []SubscriptionConfig{{Name: "s"}}})
	topic, _ := b.Queue("t")
	sub := mustSubscription(t, b, "t", "s")
	rules, ok := b.Rules("t", "s")
	require.True(t, ok)
	assert.Equal(t, []RuleConfig{{Name: DefaultRuleName}}, rules)

	require.NoError(t, b.AddRule("t", "s", RuleConfig{Name: "urgent", SQLFilter: "prio > 2"}))
	assert.ErrorIs(t, b.AddRule("t", "s", RuleConfig{Name: "URGENT"}), ErrRuleExists)
	assert.ErrorIs(t, b.AddRule("t", "s", RuleConfig{Name: "bad", SQLFilter: "x ="}), ErrInvalidConfig)
	require.NoError(t, b.RemoveRule("t", "s", DefaultRuleName))
	assert.ErrorIs(t, b.RemoveRule("t", "s", DefaultRuleName), ErrRuleNotFound)

	low := newMsg("1", "low")
	low.ApplicationProperties = map[string]any{"prio": int64(1)}
	high := newMsg("2", "high")
	high.ApplicationProperties = map[string]any{"prio": int64(3)}
	mustSend(t, topic, low)
	mustSend(t, topic, high)
	assert.Equal(t, "high", body(mustReceive(t, sub, ReceiveAndDelete)))
	assert.Equal(t, 0, sub.Runtime().Active)

	require.NoError(t, b.ReplaceRule("t", "s", RuleConfig{Name: "urgent", SQLFilter: "prio = 1"}))
	require.NoError(t, b.RemoveRule("t", "s", "urgent"))
	rules, _ = b.Rules("t", "s")
	assert.Empty(t, rules, "a subscription may be left without rules")
	mustSend(t, topic, newMsg("3", "nothing matches"))
	assert.Equal(t, 0, sub.Runtime().Active)
}

func TestUpdateSettings(t *testing.T) {
	b, _ := newTopicBroker(t, []QueueConfig{{Name: "q", DuplicateDetectionWindow: time.Minute}, {Name: "f", ForwardTo: "q"}},
		TopicConfig{Name: "t", Subscriptions: []SubscriptionConfig{{Name: "s"}}})
	require.NoError(t, b.UpdateQueue(QueueConfig{Name: "Q", LockDuration: 30 * time.Second, MaxDeliveryCount: 3, DuplicateDetectionWindow: time.Hour}))
	cfg, ok := b.QueueConfig("q")
	require.True(t, ok)
	assert.Equal(t, "q", cfg.Name)
	assert.Equal(t, 30*time.Second, cfg.LockDuration)
	assert.Equal(t, 3, cfg.MaxDeliveryCount)
	assert.Equal(t, time.Hour, cfg.DuplicateDetectionWindow)

	assert.ErrorIs(t, b.UpdateQueue(QueueConfig{Name: "q"}), ErrNotSupported, "duplicate detection cannot be switched off")
	assert.ErrorIs(t, b.UpdateQueue(QueueConfig{Name: "f"}), ErrNotSupported, "forwarding cannot change")
	assert.ErrorIs(t, b.UpdateQueue(QueueConfig{Name: "q", LockDuration: time.Hour}), ErrInvalidConfig)
	assert.ErrorIs(t, b.UpdateQueue(QueueConfig{Name: "x"}), ErrUnknownQueue)

	require.NoError(t, b.UpdateSubscription("t", SubscriptionConfig{Name: "s", MaxDeliveryCount: 2}))
	tc, _ := b.TopicConfig("t")
	assert.Equal(t, 2, tc.Subscriptions[0].MaxDeliveryCount)
	require.NoError(t, b.UpdateTopic(TopicConfig{Name: "t", DefaultTTL: time.Hour}))
	tc, _ = b.TopicConfig("t")
	assert.Equal(t, time.Hour, tc.DefaultTTL)
	assert.Len(t, tc.Subscriptions, 1, "an update keeps the subscriptions")
}

// TestManagementRacesTraffic changes settings, subscriptions and rules
// while messages flow; run with -race, it shows every change is made
// under the broker lock.
func TestManagementRacesTraffic(t *testing.T) {
	b, _ := newTopicBroker(t, []QueueConfig{{Name: "q"}}, TopicConfig{Name: "t", Subscriptions: []SubscriptionConfig{{Name: "s"}}})
	q, _ := b.Queue("q")
	topic, _ := b.Queue("t")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			for _, target := range []*Queue{q, topic} {
				if _, _, err := target.Send(newMsg(i, "x"), 10); err != nil {
					t.Error(err) // not require: this is not the test goroutine
					return
				}
			}
			_ = q.MaxMessageSize()
			_ = topic.Subscriptions()
		}
	}()
	for i := range 50 {
		require.NoError(t, b.UpdateQueue(QueueConfig{Name: "q", MaxDeliveryCount: i + 1}))
		name := "extra" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		require.NoError(t, b.AddSubscription("t", SubscriptionConfig{Name: name}))
		require.NoError(t, b.AddRule("t", name, RuleConfig{Name: "r", SQLFilter: "1=1"}))
		require.NoError(t, b.RemoveSubscription("t", name))
	}
	<-done
	assert.Equal(t, 200, q.Runtime().Active)
	assert.Equal(t, 200, mustSubscription(t, b, "t", "s").Runtime().Active)
}
