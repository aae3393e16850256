package broker

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The clocks tests use satisfy the interface as they are.
var (
	_ Clock = clock.New()
	_ Clock = clock.NewMock()
	_ Clock = RealClock()
)

// TestRealClockInsideSynctest shows the broker on its default clock inside a
// testing/synctest bubble: a receiver parked on a message scheduled an hour
// ahead gets it as soon as every goroutine is blocked, because the bubble's
// fake time jumps to the broker's wake-up.
func TestRealClockInsideSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := New(Options{}, QueueConfig{Name: "q", LockDuration: time.Minute})
		require.NoError(t, err)
		defer b.Close()
		q, _ := b.Queue("q")

		start := time.Now()
		_, err = q.Schedule(newMsg("1", "later"), 10, start.Add(time.Hour))
		require.NoError(t, err)
		d, err := q.Receive(context.Background(), PeekLock, 1)
		require.NoError(t, err)
		assert.Equal(t, "later", body(d))
		assert.Equal(t, time.Hour, time.Since(start), "fake time moved exactly to the activation")

		// The lock expires on the same fake time.
		d2, err := q.Receive(context.Background(), PeekLock, 1)
		require.NoError(t, err)
		assert.Equal(t, d.SequenceNumber, d2.SequenceNumber)
		assert.Equal(t, time.Hour+time.Minute, time.Since(start))
		assert.ErrorIs(t, q.Complete(d.LockToken), ErrLockLost)
	})
}

// TestWakeupArmsEarlierDeadline checks that a deadline earlier than the armed
// wake-up re-arms it, and that a spurious early wake-up (the armed deadline
// went away) re-arms for what is really next.
func TestWakeupArmsEarlierDeadline(t *testing.T) {
	q, mock := newTestQueue(t, QueueConfig{})
	_, err := q.Schedule(newMsg("late", "late"), 10, mock.Now().Add(time.Hour))
	require.NoError(t, err)
	early, err := q.Schedule(newMsg("early", "early"), 10, mock.Now().Add(time.Minute))
	require.NoError(t, err)

	ch := receiveAsync(t, context.Background(), q, ReceiveAndDelete)
	mock.Add(time.Minute)
	r := await(t, ch)
	require.NoError(t, r.err)
	assert.Equal(t, "early", body(r.d))

	// Cancel leaves the wake-up armed for nothing; the next one still fires.
	next, err := q.Schedule(newMsg("next", "next"), 10, mock.Now().Add(2*time.Minute))
	require.NoError(t, err)
	require.NoError(t, q.CancelScheduled(next))
	assert.ErrorIs(t, q.CancelScheduled(early), ErrNotFound)
	ch = receiveAsync(t, context.Background(), q, ReceiveAndDelete)
	mock.Add(2 * time.Minute) // the cancelled one's wake-up: nothing to deliver
	assertPending(t, ch)
	mock.Add(time.Hour)
	r = await(t, ch)
	require.NoError(t, r.err)
	assert.Equal(t, "late", body(r.d))
}
