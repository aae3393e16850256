package retry

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// size is how many deliveries the registry holds.
func (fs *flights) size() int {
	n := 0
	for i := range fs.shards {
		n += len(fs.shards[i].byKey)
	}
	return n
}

// enterNew registers a new flight for key.
func enterNew(fs *flights, key flightKey, lk *lockKeeper, now time.Time) (f, prior *flight) {
	f = &flight{}
	return f, fs.enter(f, key, lk, now)
}

func testKeeper() *lockKeeper {
	lk := &lockKeeper{}
	lk.base = context.Background()
	return lk
}

// Remembered outcomes are forgotten after their time and beyond the bound, so the memory of a
// processor stays bounded whatever the traffic.
func TestRememberedOutcomesAreBounded(t *testing.T) {
	var fs flights
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range maxRememberedOutcomes + 10 {
		f, prior := enterNew(&fs, flightKey{seq: int64(i)}, testKeeper(), now)
		require.Nil(t, prior)
		f.setDecision(&decision{kind: decideComplete})
		fs.leave(f, true, now, time.Minute)
	}
	assert.Equal(t, maxRememberedOutcomes, fs.size(), "the oldest beyond the bound are forgotten")
	_, prior := enterNew(&fs, flightKey{seq: 0}, testKeeper(), now)
	assert.Nil(t, prior, "the oldest was dropped")
	_, prior = enterNew(&fs, flightKey{seq: maxRememberedOutcomes + 9}, testKeeper(), now)
	require.NotNil(t, prior, "a recent one is remembered")
	assert.Equal(t, decideComplete, prior.decision().kind)

	// After their time, all are forgotten at the next enter into their shard.
	for i := range flightShards {
		enterNew(&fs, flightKey{seq: int64(-1 - i)}, testKeeper(), now.Add(2*time.Minute))
	}
	assert.LessOrEqual(t, fs.size(), flightShards+2, "expired outcomes forgotten")
}

// A settled delivery, or one without a decision, leaves nothing behind.
func TestSettledDeliveriesAreForgotten(t *testing.T) {
	var fs flights
	now := time.Now()
	f, _ := enterNew(&fs, flightKey{seq: 1}, testKeeper(), now)
	f.setDecision(&decision{kind: decideComplete})
	fs.leave(f, false, now, time.Minute)
	g, _ := enterNew(&fs, flightKey{seq: 2}, testKeeper(), now)
	fs.leave(g, true, now, time.Minute) // unsettled but undecided: the attempt must run again
	assert.Zero(t, fs.size())
	select {
	case <-f.finished():
	default:
		t.Fatal("done not closed")
	}
}

// Sequence numbers in a stride (a subscription taking every 16th message of a topic) spread over the
// shards, so no shard's share of the bound is spent by itself.
func TestFlightShardsSpreadStrides(t *testing.T) {
	var fs flights
	for _, stride := range []int64{1, 2, 16, 64, 1000} {
		counts := map[*flightShard]int{}
		for i := range int64(1600) {
			counts[fs.shard(flightKey{seq: 1 + i*stride})]++
		}
		assert.Len(t, counts, flightShards, "stride %d", stride)
		for _, n := range counts {
			assert.LessOrEqual(t, n, 2*1600/flightShards, "stride %d", stride)
		}
	}
}
