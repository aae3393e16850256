package broker

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReceiveAnnotationTypes(t *testing.T) {
	tests := []struct {
		name       string
		mode       Mode
		wantLocked bool
	}{
		{"peek-lock", PeekLock, true},
		{"receive-and-delete", ReceiveAndDelete, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, mock := newTestQueue(t, QueueConfig{LockDuration: 30 * time.Second})
			mock.Add(time.Hour)
			sentAt := mock.Now()
			mustSend(t, q, newMsg("id", "x"))
			d := mustReceive(t, q, tt.mode)

			require.NotNil(t, d.Message.Header)
			assert.Zero(t, d.Message.Header.DeliveryCount)
			assert.Equal(t, int64(1), d.Message.Annotations[AnnotationSequenceNumber])
			assert.Equal(t, sentAt, d.Message.Annotations[AnnotationEnqueuedTime])
			lockedUntil, ok := d.Message.Annotations[AnnotationLockedUntil]
			if !tt.wantLocked {
				assert.False(t, ok)
				assert.Zero(t, d.LockToken)
				assert.Zero(t, d.LockedUntil)
				assert.Equal(t, Stats{}, q.Stats(), "receive-and-delete removes the message")
				return
			}
			assert.Equal(t, sentAt.Add(30*time.Second), lockedUntil)
			assert.IsType(t, time.Time{}, lockedUntil)
			assert.Equal(t, sentAt.Add(30*time.Second), d.LockedUntil)
			assert.NotZero(t, d.LockToken)
			assert.Equal(t, byte(4), d.LockToken[6]>>4, "uuid v4")
			assert.Equal(t, Stats{Locked: 1}, q.Stats())
		})
	}
}

func TestReceiveBlocksUntilSend(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{})
	ch := receiveAsync(t, context.Background(), q, PeekLock)
	assertPending(t, ch)
	mustSend(t, q, newMsg("1", "hello"))
	r := await(t, ch)
	require.NoError(t, r.err)
	assert.Equal(t, "hello", body(r.d))
}

func TestReceiveContext(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	ch := receiveAsync(t, ctx, q, PeekLock)
	cancel()
	r := await(t, ch)
	assert.ErrorIs(t, r.err, context.Canceled)
	assert.Equal(t, 0, waiters(q))

	// A context that is already done takes nothing.
	mustSend(t, q, newMsg("1", "x"))
	_, err := q.Receive(ctx, PeekLock, 1)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, Stats{Active: 1}, q.Stats())
}

func TestTryReceiveEmpty(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{})
	d, ok := q.TryReceive(PeekLock, 1)
	assert.False(t, ok)
	assert.Nil(t, d)
}

func TestLockExpiryOnClockAdvance(t *testing.T) {
	q, mock := newTestQueue(t, QueueConfig{LockDuration: 10 * time.Second})
	mustSend(t, q, newMsg("1", "x"))
	first := mustReceive(t, q, PeekLock)

	// A receiver blocked now is woken by the lock expiring.
	ch := receiveAsync(t, context.Background(), q, PeekLock)
	mock.Add(9 * time.Second)
	assertPending(t, ch)
	mock.Add(time.Second)
	r := await(t, ch)
	require.NoError(t, r.err)
	assert.Equal(t, first.SequenceNumber, r.d.SequenceNumber)
	assert.EqualValues(t, 1, r.d.Message.Header.DeliveryCount)
	assert.NotEqual(t, first.LockToken, r.d.LockToken)
	assert.ErrorIs(t, q.Complete(first.LockToken), ErrLockLost)
	require.NoError(t, q.Complete(r.d.LockToken))
}

func TestModeString(t *testing.T) {
	assert.Equal(t, "PeekLock", PeekLock.String())
	assert.Equal(t, "ReceiveAndDelete", ReceiveAndDelete.String())
	assert.Equal(t, "Mode(?)", Mode(9).String())
}
