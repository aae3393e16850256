package broker

import (
	"testing"
	"time"

	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSettlement(t *testing.T) {
	tests := []struct {
		name      string
		settle    func(q *Queue, token [16]byte) error
		wantStats Stats
		// wantNextCount is the header delivery count of the next delivery,
		// -1 when the message must not come back.
		wantNextCount int
	}{
		{"complete", func(q *Queue, tok [16]byte) error { return q.Complete(tok) }, Stats{}, -1},
		{"abandon counts the delivery", func(q *Queue, tok [16]byte) error { return q.Abandon(tok, nil) }, Stats{Active: 1}, 1},
		{"release does not count", func(q *Queue, tok [16]byte) error { return q.Release(tok) }, Stats{Active: 1}, 0},
		{"dead-letter", func(q *Queue, tok [16]byte) error { return q.DeadLetter(tok, "r", "d", nil) }, Stats{DeadLettered: 1}, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, _ := newTestQueue(t, QueueConfig{})
			mustSend(t, q, newMsg("1", "x"))
			d := mustReceive(t, q, PeekLock)
			require.NoError(t, tt.settle(q, d.LockToken))
			assert.Equal(t, tt.wantStats, q.Stats())
			assert.ErrorIs(t, q.Complete(d.LockToken), ErrLockLost, "a settled lock is gone")
			next, ok := q.TryReceive(PeekLock, 1)
			if tt.wantNextCount < 0 {
				assert.False(t, ok)
				return
			}
			require.True(t, ok)
			assert.EqualValues(t, tt.wantNextCount, next.Message.Header.DeliveryCount)
			assert.Equal(t, d.SequenceNumber, next.SequenceNumber)
		})
	}
}

func TestMaxDeliveryCount(t *testing.T) {
	tests := []struct {
		name     string
		max      int
		wantDLQs int // deliveries before dead-lettering
		giveBack func(q *Queue, mock interface{ Add(time.Duration) }, d *Delivery)
	}{
		{"abandon, default max", 0, 10, func(q *Queue, _ interface{ Add(time.Duration) }, d *Delivery) {
			require.NoError(t, q.Abandon(d.LockToken, nil))
		}},
		{"abandon, max 3", 3, 3, func(q *Queue, _ interface{ Add(time.Duration) }, d *Delivery) {
			require.NoError(t, q.Abandon(d.LockToken, nil))
		}},
		{"lock expiry, max 2", 2, 2, func(_ *Queue, mock interface{ Add(time.Duration) }, _ *Delivery) {
			mock.Add(time.Minute)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, mock := newTestQueue(t, QueueConfig{MaxDeliveryCount: tt.max, LockDuration: time.Minute})
			mustSend(t, q, newMsg("1", "x"))
			for n := 1; n <= tt.wantDLQs; n++ {
				d := mustReceive(t, q, PeekLock)
				assert.EqualValues(t, n-1, d.Message.Header.DeliveryCount, "delivery %d", n)
				tt.giveBack(q, mock, d)
			}
			_, ok := q.TryReceive(PeekLock, 1)
			assert.False(t, ok)
			assert.Equal(t, Stats{DeadLettered: 1}, q.Stats())
			dl := mustReceive(t, q.dlq, PeekLock)
			assert.Equal(t, ReasonMaxDeliveryCountExceeded, dl.Message.ApplicationProperties[PropertyDeadLetterReason])
			assert.IsType(t, "", dl.Message.ApplicationProperties[PropertyDeadLetterErrorDescription])
			assert.EqualValues(t, tt.wantDLQs, dl.Message.Header.DeliveryCount)
		})
	}
}

func TestSettleAfterLockExpiry(t *testing.T) {
	tests := []struct {
		name   string
		settle func(q *Queue, token [16]byte) error
	}{
		{"complete", func(q *Queue, tok [16]byte) error { return q.Complete(tok) }},
		{"abandon", func(q *Queue, tok [16]byte) error { return q.Abandon(tok, nil) }},
		{"release", func(q *Queue, tok [16]byte) error { return q.Release(tok) }},
		{"dead-letter", func(q *Queue, tok [16]byte) error { return q.DeadLetter(tok, "r", "d", nil) }},
		{"renew", func(q *Queue, tok [16]byte) error { _, err := q.RenewLock(tok); return err }},
		{"unknown token", func(q *Queue, _ [16]byte) error { return q.Complete([16]byte{1, 2, 3}) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, mock := newTestQueue(t, QueueConfig{LockDuration: 30 * time.Second})
			mustSend(t, q, newMsg("1", "x"))
			d := mustReceive(t, q, PeekLock)
			mock.Add(30 * time.Second)
			assert.ErrorIs(t, tt.settle(q, d.LockToken), ErrLockLost)
			assert.Equal(t, Stats{Active: 1}, q.Stats(), "the message is back, untouched by the failed settlement")
		})
	}
}

func TestRenewLock(t *testing.T) {
	q, mock := newTestQueue(t, QueueConfig{LockDuration: 30 * time.Second})
	mustSend(t, q, newMsg("1", "a"))
	mustSend(t, q, newMsg("2", "b"))
	d1 := mustReceive(t, q, PeekLock)
	d2 := mustReceive(t, q, PeekLock)

	mock.Add(20 * time.Second)
	until, err := q.RenewLock(d1.LockToken, d2.LockToken)
	require.NoError(t, err)
	want := mock.Now().Add(30 * time.Second)
	assert.Equal(t, []time.Time{want, want}, until)

	mock.Add(20 * time.Second) // past the original expiry, inside the renewed one
	assert.Equal(t, Stats{Locked: 2}, q.Stats())
	require.NoError(t, q.Complete(d1.LockToken))

	// All-or-nothing: an unknown token fails the whole renewal.
	_, err = q.RenewLock(d2.LockToken, d1.LockToken)
	assert.ErrorIs(t, err, ErrLockLost)
	mock.Add(10 * time.Second)
	assert.Equal(t, Stats{Active: 1}, q.Stats(), "d2 was not renewed by the failed call")
}

func TestAbandonMergesProperties(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{})
	m := newMsg("1", "x")
	m.ApplicationProperties = map[string]any{"keep": "k", "attempt": int64(1)}
	mustSend(t, q, m)
	d := mustReceive(t, q, PeekLock)
	require.NoError(t, q.Abandon(d.LockToken, map[any]any{
		"attempt":             int64(2),
		amqp.Symbol("symbol"): "s",
		42:                    "ignored",
	}))
	next := mustReceive(t, q, PeekLock)
	assert.Equal(t, map[string]any{"keep": "k", "attempt": int64(2), "symbol": "s"}, next.Message.ApplicationProperties)
}

func TestDeadLetterReceiveFromDLQ(t *testing.T) {
	b, _ := newTestBroker(t, QueueConfig{Name: "Orders"})
	q, _ := b.Queue("orders")
	dlq, _ := b.Queue("orders/$deadletterqueue")
	mustSend(t, q, newMsg("a", "first"))
	seq := mustSend(t, q, newMsg("b", "second"))
	mustReceive(t, q, PeekLock) // "first" stays locked
	d := mustReceive(t, q, PeekLock)
	require.NoError(t, q.DeadLetter(d.LockToken, "Poison", "cannot parse", map[string]any{"extra": int64(7)}))

	assert.Equal(t, Stats{Locked: 1, DeadLettered: 1}, q.Stats())
	peeked := dlq.Peek(0, 10)
	require.Len(t, peeked, 1)

	dl := mustReceive(t, dlq, PeekLock)
	assert.Equal(t, "second", body(dl))
	assert.EqualValues(t, 1, dl.SequenceNumber, "the dead-letter queue numbers its own messages")
	assert.Equal(t, seq, dl.Message.Annotations[AnnotationEnqueuedSequenceNumber])
	assert.Equal(t, "Orders", dl.Message.Annotations[AnnotationDeadLetterSource])
	assert.Equal(t, "Poison", dl.Message.ApplicationProperties[PropertyDeadLetterReason])
	assert.Equal(t, "cannot parse", dl.Message.ApplicationProperties[PropertyDeadLetterErrorDescription])
	assert.Equal(t, int64(7), dl.Message.ApplicationProperties["extra"])
	assert.EqualValues(t, 0, dl.Message.Header.DeliveryCount, "the dead-letter settled the one delivery; it did not fail")

	// Service Bus cannot dead-letter out of a dead-letter queue.
	assert.ErrorIs(t, dlq.DeadLetter(dl.LockToken, "again", "", nil), ErrNotSupported)
	// The dead-letter queue has no delivery limit.
	for range 20 {
		require.NoError(t, dlq.Abandon(dl.LockToken, nil))
		dl = mustReceive(t, dlq, PeekLock)
	}
	assert.EqualValues(t, 0, dl.Message.Header.DeliveryCount, "deliveries from a dead-letter queue do not count")
	require.NoError(t, dlq.Complete(dl.LockToken))
	assert.Equal(t, Stats{}, dlq.Stats())
}

func TestDeadLetterWithoutReason(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{})
	mustSend(t, q, newMsg("1", "x"))
	d := mustReceive(t, q, PeekLock)
	require.NoError(t, q.DeadLetter(d.LockToken, "", "", nil))
	dl := mustReceive(t, q.dlq, PeekLock)
	assert.NotContains(t, dl.Message.ApplicationProperties, PropertyDeadLetterReason)
	assert.NotContains(t, dl.Message.ApplicationProperties, PropertyDeadLetterErrorDescription)
}
