package retry

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countingRenewer counts renewal calls.
type countingRenewer struct {
	nopSettlerInternal
	renewed chan *azservicebus.ReceivedMessage
}

func (c *countingRenewer) RenewMessageLock(_ context.Context, m *azservicebus.ReceivedMessage, _ *azservicebus.RenewMessageLockOptions) error {
	c.renewed <- m
	return nil
}

type nopSettlerInternal struct{}

func (nopSettlerInternal) CompleteMessage(context.Context, *azservicebus.ReceivedMessage, *azservicebus.CompleteMessageOptions) error {
	return nil
}

func (nopSettlerInternal) DeadLetterMessage(context.Context, *azservicebus.ReceivedMessage, *azservicebus.DeadLetterOptions) error {
	return nil
}

func (nopSettlerInternal) RenewMessageLock(context.Context, *azservicebus.ReceivedMessage, *azservicebus.RenewMessageLockOptions) error {
	return nil
}

// keeper returns a delivery whose lock, received now, the processor p keeps.
func keeper(p *Processor, settler Settler, id string, lock time.Duration, now time.Time) *delivery {
	until := now.Add(lock)
	d := &delivery{msg: &azservicebus.ReceivedMessage{MessageID: id, LockedUntil: &until}, route: route{settler: settler}}
	p.keepLock(d, context.Background(), now)
	return d
}

// One schedule serves locks of different durations, entered out of the order they come due: each is
// renewed at its own time, and a lock stopped before its time is never renewed. It runs in a synctest
// bubble on the system clock: a mock clock's Add fires the renewals in goroutines of their own that a
// loaded machine may run only after the next Add, when the lock they were to renew has run out.
func TestRenewalScheduleKeepsEveryLocksOwnTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, err := (&Options{}).resolve()
		require.NoError(t, err)
		p := newProcessor(nil, nil, cfg)
		rn := &countingRenewer{renewed: make(chan *azservicebus.ReceivedMessage, 16)}
		start := time.Now()
		long := keeper(p, rn, "long", time.Minute, start)       // renewed every 30 s
		short := keeper(p, rn, "short", 10*time.Second, start)  // every 5 s
		gone := keeper(p, rn, "stopped", 10*time.Second, start) // stopped before its time
		gone.lock.stop()
		renewed := func(d time.Duration) []string {
			time.Sleep(d)
			synctest.Wait()
			var ids []string
			for len(rn.renewed) > 0 {
				ids = append(ids, (<-rn.renewed).MessageID)
			}
			return ids
		}

		assert.Equal(t, []string{"short"}, renewed(5*time.Second))
		assert.Equal(t, []string{"short"}, renewed(5*time.Second), "renewed again, an interval after its renewal")
		got := renewed(20 * time.Second)
		assert.Contains(t, got, "long")
		assert.Contains(t, got, "short")
		assert.NotContains(t, got, "stopped")
		short.lock.stop()
		long.lock.stop()
		p.renewals.mu.Lock()
		defer p.renewals.mu.Unlock()
		assert.Nil(t, p.renewals.head, "stopped locks leave the schedule")
	})
}

// On an injected clock a timer is a goroutine waiting on After, so an empty schedule must not keep one.
func TestEmptyScheduleOnAnInjectedClockHoldsNoTimer(t *testing.T) {
	mock := clock.NewMock()
	cfg, err := (&Options{Clock: mock}).resolve()
	require.NoError(t, err)
	p := newProcessor(nil, nil, cfg)
	d := keeper(p, nopSettlerInternal{}, "one", time.Minute, mock.Now())
	p.renewals.mu.Lock()
	assert.NotNil(t, p.renewals.timer, "a listed lock has its renewal timer")
	p.renewals.mu.Unlock()
	d.lock.stop()
	p.renewals.mu.Lock()
	defer p.renewals.mu.Unlock()
	assert.Nil(t, p.renewals.head)
	assert.Nil(t, p.renewals.timer, "an empty schedule on an injected clock holds no timer (and no goroutine)")
}

// A firing that was already on its way when its timer was replaced does nothing, so that only one timer
// is ever live.
func TestALateFiringOfAReplacedTimerDoesNothing(t *testing.T) {
	mock := clock.NewMock()
	s := &renewals{clk: mock}
	lk := &lockKeeper{}
	s.add(lk, mock.Now().Add(time.Minute), true)
	s.mu.Lock()
	old := s.gen
	s.mu.Unlock()
	s.add(&lockKeeper{}, mock.Now().Add(time.Second), true) // earlier: the timer is replaced
	s.mu.Lock()
	live, gen := s.timer, s.gen
	s.mu.Unlock()
	require.NotEqual(t, old, gen)
	s.fire(old) // the replaced timer's firing, on its way before the replacement
	s.mu.Lock()
	defer s.mu.Unlock()
	assert.Equal(t, gen, s.gen, "no new timer was armed")
	assert.Same(t, live, s.timer, "the live timer is left as it was")
	assert.True(t, lk.listed)
	live.Stop()
}

// abandon ends every listed lock's calls in flight, the republish included, whether the lock renews or
// not; a call that starts once the settle base has ended is ended at once. The lock itself is not
// ended by it: its end comes from the settle base (ended).
func TestAbandonEndsTheCallsOfEveryListedLock(t *testing.T) {
	mock := clock.NewMock()
	s := &renewals{clk: mock}
	base, abandon := context.WithCancel(context.Background())
	renewing, quiet := &lockKeeper{base: base}, &lockKeeper{base: base}
	s.add(renewing, mock.Now().Add(time.Minute), true)
	s.add(quiet, time.Time{}, false)
	settleCtx, cancelSettle := context.WithCancel(context.Background())
	publishCtx, cancelPublish := context.WithCancel(context.Background())
	renewing.follow(&renewing.settle, cancelSettle)
	quiet.followPublish(cancelPublish)
	s.abandon()
	assert.NoError(t, settleCtx.Err(), "nothing is ended while the settle base lives (a late abandon must not reach another Run's locks)")
	assert.NoError(t, publishCtx.Err())
	abandon()
	s.abandon()
	assert.Error(t, settleCtx.Err(), "the lock-bound call of a renewing lock")
	assert.Error(t, publishCtx.Err(), "the republish of a lock listed without renewal")
	assert.True(t, quiet.ended(), "over with the settle base")
	late, cancelLate := context.WithCancel(context.Background())
	quiet.followPublish(cancelLate)
	assert.Error(t, late.Err(), "a republish that starts after the settle base ended is ended at once")
	s.remove(renewing)
	s.remove(quiet)
	assert.Nil(t, s.timer, "an empty schedule on an injected clock holds no timer")
}

// A lock listed without renewal is never renewed: a firing passes it by.
func TestALockListedWithoutRenewalIsNotRenewed(t *testing.T) {
	mock := clock.NewMock()
	s := &renewals{clk: mock}
	quiet := &lockKeeper{base: context.Background()}
	s.add(quiet, time.Time{}, false)
	// Due in a second, not now: a timer due now may fire on its own before the test stops it (the
	// mock's After(0) fires at once), which left s.timer nil here now and then.
	s.add(&lockKeeper{base: context.Background(), stopped: true}, mock.Now().Add(time.Second), true)
	s.mu.Lock()
	armed, gen := s.timer, s.gen
	s.mu.Unlock()
	armed.Stop() // fired by hand below
	mock.Add(time.Second)
	s.fire(gen)
	s.mu.Lock()
	defer s.mu.Unlock()
	assert.True(t, quiet.listed, "still listed, for abandon")
	assert.Same(t, quiet, s.head)
	assert.Nil(t, quiet.next, "the due renewing lock left the list for its renewal")
}
