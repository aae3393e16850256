package retry

import (
	"context"
	"sync"
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
	return &lockKeeper{base: context.Background()}
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

// remembers reports whether the registry holds an outcome for key.
func (fs *flights) remembers(key flightKey) bool {
	sh := fs.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	f := sh.byKey[key]
	return f != nil && f.decision() != nil
}

// rememberOutcome runs one delivery of key whose outcome is decided and left unsettled.
func rememberOutcome(fs *flights, key flightKey, now time.Time) {
	f, _ := enterNew(fs, key, testKeeper(), now)
	f.setDecision(&decision{kind: decideComplete})
	fs.leave(f, true, now, time.Hour)
}

// The promised number of outcomes is remembered whatever the sequence numbers: 10,000 outstanding
// outcomes that all fall into one shard, or spread as they come, are all still there at the bound.
func TestRememberedOutcomesHoldAtTheBound(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	oneShard := func() []flightKey {
		var probe flights
		target := probe.shard(flightKey{seq: 0})
		keys := make([]flightKey, 0, maxRememberedOutcomes)
		for seq := int64(0); len(keys) < maxRememberedOutcomes; seq++ {
			if probe.shard(flightKey{seq: seq}) == target {
				keys = append(keys, flightKey{seq: seq})
			}
		}
		return keys
	}
	sequential := func() []flightKey {
		keys := make([]flightKey, maxRememberedOutcomes)
		for i := range keys {
			keys[i] = flightKey{seq: int64(1_000_000 + 7*i)}
		}
		return keys
	}
	for name, keys := range map[string][]flightKey{"all in one shard": oneShard(), "a stride of 7": sequential()} {
		t.Run(name, func(t *testing.T) {
			var fs flights
			for _, k := range keys {
				rememberOutcome(&fs, k, now)
			}
			forgotten := 0
			for _, k := range keys {
				if !fs.remembers(k) {
					forgotten++
				}
			}
			assert.Zero(t, forgotten, "outcomes forgotten at exactly the promised number")

			// One more than the bound forgets exactly one, the oldest.
			rememberOutcome(&fs, flightKey{seq: -1}, now)
			assert.False(t, fs.remembers(keys[0]), "the oldest is forgotten beyond the bound")
			assert.True(t, fs.remembers(keys[1]))
			assert.True(t, fs.remembers(flightKey{seq: -1}))
			assert.Equal(t, maxRememberedOutcomes, fs.size())
		})
	}
}

// An outcome that a redelivery inherited and settled is finished: it no longer counts against the
// bound, so a live outcome outlasts any number of such messages while only a few are outstanding.
func TestFinishedOutcomesLeaveTheCount(t *testing.T) {
	var fs flights
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	live := flightKey{seq: 1}
	rememberOutcome(&fs, live, now)
	for i := range 2*maxRememberedOutcomes + 10 {
		key := flightKey{seq: int64(100 + i)}
		rememberOutcome(&fs, key, now) // its complete failed: remembered for the redelivery
		redelivery, prior := enterNew(&fs, key, testKeeper(), now)
		require.NotNil(t, prior)
		redelivery.setDecision(prior.decision()) // inherited
		fs.leave(redelivery, false, now, time.Hour)
	}
	assert.True(t, fs.remembers(live), "the live outcome is forgotten although at most two were outstanding")
	assert.Equal(t, 1, fs.size())
	assert.Equal(t, 1, fs.mem.len(), "finished outcomes still counted")
}

// Deliveries on many shards at once remember, take over and forget outcomes without losing count.
func TestOutcomeMemoryUnderConcurrency(t *testing.T) {
	var fs flights
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				key := flightKey{seq: int64(w*100_000 + i)}
				rememberOutcome(&fs, key, now)
				redelivery, prior := enterNew(&fs, key, testKeeper(), now)
				if prior == nil {
					t.Error("outcome forgotten")
					return
				}
				redelivery.setDecision(prior.decision())
				fs.leave(redelivery, false, now, time.Hour)
			}
		})
	}
	wg.Wait()
	assert.Zero(t, fs.size())
	assert.Zero(t, fs.mem.len())
}
