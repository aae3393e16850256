package retry

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// A gathering receive loop sleeps until a worker says enough prefetch places are free, or that no
// message received ahead waits any more; a wake-up lost here would hold every gathering for the whole
// gatherWindow.
func TestGatheringIsWokenOnceEnoughPlacesAreFree(t *testing.T) {
	woken := func(r *run) bool {
		select {
		case <-r.gatherWake:
			return true
		default:
			return false
		}
	}
	r := &run{prefetch: make(chan struct{}, 8), gatherWake: make(chan struct{}, 1)}
	for range 8 {
		r.prefetch <- struct{}{}
	}
	r.aheadWaiting.Store(5)
	holders := make([]*slotHolder, 5)
	for i := range holders {
		holders[i] = &slotHolder{r: r, state: holdsPrefetch, ahead: true}
	}

	r.placeFreed()
	assert.False(t, woken(r), "no gathering: nothing to wake")

	r.gatherFor.Store(3)
	holders[0].tookSlot()
	holders[1].tookSlot()
	assert.False(t, woken(r), "two places free of the three the loop waits for")
	holders[2].tookSlot()
	assert.True(t, woken(r), "the third free place wakes the loop")

	r.gatherFor.Store(4)
	holders[3].stopWaiting() // gives up waiting, keeps its place (say, the settling pool was full)
	assert.False(t, woken(r), "one message received ahead still waits")
	holders[4].stopWaiting()
	assert.True(t, woken(r), "the last message received ahead stopped waiting: the gathering ends")

	r.gatherFor.Store(0)
	holders[3].done()
	assert.False(t, woken(r), "no gathering any more")
}
