package broker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// deferOne sends body, receives it and defers it; it returns its number.
func deferOne(t *testing.T, q *Queue, body string) int64 {
	t.Helper()
	seq := mustSend(t, q, newMsg(body, body))
	d := mustReceive(t, q, PeekLock)
	require.Equal(t, seq, d.SequenceNumber)
	require.NoError(t, q.Defer(d.LockToken, nil))
	return seq
}

func TestDeferredMessageIsOnlyReceivedBySequenceNumber(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{})
	seq := deferOne(t, q, "later")
	mustSend(t, q, newMsg("next", "next"))

	next := mustReceive(t, q, PeekLock)
	assert.Equal(t, "next", body(next), "the deferred message is skipped")
	_, ok := q.TryReceive(PeekLock, 1)
	assert.False(t, ok)
	assert.Equal(t, Stats{Locked: 1, Deferred: 1}, q.Stats())

	got, err := q.ReceiveDeferred(PeekLock, 1, seq)
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, "later", body(got[0]))
	assert.Equal(t, messageStateDeferred, got[0].Message.Annotations[AnnotationMessageState])
	assert.EqualValues(t, 1, got[0].Message.Header.DeliveryCount, "the receive by number counts as a delivery")
	assert.False(t, got[0].LockedUntil.IsZero())

	_, err = q.ReceiveDeferred(PeekLock, 1, seq)
	assert.ErrorIs(t, err, ErrNotFound, "a deferred message under lock is not received twice")
	require.NoError(t, q.Complete(got[0].LockToken))
	_, err = q.ReceiveDeferred(PeekLock, 1, seq)
	assert.ErrorIs(t, err, ErrNotFound)
}

func TestDeferredLockEndsBackInDeferred(t *testing.T) {
	tests := []struct {
		name      string
		end       func(q *Queue, mock interface{ Add(time.Duration) }, token [16]byte)
		wantCount uint32 // header delivery count of the next receive by number
	}{
		{"abandon", func(q *Queue, _ interface{ Add(time.Duration) }, tok [16]byte) {
			require.NoError(t, q.Abandon(tok, map[any]any{"k": "v"}))
		}, 2},
		{"defer again", func(q *Queue, _ interface{ Add(time.Duration) }, tok [16]byte) {
			require.NoError(t, q.Defer(tok, map[any]any{"k": "v"}))
		}, 2},
		{"release", func(q *Queue, _ interface{ Add(time.Duration) }, tok [16]byte) { require.NoError(t, q.Release(tok)) }, 1},
		{"lock expiry", func(_ *Queue, mock interface{ Add(time.Duration) }, _ [16]byte) { mock.Add(2 * time.Minute) }, 2},
		{"dropped connection", func(q *Queue, _ interface{ Add(time.Duration) }, _ [16]byte) { q.b.ReleaseOwner(7) }, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, mock := newTestQueue(t, QueueConfig{})
			seq := deferOne(t, q, "x")
			got, err := q.ReceiveDeferred(PeekLock, 7, seq)
			require.NoError(t, err)
			tt.end(q, mock, got[0].LockToken)

			assert.Equal(t, Stats{Deferred: 1}, q.Stats())
			_, ok := q.TryReceive(PeekLock, 1)
			assert.False(t, ok, "still deferred")
			peeked := q.Peek(0, 10)
			require.Len(t, peeked, 1)
			assert.Equal(t, messageStateDeferred, peeked[0].Message.Annotations[AnnotationMessageState])
			again, err := q.ReceiveDeferred(PeekLock, 1, seq)
			require.NoError(t, err)
			assert.Equal(t, tt.wantCount, again[0].Message.Header.DeliveryCount)
			if tt.name == "abandon" || tt.name == "defer again" {
				assert.Equal(t, "v", again[0].Message.ApplicationProperties["k"])
			}
		})
	}
}

func TestDeferredMessageDeadLetterAndMaxDeliveryCount(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{MaxDeliveryCount: 2})
	seq := deferOne(t, q, "x")                      // delivery 1
	got, err := q.ReceiveDeferred(PeekLock, 1, seq) // delivery 2
	require.NoError(t, err)
	require.NoError(t, q.Abandon(got[0].LockToken, nil))
	assert.Equal(t, Stats{DeadLettered: 1}, q.Stats(), "abandon after the last delivery dead-letters, deferred or not")

	seq = deferOne(t, q, "y")
	got, err = q.ReceiveDeferred(PeekLock, 1, seq)
	require.NoError(t, err)
	require.NoError(t, q.DeadLetter(got[0].LockToken, "why", "", nil))
	assert.Equal(t, Stats{DeadLettered: 2}, q.Stats())
	dead := mustReceive(t, q.dlq, PeekLock)
	require.NoError(t, q.dlq.Defer(dead.LockToken, nil), "a dead-letter queue defers too")
	_, ok := q.dlq.TryReceive(PeekLock, 1)
	assert.True(t, ok, "the other dead letter")
}

func TestReceiveDeferredIsAllOrNothing(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{})
	a := deferOne(t, q, "a")
	b := deferOne(t, q, "b")
	active := mustSend(t, q, newMsg("c", "c"))

	for name, seqs := range map[string][]int64{
		"unknown":       {a, 999},
		"not deferred":  {active, b},
		"zero or minus": {-1},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := q.ReceiveDeferred(PeekLock, 1, seqs...)
			assert.ErrorIs(t, err, ErrNotFound)
			assert.Equal(t, 2, q.Stats().Deferred, "nothing was received")
		})
	}
	got, err := q.ReceiveDeferred(ReceiveAndDelete, 1, b, a, b)
	require.NoError(t, err)
	require.Len(t, got, 2, "a number listed twice is received once")
	assert.Equal(t, []string{"b", "a"}, []string{body(got[0]), body(got[1])}, "argument order")
	assert.Equal(t, Stats{Active: 1}, q.Stats(), "receive-and-delete removed them")
}

// Deferred messages expire only when a receive by number asks for them
// (message-deferral.md).
func TestDeferredMessageExpiresWhenReceived(t *testing.T) {
	for _, dlq := range []bool{false, true} {
		t.Run(map[bool]string{false: "dropped", true: "dead-lettered"}[dlq], func(t *testing.T) {
			q, mock := newTestQueue(t, QueueConfig{DefaultTTL: time.Minute, DeadLetterOnExpiration: dlq})
			seq := deferOne(t, q, "x")
			mock.Add(time.Hour)
			assert.Equal(t, Stats{Deferred: 1}, q.Stats(), "not expired while nobody asks")
			assert.Len(t, q.Peek(0, 10), 1)

			_, err := q.ReceiveDeferred(PeekLock, 1, seq)
			require.ErrorIs(t, err, ErrNotFound)
			want := Stats{}
			if dlq {
				want.DeadLettered = 1
			}
			assert.Equal(t, want, q.Stats())
		})
	}
}

func TestDeferLostLock(t *testing.T) {
	q, mock := newTestQueue(t, QueueConfig{LockDuration: 10 * time.Second})
	mustSend(t, q, newMsg("x", "x"))
	d := mustReceive(t, q, PeekLock)
	mock.Add(11 * time.Second)
	assert.ErrorIs(t, q.Defer(d.LockToken, nil), ErrLockLost)
	assert.Equal(t, Stats{Active: 1}, q.Stats())
}

func TestPersistDeferredMessages(t *testing.T) {
	dir := t.TempDir()
	mock := newPersistClock()
	b := openPersistBroker(t, dir, mock, Options{})
	orders, _ := b.Queue("orders")
	idle := deferOne(t, orders, "idle")
	held := deferOne(t, orders, "held")
	_, err := orders.ReceiveDeferred(PeekLock, 1, held)
	require.NoError(t, err)
	require.NoError(t, b.Sync(t.Context()))
	b.Close()

	b2 := openPersistBroker(t, dir, mock, Options{})
	orders2, _ := b2.Queue("orders")
	assert.Equal(t, Stats{Deferred: 2}, orders2.Stats(), "a lock held at close returns the message to the deferred ones")
	_, ok := orders2.TryReceive(PeekLock, 1)
	assert.False(t, ok)
	got, err := orders2.ReceiveDeferred(PeekLock, 1, idle, held)
	require.NoError(t, err)
	assert.EqualValues(t, 1, got[0].Message.Header.DeliveryCount)
	assert.EqualValues(t, 2, got[1].Message.Header.DeliveryCount, "the lock lost at close counted")
	require.NoError(t, orders2.Abandon(got[0].LockToken, nil))
	b2.Close()

	b3 := openPersistBroker(t, dir, mock, Options{})
	orders3, _ := b3.Queue("orders")
	assert.Equal(t, Stats{Deferred: 2}, orders3.Stats())
}
