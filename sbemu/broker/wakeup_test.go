package broker

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
