package retry

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// Bounds on the lock duration the processor infers when Options.LockDuration is not set. Service Bus
// grants between a few seconds and 5 minutes; an estimate outside that range means the client's clock
// disagrees with the broker's, and the bound keeps the renewal schedule sane (see grantedLockDuration).
const (
	minInferredLock = time.Second
	maxInferredLock = 5 * time.Minute
	// defaultInferredLock is used when a message carries no LockedUntil at all: the Service Bus default.
	defaultInferredLock = time.Minute
	// minRenewWait keeps a failing renewal from spinning.
	minRenewWait = 100 * time.Millisecond
)

// lockKeeper follows one delivery's lock on the local clock, from receive until the message is settled.
//
// Renewal timing never compares the broker's LockedUntil with the local clock, because the two clocks
// need not agree: a client clock behind the broker's by more than the lock would renew only after the
// lock expired, and one ahead would take a slow renewal for a lost lock. Instead the keeper knows the
// lock duration the broker grants (Options.LockDuration, or once at receive LockedUntil minus the local
// time, bounded) and counts it on the local clock from the moment each lock was taken or renewed: the
// lock is held until start + duration, and renewed every duration/2 (or LockRenewInterval).
//
// The lock ends once: lost (cause [ErrLockLost]: the broker said the lock is gone, renewals kept failing
// until the local deadline, or a redelivery of the same message proved it), or settled (stop). Losing it
// cancels the running handler's context and the lock-bound call in flight. The keeper is not a context,
// so that following a lock costs no registration with the contexts shared by every message.
type lockKeeper struct {
	duration time.Duration
	interval time.Duration
	base     context.Context // the processor's settle base: the lock is over when it ends too

	slowSettle atomic.Bool // a lock-bound settle succeeded only after the SDK retried it
	over       atomic.Bool // ended: lost or settled

	mu           sync.Mutex
	deadline     time.Time               // local time at which the lock runs out unless renewed
	cause        error                   // why the lock ended: ErrLockLost or errSettled
	done         chan struct{}           // closed when the lock ends; made on demand (Done)
	onLose       context.CancelCauseFunc // cancels the running handler's context, while it runs
	onLoseSettle *settleCall             // the lock-bound settle call in flight, ended by lose
	onLoseRenew  context.CancelFunc      // cancels the renewal call in flight

	// Renewal state, guarded by the renewer's mutex.
	renew    *renewer
	settler  Settler
	msg      *azservicebus.ReceivedMessage
	env      *Envelope
	next     time.Time     // when the renewer acts on this lock next
	index    int           // position in the renewer's heap, -1 when not in it
	inFlight chan struct{} // closed when the renewal call in flight returns; nil if none
	stopped  bool
}

// keepLock starts following msg's lock, received at now, with lk (a zero lockKeeper). base is the context the lock lives under:
// the processor's settle base, detached from the handler's caller so that a caller cancelling its
// context does not stop the renewal of a message still being worked on. With renewal enabled, the
// processor's renewer renews the lock until stop is called.
func (p *Processor) keepLock(lk *lockKeeper, base context.Context, settler Settler, msg *azservicebus.ReceivedMessage, env *Envelope, now time.Time) {
	cfg := p.cfg
	d := grantedLockDuration(cfg.lockDuration, msg, now)
	lk.duration, lk.interval, lk.deadline, lk.index, lk.base = d, cfg.lockRenewInterval, now.Add(d), -1, base
	switch {
	case lk.interval <= 0:
		lk.interval = max(d/2, minRenewWait)
	case lk.interval > d*2/3:
		// An interval that leaves less than a third of the lock for the renewal call (or exceeds the lock,
		// which would renew only after the expiry) is cut to two thirds of it.
		lk.interval = max(d*2/3, minRenewWait)
	}
	if cfg.lockRenewal {
		lk.settler, lk.msg, lk.env = settler, msg, env
		p.renewer().add(lk, now.Add(lk.interval))
	}
}

// grantedLockDuration is the lock duration the broker grants: the configured one if known, else the
// lock's remaining time at receive, bounded to what Service Bus can grant.
func grantedLockDuration(configured time.Duration, msg *azservicebus.ReceivedMessage, now time.Time) time.Duration {
	if configured > 0 {
		return configured
	}
	if msg.LockedUntil == nil {
		return defaultInferredLock
	}
	return min(max(msg.LockedUntil.Sub(now), minInferredLock), maxInferredLock)
}

// stop ends the renewal, waiting for a renewal call in flight (the SDK writes msg.LockedUntil when one
// succeeds, and the message is the caller's again once Process returns). It does not release the lock.
func (lk *lockKeeper) stop() {
	if lk.renew != nil {
		if wait := lk.renew.remove(lk); wait != nil {
			lk.end(errSettled) // aborts the call in flight
			<-wait
		}
	}
	lk.end(errSettled)
}

// errSettled ends a lock once its message has been handled; it is not a lost lock.
var errSettled = errors.New("retry: message settled")

// end ends the lock with cause, once, and cancels what depends on it.
func (lk *lockKeeper) end(cause error) {
	lk.mu.Lock()
	if lk.cause != nil {
		lk.mu.Unlock()
		return
	}
	lk.cause = cause
	lk.over.Store(true)
	if lk.done != nil {
		close(lk.done)
	}
	cancelHandler, cancelSettle, cancelRenew := lk.onLose, lk.onLoseSettle, lk.onLoseRenew
	lk.mu.Unlock()
	if cancelHandler != nil {
		cancelHandler(cause)
	}
	if cancelSettle != nil {
		cancelSettle.end(context.Canceled)
	}
	if cancelRenew != nil {
		cancelRenew()
	}
}

// lose records that the lock is gone and cancels the handler's context, if a handler runs.
func (lk *lockKeeper) lose(cause error) { lk.end(cause) }

// ended reports whether the lock is over: lost, settled, or its settle base ended.
func (lk *lockKeeper) ended() bool { return lk.over.Load() || lk.base.Err() != nil }

// why is the reason the lock is over (nil while it is not).
func (lk *lockKeeper) why() error {
	lk.mu.Lock()
	cause := lk.cause
	lk.mu.Unlock()
	if cause == nil && lk.base.Err() != nil {
		return context.Cause(lk.base)
	}
	return cause
}

// lost reports whether the lock was lost (rather than settled or abandoned by a shutdown).
func (lk *lockKeeper) lost() bool {
	return lk.over.Load() && errors.Is(lk.why(), ErrLockLost)
}

// Done returns a channel that is closed when the lock is lost or settled.
func (lk *lockKeeper) Done() <-chan struct{} {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	if lk.done == nil {
		lk.done = make(chan struct{})
		if lk.cause != nil {
			close(lk.done)
		}
	}
	return lk.done
}

// watchHandler makes lose cancel the handler's context (cancel) until unwatchHandler is called, and
// cancelHandler too: the consumer's worker calls it when its context (worker, if not nil) ends. A lock
// lost, or a worker context ended, before the handler starts cancels it at once.
func (lk *lockKeeper) watchHandler(cancel context.CancelCauseFunc, worker context.Context) {
	lk.mu.Lock()
	lk.onLose = cancel
	cause := lk.cause
	lk.mu.Unlock()
	if cause == nil && lk.base.Err() != nil {
		cause = context.Cause(lk.base)
	}
	if cause == nil && worker != nil && worker.Err() != nil {
		cause = context.Cause(worker)
	}
	if cause != nil {
		cancel(cause)
	}
}

// cancelHandler cancels the handler's context with cause, if a handler runs, without ending the lock.
func (lk *lockKeeper) cancelHandler(cause error) {
	lk.mu.Lock()
	cancel := lk.onLose
	lk.mu.Unlock()
	if cancel != nil {
		cancel(cause)
	}
}

// unwatchHandler undoes watchHandler.
func (lk *lockKeeper) unwatchHandler() {
	lk.mu.Lock()
	lk.onLose = nil
	lk.mu.Unlock()
}

// alive reports whether the lock is still held at now, as far as the client knows.
func (lk *lockKeeper) alive(now time.Time) bool {
	if lk.ended() {
		return false
	}
	lk.mu.Lock()
	deadline := lk.deadline
	lk.mu.Unlock()
	if !now.Before(deadline) {
		lk.lose(ErrLockLost)
		return false
	}
	return true
}

// remaining is the time from now until the lock runs out on the local clock.
func (lk *lockKeeper) remaining(now time.Time) time.Duration {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	return lk.deadline.Sub(now)
}

// beginSettle starts call, the context of one lock-bound settle call made at now, and returns how long
// it may take: the timeout, cut to the lock's remaining time (a settle after the lock expired can only
// fail, and waiting for it holds up the consumer). Losing the lock ends the call. values is the settle
// base without its cancellation: a shutdown that gives up stops new settle calls (alive) and closes the
// connection under the one in flight. Call endSettle when the call returns.
func (lk *lockKeeper) beginSettle(call *settleCall, values context.Context, timeout time.Duration, now time.Time, realNow bool) time.Duration {
	lk.mu.Lock()
	d := max(min(timeout, lk.deadline.Sub(now)), time.Millisecond)
	lk.onLoseSettle = call
	over := lk.cause != nil
	lk.mu.Unlock()
	if !realNow {
		now = time.Now() // the deadline the SDK sees is on the real clock, as a context's always is
	}
	call.values, call.deadline = values, now.Add(d)
	if over {
		call.end(context.Canceled)
	}
	return d
}

// endSettle stops lose from cancelling the settle call that has returned.
func (lk *lockKeeper) endSettle() {
	lk.mu.Lock()
	lk.onLoseSettle = nil
	lk.mu.Unlock()
}

// renewer renews the locks of all of a processor's messages from one goroutine, which runs only while
// some lock is held: a heap ordered by the next renewal, and one timer for the earliest. A message whose
// handler and settle finish within half the lock costs a heap insert and removal, no goroutine and no
// timer; only a due renewal starts a goroutine, for its one broker call, so a slow renewal never delays
// another.
//
// On the real clock the schedule is one runtime timer (time.AfterFunc), armed for the earliest renewal
// (and left to fire once more, finding nothing due, when that lock leaves first), so no goroutine waits
// at all. On an injected clock, which offers only
// After, one goroutine waits instead, and exits when no lock is held.
type renewer struct {
	p       *Processor
	mu      sync.Mutex
	heap    []*lockKeeper
	wake    chan struct{} // signalled when the earliest renewal moved earlier
	running bool

	onTimer bool        // the real clock: schedule with timer, not with a goroutine
	timer   *time.Timer // armed for armedAt, the earliest renewal
	armedAt time.Time
}

// renewer returns the processor's renewer, creating it on first use.
func (p *Processor) renewer() *renewer {
	p.renewOnce.Do(func() {
		_, real := p.cfg.clock.(realClock)
		p.renewals = &renewer{p: p, wake: make(chan struct{}, 1), onTimer: real}
	})
	return p.renewals
}

// armLocked points the timer at the earliest renewal, unless it is already armed for that time or an
// earlier one. The timer is never moved later or stopped when locks leave the schedule: messages are
// mostly settled in the order they came, so the earliest renewal is the one removed most often, and
// moving the timer each time would cost a runtime timer update per message. An early firing finds
// nothing due and re-arms for what is earliest then: at most one spare wake-up per renewal interval.
func (r *renewer) armLocked() {
	if len(r.heap) == 0 {
		return
	}
	next := r.heap[0].next
	if !r.armedAt.IsZero() && !next.Before(r.armedAt) {
		return
	}
	r.armedAt = next
	wait := max(time.Until(next), 0)
	if r.timer == nil {
		r.timer = time.AfterFunc(wait, r.fire)
		return
	}
	r.timer.Reset(wait)
}

// fire starts the renewals that are due and re-arms the timer.
func (r *renewer) fire() {
	r.mu.Lock()
	r.armedAt = time.Time{}
	var due []*lockKeeper
	now := r.p.cfg.clock.Now()
	for len(r.heap) > 0 && !r.heap[0].next.After(now) {
		top := r.heap[0]
		r.removeLocked(0)
		if top.ended() {
			continue
		}
		due = append(due, top)
	}
	type started struct {
		lk   *lockKeeper
		done chan struct{}
	}
	var start []started
	for _, lk := range due {
		if !lk.alive(now) {
			r.p.log(lk.base, slog.LevelWarn, "message lock expired before it could be renewed", lk.msg, *lk.env)
			continue
		}
		done := make(chan struct{})
		lk.inFlight = done
		start = append(start, started{lk, done})
	}
	r.armLocked()
	r.mu.Unlock()
	for _, s := range start {
		go r.renewOnce(s.lk, s.done)
	}
}

// add schedules lk's first renewal at next.
func (r *renewer) add(lk *lockKeeper, next time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	lk.renew = r
	lk.next = next
	r.pushLocked(lk)
}

// remove takes lk out of the schedule. It returns a channel to wait on when a renewal call is in flight.
func (r *renewer) remove(lk *lockKeeper) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	lk.stopped = true
	if lk.index >= 0 {
		wasFirst := lk.index == 0
		r.removeLocked(lk.index)
		if wasFirst && !r.onTimer {
			r.poke() // the loop waits for this lock's time: let it wait for the next one, or exit
		}
	}
	return lk.inFlight
}

// poke wakes the loop to look at the heap again.
func (r *renewer) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// loop waits for the earliest due renewal and starts it; it returns when no lock is left.
func (r *renewer) loop() {
	clk := r.p.cfg.clock
	for {
		r.mu.Lock()
		if len(r.heap) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		top := r.heap[0]
		now := clk.Now()
		if wait := top.next.Sub(now); wait > 0 {
			r.mu.Unlock()
			select {
			case <-clk.After(wait):
			case <-r.wake:
			}
			continue
		}
		r.removeLocked(0)
		if top.ended() {
			r.mu.Unlock()
			continue // lost or settled meanwhile
		}
		if !top.alive(now) {
			r.mu.Unlock()
			r.p.log(top.base, slog.LevelWarn, "message lock expired before it could be renewed", top.msg, *top.env)
			continue
		}
		done := make(chan struct{})
		top.inFlight = done
		r.mu.Unlock()
		go r.renewOnce(top, done)
	}
}

// renewOnce makes one renewal call for lk and schedules the next.
func (r *renewer) renewOnce(lk *lockKeeper, done chan struct{}) {
	p := r.p
	sent := p.cfg.clock.Now()
	rctx, cancel := context.WithTimeout(lk.base, max(min(p.cfg.settleTimeout, lk.remaining(sent)), time.Millisecond))
	lk.mu.Lock()
	lk.onLoseRenew = cancel
	over := lk.cause != nil
	lk.mu.Unlock()
	if over {
		cancel()
	}
	err := lk.settler.RenewMessageLock(rctx, lk.msg, nil)
	lk.mu.Lock()
	lk.onLoseRenew = nil
	lk.mu.Unlock()
	cancel()

	r.mu.Lock()
	defer r.mu.Unlock()
	lk.inFlight = nil
	close(done)
	if lk.stopped || lk.ended() {
		return // settled (or lost) while the renewal was in flight
	}
	switch code, ok := sdkCode(err); {
	case err == nil:
		lk.mu.Lock()
		lk.deadline = sent.Add(lk.duration)
		lk.mu.Unlock()
		lk.next = sent.Add(lk.interval)
	case ok && code == azservicebus.CodeLockLost:
		p.log(lk.base, slog.LevelWarn, "lock renewal failed: lock lost", lk.msg, *lk.env, errAttr(err))
		lk.lose(ErrLockLost)
		return
	default:
		p.log(lk.base, slog.LevelWarn, "lock renewal failed; will try again", lk.msg, *lk.env, errAttr(err))
		now := p.cfg.clock.Now()
		rem := lk.remaining(now)
		lk.next = now.Add(min(max(rem/2, minRenewWait), max(rem, 0)))
	}
	r.pushLocked(lk)
}

// pushLocked inserts lk into the heap and wakes the loop if lk is now the earliest, starting the loop
// if it is not running (it exits whenever the heap is empty, a renewal in flight included).
func (r *renewer) pushLocked(lk *lockKeeper) {
	lk.index = len(r.heap)
	r.heap = append(r.heap, lk)
	r.up(lk.index)
	switch {
	case r.onTimer:
		if lk.index == 0 {
			r.armLocked()
		}
	case !r.running:
		r.running = true
		go r.loop()
	case lk.index == 0:
		r.poke()
	}
}

// removeLocked removes the heap entry at i.
func (r *renewer) removeLocked(i int) {
	last := len(r.heap) - 1
	removed := r.heap[i]
	if i != last {
		r.heap[i] = r.heap[last]
		r.heap[i].index = i
	}
	r.heap[last] = nil
	r.heap = r.heap[:last]
	removed.index = -1
	if i < len(r.heap) {
		r.down(i)
		r.up(i)
	}
}

func (r *renewer) less(i, j int) bool { return r.heap[i].next.Before(r.heap[j].next) }

func (r *renewer) swap(i, j int) {
	r.heap[i], r.heap[j] = r.heap[j], r.heap[i]
	r.heap[i].index = i
	r.heap[j].index = j
}

func (r *renewer) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !r.less(i, parent) {
			return
		}
		r.swap(i, parent)
		i = parent
	}
}

func (r *renewer) down(i int) {
	n := len(r.heap)
	for {
		smallest := i
		if l := 2*i + 1; l < n && r.less(l, smallest) {
			smallest = l
		}
		if rt := 2*i + 2; rt < n && r.less(rt, smallest) {
			smallest = rt
		}
		if smallest == i {
			return
		}
		r.swap(i, smallest)
		i = smallest
	}
}
