package retry

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func testSlots(concurrency, prefetch int) *slots {
	return newSlots(&config{maxConcurrency: concurrency, prefetch: prefetch})
}

// A message received ahead whose lock is already over (or whose context has ended, or whose consumer
// stopped receiving) does not take a free handler slot: its handler would run on a lock known to be
// lost.
func TestAcquireRefusesWhatMayNotRun(t *testing.T) {
	for _, tc := range []struct {
		name                string
		lost, end, stopping bool
		want                bool
	}{
		{"lock held", false, false, false, true},
		{"lock lost", true, false, false, false},
		{"context ended", false, true, false, false},
		{"receiving stopped", false, false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 50 { // a select among ready cases picks at random: try it often
				s := testSlots(1, 1)
				s.prefetch <- struct{}{}
				h := &place{s: s, state: placePrefetch}
				lost := make(chan struct{})
				if tc.lost {
					close(lost)
				}
				if tc.stopping {
					close(s.stopping)
				}
				ctx, cancel := context.WithCancel(context.Background())
				if tc.end {
					cancel()
				}
				require.Equal(t, tc.want, h.acquire(ctx, chanDone(lost)))
				cancel()
				assert.Equal(t, tc.want, len(s.handler) == 1, "the handler slot is taken only when it may run")
				assert.Equal(t, tc.want, len(s.prefetch) == 0, "the place is given back once the slot is taken")
				assert.Zero(t, s.ahead.Load(), "no message counts as waiting once acquire returned")
				h.done()
				assert.Zero(t, len(s.handler)+len(s.prefetch)+len(s.settling), "done gives everything back")
			}
		})
	}
}

// release trades the handler slot for a settling place while one is free, and keeps it when none is;
// acquire then gives the settling place back before it waits, so no cycle of waits can form.
func TestReleaseTradesForASettlingPlace(t *testing.T) {
	s := testSlots(1, 0)
	s.handler <- struct{}{}
	h := &place{s: s, state: placeHandler}
	h.release()
	assert.Equal(t, placeSettling, h.state)
	assert.Len(t, s.handler, 0, "the handler slot is free for the next handler")
	assert.Len(t, s.settling, 1)

	require.True(t, h.acquire(context.Background(), chanDone(nil)))
	assert.Len(t, s.settling, 0, "the settling place is given back before the wait")
	assert.Len(t, s.handler, 1)

	for range cap(s.settling) {
		s.settling <- struct{}{}
	}
	h.release()
	assert.Equal(t, placeHandler, h.state, "with no settling place free the handler slot is kept")
	assert.Len(t, s.handler, 1)
	for range cap(s.settling) {
		<-s.settling
	}
	h.done()
	assert.Zero(t, len(s.handler)+len(s.settling))
}

// A receive gathers prefetch places while messages received ahead wait, up to half a batch, and takes
// no handler slot while they do.
func TestFillLeavesHandlerSlotsToMessagesAhead(t *testing.T) {
	s := testSlots(4, 4)
	s.prefetch <- struct{}{} // the place the receive loop took first
	s.ahead.Add(1)
	gather := time.NewTimer(gatherWindow)
	gather.Stop()
	h, pf := s.fill(context.Background(), gather, 0, 1, 8)
	assert.Zero(t, h, "a message received ahead waits for a handler slot: the receive must not take it")
	assert.Equal(t, 4, pf, "every free prefetch place is taken")
	s.ahead.Add(-1)
	s.giveBack(h, pf)
	assert.Zero(t, len(s.handler)+len(s.prefetch))
}

// chanDone is a lockState that ends when ch is closed.
type chanDone chan struct{}

func (c chanDone) Done() <-chan struct{} { return c }

func (c chanDone) ended() bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// A delivery that gave its slot back while it waited for an earlier delivery of its message has not
// started its handler: once receiving has stopped it does not take a slot again.
func TestAcquireAfterWaitingRefusesOnceReceivingStopped(t *testing.T) {
	s := testSlots(1, 0)
	s.handler <- struct{}{}
	h := &place{s: s, state: placeHandler}
	h.release()
	require.Equal(t, placeSettling, h.state)
	close(s.stopping)
	assert.False(t, h.acquire(context.Background(), chanDone(nil)))
	assert.Zero(t, len(s.handler)+len(s.settling), "nothing is held")
	h.done()
}
