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
