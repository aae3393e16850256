package broker

import (
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// NewInProcess runs no goroutine: a synctest bubble that creates one and
// never closes it still ends cleanly, which a broker from New cannot do.
func TestNewInProcessLeavesNoGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		before := runtime.NumGoroutine()
		b, err := NewInProcess(Options{}, QueueConfig{Name: "q"})
		require.NoError(t, err)
		synctest.Wait() // the stopped wake-up goroutine signals before it has quite exited
		assert.Equal(t, before, runtime.NumGoroutine())
		q, _ := b.Queue("q")
		mustSend(t, q, newMsg("a", "x"))
		assert.Equal(t, "x", body(mustReceive(t, q, PeekLock)), "the broker stays open")
	})
}

func TestNewInProcessRejectsBadConfig(t *testing.T) {
	_, err := NewInProcess(Options{}, QueueConfig{Name: "a/b"})
	assert.ErrorIs(t, err, ErrInvalidConfig)
	_, err = NewInProcess(Options{DataDir: t.TempDir()}, QueueConfig{Name: "q"})
	assert.ErrorIs(t, err, ErrInvalidConfig, "persistence needs a goroutine and a Close")
}

func TestNewInProcessCloseReturns(t *testing.T) {
	b, err := NewInProcess(Options{}, QueueConfig{Name: "q"})
	require.NoError(t, err)
	b.Close()
	b.Close()
	q, _ := b.Queue("q")
	_, _, err = q.Send(newMsg("a", "x"), 10)
	assert.ErrorIs(t, err, ErrClosed)
	assert.True(t, b.Advance().IsZero(), "a closed broker has nothing pending")
}

// Advance applies what is due everywhere, including a topic's scheduled
// message reaching its subscription, and reports the next deadline.
func TestAdvanceReportsNextDeadline(t *testing.T) {
	mock := clock.NewMock()
	b, err := NewInProcess(Options{Clock: mock, Topics: []TopicConfig{{Name: "t", Subscriptions: []SubscriptionConfig{{Name: "s", LockDuration: 30 * time.Second}}}}},
		QueueConfig{Name: "q"})
	require.NoError(t, err)
	assert.True(t, b.Advance().IsZero(), "nothing pending")

	topic, _ := b.Queue("t")
	sub, _ := b.Subscription("t", "s")
	at := mock.Now().Add(time.Minute)
	_, err = topic.Schedule(newMsg("a", "x"), 10, at)
	require.NoError(t, err)
	assert.Equal(t, at, b.Advance())

	mock.Add(time.Minute)
	// A subscription's own calls advance the subscription only; the topic's
	// scheduled message reaches it through Advance (or the wake-up).
	assert.Equal(t, Stats{}, sub.Stats())
	assert.True(t, b.Advance().IsZero())
	assert.Equal(t, Stats{Active: 1}, sub.Stats())
	d := mustReceive(t, sub, PeekLock)
	assert.Equal(t, at.Add(30*time.Second), b.Advance(), "the lock is the next deadline")
	mock.Add(30 * time.Second)
	b.Advance()
	assert.Equal(t, Stats{Active: 1}, sub.Stats(), "the lock expired")
	assert.ErrorIs(t, sub.Complete(d.LockToken), ErrLockLost)
}

func TestCompleteDeliveryReturnsTheMessage(t *testing.T) {
	b, err := NewInProcess(Options{Clock: clock.NewMock()}, QueueConfig{Name: "q"})
	require.NoError(t, err)
	q, _ := b.Queue("q")
	seq := mustSend(t, q, newMsg("a", "x"))
	d := mustReceive(t, q, PeekLock)

	got, err := q.CompleteDelivery(d.LockToken)
	require.NoError(t, err)
	assert.Equal(t, seq, got.SequenceNumber)
	assert.Equal(t, "x", body(got))
	assert.EqualValues(t, 1, got.Message.Header.DeliveryCount, "every delivery, the settled one included")
	assert.Equal(t, Stats{}, q.Stats())

	_, err = q.CompleteDelivery(d.LockToken)
	assert.ErrorIs(t, err, ErrLockLost)
}

// The in-process door waits for sessions with TryAcceptNextSession and the
// deadline Advance reports, which includes session locks: a held session
// becomes acceptable when its lock runs out, with no goroutine to end it.
func TestInProcessSessionAcceptAndLockDeadline(t *testing.T) {
	mock := clock.NewMock()
	b, err := NewInProcess(Options{Clock: mock}, QueueConfig{Name: "q", RequiresSession: true, LockDuration: 30 * time.Second},
		QueueConfig{Name: "plain"})
	require.NoError(t, err)
	q, _ := b.Queue("q")

	l, _, err := q.TryAcceptNextSession(1)
	require.NoError(t, err)
	assert.Nil(t, l, "no session has messages")
	mustSend(t, q, sessionMsg("s", "x"))
	l, until, err := q.TryAcceptNextSession(1)
	require.NoError(t, err)
	require.NotNil(t, l)
	assert.Equal(t, "s", l.SessionID())
	assert.Equal(t, mock.Now().Add(30*time.Second), until)
	_, ok := l.TryReceive(PeekLock)
	require.True(t, ok)

	other, _, err := q.TryAcceptNextSession(2)
	require.NoError(t, err)
	assert.Nil(t, other, "the only session is held")
	assert.Equal(t, until, b.Advance(), "the session lock is the next deadline")
	mock.Add(30 * time.Second)
	b.Advance()
	other, _, err = q.TryAcceptNextSession(2)
	require.NoError(t, err)
	require.NotNil(t, other, "the expired lock freed the session")
	d, ok := other.TryReceive(PeekLock)
	require.True(t, ok)
	assert.Equal(t, uint32(1), d.Message.Header.DeliveryCount, "the expired session lock counted the delivery")

	plain, _ := b.Queue("plain")
	_, _, err = plain.TryAcceptNextSession(1)
	assert.ErrorIs(t, err, ErrSessionRequired)
}
