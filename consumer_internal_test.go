package retry

import (
	"context"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// Two receive loops gather at once (a connection with several sources shares the prefetch places):
// each must end its gathering once it has its places, not sleep out the window because the other
// owns the wake-up.
func TestTwoGatheringsEndWhenTheirPlacesAreFree(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &run{prefetch: make(chan struct{}, 16), gatherWake: make(chan struct{}, 1)}
		holders := make([]*slotHolder, 16) // every place held by a message received ahead, waiting
		for i := range holders {
			r.prefetch <- struct{}{}
			holders[i] = &slotHolder{r: r, state: holdsPrefetch, ahead: true}
		}
		r.aheadWaiting.Store(16)
		const batch = 8 // a gathering ends with 4 places
		start := time.Now()
		ended := make(chan time.Duration, 2)
		for range 2 {
			go func() {
				timer := time.NewTimer(gatherWindow)
				defer timer.Stop()
				assert.GreaterOrEqual(t, r.gatherPlaces(t.Context(), timer.C, 0, 0, batch), batch/2)
				ended <- time.Since(start)
			}()
		}
		for _, s := range holders[:8] {
			<-time.After(100 * time.Microsecond) // the bubble's clock: one message starts every 100 µs
			s.tookSlot()
		}
		for range 2 {
			assert.Less(t, <-ended, gatherWindow, "a gathering slept out the whole window")
		}
	})
}

// A handler that starts just as its worker's context ends (the worker's AfterFunc found no handler to
// cancel) must still get a cancelled context, from watchHandler's look at the worker's context.
func TestHandlerStartingAsItsWorkerEndsIsCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, err := NewProcessor(nopSender{}, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
			return context.Cause(ctx)
		}, &Options{Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		wctx, cancel := context.WithCancel(context.Background())
		sl, unfollow := newSlotHolder(&run{}, wctx)
		defer unfollow()
		cancel()
		synctest.Wait() // the worker's AfterFunc has run, with no handler to cancel
		lk := &lockKeeper{base: context.Background()}
		herr, lost := p.runHandler(wctx, lk, sl, &azservicebus.ReceivedMessage{MessageID: "m"}, &Envelope{Attempt: 1})
		assert.ErrorIs(t, herr, context.Canceled)
		assert.False(t, lost)
	})
}

type nopSender struct{}

func (nopSender) ScheduleMessages(context.Context, []*azservicebus.Message, time.Time, *azservicebus.ScheduleMessagesOptions) ([]int64, error) {
	return nil, nil
}

func (nopSender) Close(context.Context) error { return nil }

// A message received ahead whose lock is already over (or whose worker is stopping) does not take a
// free handler slot: its handler would run on a lock known to be lost.
func TestReacquireRefusesALockAlreadyOver(t *testing.T) {
	for _, tc := range []struct {
		name      string
		lost, end bool
		want      bool
	}{
		{"lock held", false, false, true},
		{"lock lost", true, false, false},
		{"worker context ended", false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &run{slots: make(chan struct{}, 1), prefetch: make(chan struct{}, 1), gatherWake: make(chan struct{}, 1)}
			r.prefetch <- struct{}{}
			s := &slotHolder{r: r, state: holdsPrefetch}
			lk := &lockKeeper{base: context.Background()}
			if tc.lost {
				lk.lose(ErrLockLost)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.end {
				cancel()
			}
			ok, _ := s.reacquire(ctx, lk)
			assert.Equal(t, tc.want, ok)
			assert.Equal(t, tc.want, len(r.slots) == 1, "the handler slot is taken only when it may run")
		})
	}
}
