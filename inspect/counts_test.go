package inspect

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/sbtest"
)

// TestCounts: one read counts the active messages, the pending retries and the dead letters, and says
// when a bound made a count a lower bound.
func TestCounts(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.Seed(t, "pending-1", "pending-2", "perm-1")
	h.Send(t, sbtest.Message("fresh-1"))
	ctx := sbtest.Context(t)
	c, err := h.inspector(t, nil).Counts(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, c.Active)
	assert.Equal(t, 2, c.Pending)
	assert.Equal(t, 1, c.DeadLetters)
	assert.False(t, c.Truncated())

	c, err = h.inspector(t, &Options{MaxPeek: 1}).Counts(ctx)
	require.NoError(t, err)
	assert.True(t, c.Truncated())
	assert.Equal(t, 1, c.Active+c.Pending)
}

// TestCountsSubscription reads the retry queue and both dead-letter queues of the subscription layout.
func TestCountsSubscription(t *testing.T) {
	t.Parallel()
	h := sbtest.NewSubscription(t)
	h.Seed(t, "pending-1", "perm-1", "max-1")
	in, err := New(h.Client, h.Entity, &Options{RetryQueue: h.RetryQueue})
	require.NoError(t, err)
	c, err := in.Counts(sbtest.Context(t))
	require.NoError(t, err)
	assert.Equal(t, 1, c.Pending)
	assert.Equal(t, 2, c.DeadLetters, "one in each dead-letter queue")
	assert.Len(t, c.Scans, 4)
}
