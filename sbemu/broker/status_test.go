package broker

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseEntityStatus(t *testing.T) {
	tests := []struct {
		in      string
		want    EntityStatus
		wantErr bool
	}{
		{"", StatusActive, false},
		{"Active", StatusActive, false},
		{"receivedisabled", StatusReceiveDisabled, false},
		{"SendDisabled", StatusSendDisabled, false},
		{"Disabled", StatusDisabled, false},
		{"Restoring", "", true},
		{"Paused", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseEntityStatus(tc.in)
			if tc.wantErr {
				assert.ErrorIs(t, err, ErrInvalidConfig)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	_, err := New(Options{}, QueueConfig{Name: "q", Status: "receivedisabled"})
	assert.ErrorIs(t, err, ErrInvalidConfig, "the configuration spells a status exactly")
}

func TestStatusSendDisabled(t *testing.T) {
	q, mock := newTestQueue(t, QueueConfig{})
	mustSend(t, q, newMsg("before", "kept"))
	setQueueStatus(t, q, StatusSendDisabled)
	_, _, err := q.Send(newMsg("after", "refused"), 10)
	assert.ErrorIs(t, err, ErrEntityDisabled)
	_, err = q.Schedule(newMsg("later", "refused"), 10, mock.Now().Add(time.Hour))
	assert.ErrorIs(t, err, ErrEntityDisabled)
	d := mustReceive(t, q, PeekLock)
	assert.Equal(t, "kept", body(d), "receiving still works")
	require.NoError(t, q.Complete(d.LockToken))
	assert.Equal(t, StatusSendDisabled, q.Status())
}

func TestStatusReceiveDisabled(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{})
	mustSend(t, q, newMsg("1", "locked before"))
	locked := mustReceive(t, q, PeekLock)
	mustSend(t, q, newMsg("2", "waiting"))
	setQueueStatus(t, q, StatusReceiveDisabled)

	mustSend(t, q, newMsg("3", "sends still work"))
	_, ok := q.TryReceive(PeekLock, 1)
	assert.False(t, ok)
	_, err := q.Receive(context.Background(), PeekLock, 1)
	assert.ErrorIs(t, err, ErrEntityDisabled)
	assert.ErrorIs(t, q.Complete(locked.LockToken), ErrEntityDisabled)
	assert.ErrorIs(t, q.DeadLetter(locked.LockToken, "r", "d", nil), ErrEntityDisabled)
	require.NoError(t, q.Abandon(locked.LockToken, nil), "the message can go back")
	assert.Equal(t, 3, q.Stats().Active, "nothing was lost")

	setQueueStatus(t, q, StatusActive)
	d := mustReceive(t, q, PeekLock)
	require.NoError(t, q.Complete(d.LockToken))
}

func TestStatusWakesABlockedReceiver(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{})
	ch := receiveAsync(t, context.Background(), q, PeekLock)
	setQueueStatus(t, q, StatusDisabled)
	r := await(t, ch)
	assert.ErrorIs(t, r.err, ErrEntityDisabled)
	_, _, err := q.Send(newMsg("x", "x"), 10)
	assert.ErrorIs(t, err, ErrEntityDisabled, "Disabled is SendDisabled and ReceiveDisabled")
}

func TestStatusLeavesTheDeadLetterQueueOpen(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{})
	mustSend(t, q, newMsg("1", "dead"))
	d := mustReceive(t, q, PeekLock)
	require.NoError(t, q.DeadLetter(d.LockToken, "r", "d", nil))
	setQueueStatus(t, q, StatusDisabled)
	dlq, ok := q.b.Queue("q/$DeadLetterQueue")
	require.True(t, ok)
	dd := mustReceive(t, dlq, PeekLock)
	require.NoError(t, dlq.Complete(dd.LockToken))
	assert.Equal(t, StatusDisabled, dlq.Status(), "it reports its entity's status")
}

func TestStatusOfTopicsAndSubscriptions(t *testing.T) {
	b, err := New(Options{})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	require.NoError(t, b.AddTopic(TopicConfig{Name: "t", Subscriptions: []SubscriptionConfig{
		{Name: "open"}, {Name: "paused", Status: StatusReceiveDisabled},
	}}))
	topic, _ := b.Queue("t")
	open, _ := b.Subscription("t", "open")
	paused, _ := b.Subscription("t", "paused")

	mustSend(t, topic, newMsg("1", "fan-out"))
	assert.Equal(t, 1, paused.Stats().Active, "a disabled subscription still gets its copy")
	_, ok := paused.TryReceive(PeekLock, 1)
	assert.False(t, ok)
	d := mustReceive(t, open, PeekLock)
	require.NoError(t, open.Complete(d.LockToken))

	require.NoError(t, b.UpdateTopic(TopicConfig{Name: "t", Status: StatusSendDisabled}))
	_, _, err = topic.Send(newMsg("2", "refused"), 10)
	assert.ErrorIs(t, err, ErrEntityDisabled)
	require.NoError(t, b.UpdateSubscription("t", SubscriptionConfig{Name: "paused"}))
	d = mustReceive(t, paused, PeekLock)
	require.NoError(t, paused.Complete(d.LockToken), "a SendDisabled topic's subscriptions still deliver")

	require.NoError(t, b.UpdateTopic(TopicConfig{Name: "t"}))
	mustSend(t, topic, newMsg("3", "again"))
	require.NoError(t, b.AddSubscription("t", SubscriptionConfig{Name: "late"}))
	late, _ := b.Subscription("t", "late")
	require.NoError(t, b.UpdateTopic(TopicConfig{Name: "t", Status: StatusDisabled}))
	_, err = open.Receive(context.Background(), PeekLock, 1)
	assert.ErrorIs(t, err, ErrEntityDisabled, "nothing is received from a subscription of a Disabled topic")
	_, err = late.Receive(context.Background(), PeekLock, 1)
	assert.ErrorIs(t, err, ErrEntityDisabled, "also from one added later")
	tc, _ := b.TopicConfig("t")
	assert.Equal(t, StatusDisabled, tc.Status)
}

func TestStatusRefusesSessionReceivers(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{RequiresSession: true})
	mustSend(t, q, sessionMsg("s", "m"))
	setQueueStatus(t, q, StatusReceiveDisabled)
	_, _, err := q.AcceptSession("s", 1)
	assert.ErrorIs(t, err, ErrEntityDisabled)
	_, _, err = q.AcceptNextSession(context.Background(), 1, time.Second)
	assert.ErrorIs(t, err, ErrEntityDisabled)
	ids, err := q.Sessions(0, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{"s"}, ids, "listing sessions is a management operation")
}

func TestPersistStatus(t *testing.T) {
	dir := t.TempDir()
	b, err := New(Options{DataDir: dir}, QueueConfig{Name: "q"})
	require.NoError(t, err)
	require.NoError(t, b.UpdateQueue(QueueConfig{Name: "q", Status: StatusSendDisabled}))
	require.NoError(t, b.Sync(context.Background()))
	b.Close()
	b2, err := New(Options{DataDir: dir}, QueueConfig{Name: "q"})
	require.NoError(t, err)
	defer b2.Close()
	q, _ := b2.Queue("q")
	assert.Equal(t, StatusSendDisabled, q.Status())
	_, _, err = q.Send(newMsg("x", "x"), 10)
	assert.ErrorIs(t, err, ErrEntityDisabled)
}

// setQueueStatus changes q's status through UpdateQueue, keeping the rest
// of its configuration.
func setQueueStatus(t *testing.T, q *Queue, st EntityStatus) {
	t.Helper()
	cfg, ok := q.b.QueueConfig(q.Name())
	require.True(t, ok)
	cfg.Status = st
	require.NoError(t, q.b.UpdateQueue(cfg))
}
