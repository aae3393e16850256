package retry

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/sbretry/retry/envelope"
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

// errSettled ends a lock once its message has been handled; it is not a lost lock.
var errSettled = errors.New("retry: message settled")

// lockKeeper follows one delivery's lock on the local clock, from receive until the message is settled,
// and renews it (unless Options.DisableLockRenewal) when the processor's renewal schedule finds it due.
//
// Renewal timing never compares the broker's LockedUntil with the local clock, because the two clocks
// need not agree: a client clock behind the broker's by more than the lock would renew only after the
// lock expired, and one ahead would take a slow renewal for a lost lock. Instead the keeper knows the
// lock duration the broker grants (Options.LockDuration, or once at receive LockedUntil minus the local
// time, bounded) and counts it on the local clock from the moment each lock was taken or renewed: the
// lock is held until start + duration, and renewed every duration/2 (or LockRenewInterval).
//
// The lock ends once: lost (cause [ErrLockLost]: the broker said the lock is gone, renewals kept failing
// until the local deadline, or a redelivery of the same message proved it), or settled (stop, cause
// errSettled); it is also over once the settle base has ended (a shutdown that gave up). Ending it
// cancels what depends on it: the running handler's context, the lock-bound settle call and the renewal
// call in flight. The keeper is not a context of its own, so that following a lock costs no context
// and no registration with the settle base, which every message shares.
type lockKeeper struct {
	base context.Context // the settle base
	// values is the settle base without its cancellation: what the delivery's broker calls derive from
	// (see settle.go). They are ended by the lock, their timeout and a shutdown that gives up
	// (renewals.abandon), never by registering with the settle base, which every message shares.
	values context.Context
	cfg    *config
	sched  *renewals // the processor's renewal schedule
	msg    *azservicebus.ReceivedMessage
	env    *envelope.Envelope
	rcv    Settler
	dur    time.Duration // the granted lock duration
	each   time.Duration // the renewal interval

	// A session's lock (sessionlock.go) is kept by the same keeper on the same schedule: session names
	// it in the logs, renewCall is its RenewSessionLock (nil: the message's RenewMessageLock), and
	// granted, if set, is the duration a successful renewal at now granted (0: unknown, keep dur).
	session   string
	renewCall func(ctx context.Context) error
	granted   func(now time.Time) time.Duration

	slowSettle atomic.Bool // a lock-bound settle succeeded only after the SDK retried it
	over       atomic.Bool // ended: lost or settled

	mu       sync.Mutex
	cause    error         // why the lock ended: ErrLockLost or errSettled
	done     chan struct{} // closed when the lock ends; made on demand (Done)
	deadline time.Time     // local time at which the lock runs out unless renewed
	// What ending the lock cancels: the running handler's context, the lock-bound settle call in
	// flight and the renewal call in flight (nil when none). publish is the republish of a retry copy in
	// flight, which only a shutdown that gives up ends (cancelCalls), never the lock.
	handler               context.CancelCauseFunc
	settle, call, publish context.CancelFunc
	stopped               bool           // stop was called: schedule nothing more
	calls                 sync.WaitGroup // the renewal call in flight

	// The processor's renewal schedule (renewals) lists the lock from keepLock to stop, except while a
	// renewal call is in flight; renews is set when it is listed for a renewal at due. These fields are
	// guarded by the schedule's mutex.
	due        time.Time
	renews     bool
	prev, next *lockKeeper
	listed     bool
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

// stop ends the lock as settled and the renewal with it, waiting for a renewal call in flight (the SDK
// writes msg.LockedUntil when one succeeds, and the message is the caller's again once Process returns).
// It does not release the lock at the broker.
func (lk *lockKeeper) stop() {
	lk.mu.Lock()
	lk.stopped = true
	lk.mu.Unlock()
	if lk.sched != nil {
		lk.sched.remove(lk)
	}
	lk.end(errSettled) // aborts a renewal call in flight
	lk.calls.Wait()
}

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
	handler, settle, call := lk.handler, lk.settle, lk.call
	lk.mu.Unlock()
	if handler != nil {
		handler(cause)
	}
	if settle != nil {
		settle()
	}
	if call != nil {
		call()
	}
}

// cancelCalls ends the broker calls in flight, the republish included, without ending the lock, once
// the settle base has ended (a shutdown gave up: the lock is over with it, see ended); before that it
// does nothing.
func (lk *lockKeeper) cancelCalls() {
	if lk.base.Err() == nil {
		return
	}
	lk.mu.Lock()
	settle, call, publish := lk.settle, lk.call, lk.publish
	lk.mu.Unlock()
	for _, cancel := range []context.CancelFunc{settle, call, publish} {
		if cancel != nil {
			cancel()
		}
	}
}

// lose records that the lock is gone, which cancels the handler's context and the calls in flight.
func (lk *lockKeeper) lose() { lk.end(ErrLockLost) }

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
func (lk *lockKeeper) lost() bool { return lk.over.Load() && errors.Is(lk.why(), ErrLockLost) }

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

// follow makes the end of the lock cancel *slot's function (cancel; nil stops following), and cancels it
// at once if the lock is already over, so that nothing starts uncancelled on a lock known to be gone.
func (lk *lockKeeper) follow(slot *context.CancelFunc, cancel context.CancelFunc) {
	lk.mu.Lock()
	*slot = cancel
	over := lk.cause != nil
	lk.mu.Unlock()
	if cancel != nil && (over || lk.base.Err() != nil) {
		cancel()
	}
}

// followPublish makes a shutdown that gives up cancel the republish in flight (cancel; nil stops
// following), and cancels it at once if that already happened. The lock's end does not cancel it.
func (lk *lockKeeper) followPublish(cancel context.CancelFunc) {
	lk.mu.Lock()
	lk.publish = cancel
	lk.mu.Unlock()
	if cancel != nil && lk.base.Err() != nil {
		cancel()
	}
}

// followHandler is follow for the handler's context, cancelled with the lock's cause.
func (lk *lockKeeper) followHandler(cancel context.CancelCauseFunc) {
	lk.mu.Lock()
	lk.handler = cancel
	cause := lk.cause
	lk.mu.Unlock()
	if cause == nil {
		cause = context.Cause(lk.base)
	}
	if cancel != nil && cause != nil {
		cancel(cause)
	}
}

// alive reports whether the lock is still held at now, as far as the client knows; a lock whose local
// deadline has passed is lost.
func (lk *lockKeeper) alive(now time.Time) bool {
	if lk.ended() {
		return false
	}
	if lk.remaining(now) <= 0 {
		lk.lose()
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

// callTimeout is how long a call that needs the lock may take from now: timeout, cut to the lock's
// remaining time (a settle after the lock expired can only fail, and waiting for it holds up the
// consumer), and never less than a millisecond.
func (lk *lockKeeper) callTimeout(timeout time.Duration, now time.Time) time.Duration {
	return max(min(timeout, lk.remaining(now)), time.Millisecond)
}

// renew makes one renewal call, when the schedule finds it due (which counted it in lk.calls), and
// lists the lock again for the next.
func (lk *lockKeeper) renew() {
	defer lk.calls.Done()
	lk.mu.Lock()
	stopped := lk.stopped
	lk.mu.Unlock()
	if stopped {
		return
	}

	cfg := lk.cfg
	// Whatever the call's outcome, the lock goes back on the schedule until stop takes it off: for its
	// next renewal, or, once it is over, only so that a shutdown that gives up finds its calls.
	renews := false
	var next time.Duration
	defer func() {
		lk.mu.Lock()
		if !lk.stopped {
			lk.sched.add(lk, cfg.clock.Now().Add(max(next, 0)), renews)
		}
		lk.mu.Unlock()
		// Listed again before this check: a shutdown that gave up meanwhile either found the lock on
		// the schedule (renewals.abandon) or is seen here, so its calls in flight end either way.
		if lk.base.Err() != nil {
			lk.cancelCalls()
		}
	}()
	sent := cfg.clock.Now()
	if !lk.alive(sent) {
		if lk.lost() {
			lk.log(slog.LevelWarn, slog.LevelWarn, "message lock expired before it could be renewed", "session lock lost: it ran out before a renewal succeeded; its messages go back to the session", nil)
		}
		return
	}
	rctx, cancel := context.WithTimeout(lk.base, lk.callTimeout(cfg.settleTimeout, sent))
	lk.follow(&lk.call, cancel)
	var err error
	if lk.renewCall != nil {
		err = lk.renewCall(rctx)
	} else {
		err = lk.rcv.RenewMessageLock(rctx, lk.msg, nil)
	}
	lk.follow(&lk.call, nil)
	cancel()

	switch code, ok := sdkCode(err); {
	case lk.ended():
		return // settled (or lost) while the renewal was in flight
	case err == nil:
		lk.mu.Lock()
		if lk.granted != nil {
			if g := lk.granted(sent); g > 0 {
				lk.dur, lk.each = g, cfg.renewInterval(g)
			}
		}
		lk.deadline = sent.Add(lk.dur)
		lk.mu.Unlock()
		next = lk.each - cfg.clock.Now().Sub(sent)
	case ok && code == azservicebus.CodeLockLost:
		lk.log(slog.LevelWarn, slog.LevelWarn, "lock renewal failed: lock lost", "session lock lost; its messages go back to the session", err)
		lk.lose()
		return
	default:
		lk.log(slog.LevelWarn, slog.LevelDebug, "lock renewal failed; will try again", "session lock renewal failed; trying again", err)
		rem := lk.remaining(cfg.clock.Now())
		next = min(max(rem/2, minRenewWait), max(rem, 0))
	}
	renews = true
}

// log writes one line about the lock: msgText at msgLevel with the message's identity, or, for a
// session's lock, sessionText at sessionLevel with its session id.
func (lk *lockKeeper) log(msgLevel, sessionLevel slog.Level, msgText, sessionText string, err error) {
	var attrs []slog.Attr
	if err != nil {
		attrs = append(attrs, errAttr(err))
	}
	if lk.session == "" {
		lk.cfg.log(lk.base, msgLevel, msgText, lk.msg, *lk.env, attrs...)
		return
	}
	lk.cfg.logger.LogAttrs(lk.base, sessionLevel, sessionText, append([]slog.Attr{slog.String("session_id", lk.session)}, attrs...)...)
}

// renewals is a processor's schedule of lock renewals: the locks being kept in one list, oldest first
// (each from keepLock to stop, except while its renewal call is in flight), and one timer for all of
// them, armed for the earliest renewal due. A lock with renewal disabled, or over, is listed without a
// renewal, so that a shutdown that gives up finds every call in flight (abandon). It stays for its measured
// gain: with a runtime timer per lock (time.AfterFunc at receive, Stop at settle), arming and stopping
// the timers took 4.4 % of the consumer's CPU in BenchmarkPaired's success case, the SDK's many timers
// making each timer operation a heap update; with the schedule, 0.5 % (BENCHMARKS.md, "Primitives kept
// and removed"). A message settled within its first renewal interval, nearly every one, costs two list
// updates under one mutex and no timer operation.
//
// The timer is not moved when a lock leaves the list (its message was settled) while others remain: it
// fires at the time it was armed for, finds nothing due, and re-arms for the earliest lock then listed,
// so that a busy processor touches it about once per renewal interval. Locks mostly enter in the order they come due,
// but not always (lock durations and renewal retries differ), so a firing looks at every listed lock.
type renewals struct {
	clk        Clock
	mu         sync.Mutex
	head, tail *lockKeeper
	renewing   int       // how many listed locks renew
	timer      stopper   // armed for armedAt; nil when not armed
	armedAt    time.Time // zero when not armed
	// gen counts the armings: a firing that was already on its way when its timer was replaced or
	// stopped sees a newer generation and does nothing, so that only one timer is ever live.
	gen uint64
}

// add lists lk: for a renewal at due if renews, else only so that abandon finds it (renewal is
// disabled, or the lock is over).
func (s *renewals) add(lk *lockKeeper, due time.Time, renews bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	lk.due, lk.renews, lk.prev, lk.next, lk.listed = due, renews, s.tail, nil, true
	if s.tail != nil {
		s.tail.next = lk
	} else {
		s.head = lk
	}
	s.tail = lk
	if renews {
		s.renewing++
	}
	if renews && (s.armedAt.IsZero() || due.Before(s.armedAt)) {
		s.armLocked(due)
	}
}

// abandon ends the broker calls in flight of every listed lock (lockKeeper.cancelCalls): the settle
// base ended, a shutdown gave up. The consumer calls it then, once, instead of every call registering
// with that context, which all messages share: that
// registration cost 3 to 4 % of CPU per message in BenchmarkPaired (BENCHMARKS.md, "Primitives kept
// and removed"). A lock off the list meanwhile, for a renewal call, does the same when that call
// returns (lockKeeper.renew).
func (s *renewals) abandon() {
	s.mu.Lock()
	var listed []*lockKeeper
	for lk := s.head; lk != nil; lk = lk.next {
		listed = append(listed, lk)
	}
	s.mu.Unlock()
	for _, lk := range listed {
		lk.cancelCalls()
	}
}

// remove takes lk out of the list, if it is listed. On an injected clock the timer is stopped once
// no listed lock renews, so that an idle processor leaves no goroutine waiting on that clock; on the system
// clock it is left to fire (a runtime timer costs nothing while it waits), so that a processor whose
// list keeps emptying between messages does not re-arm it for each.
func (s *renewals) remove(lk *lockKeeper) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if lk.listed {
		s.unlinkLocked(lk)
	}
	if _, system := s.clk.(realClock); !system && s.renewing == 0 && s.timer != nil {
		s.timer.Stop()
		s.timer, s.armedAt = nil, time.Time{}
		s.gen++
	}
}

// armLocked points the timer at due.
func (s *renewals) armLocked(due time.Time) {
	if s.timer != nil {
		s.timer.Stop()
	}
	s.armedAt = due
	s.gen++
	gen := s.gen
	s.timer = afterFunc(s.clk, max(due.Sub(s.clk.Now()), 0), func() { s.fire(gen) })
}

// fire starts the renewals that are due, each in a goroutine of its own for its one broker call, and
// re-arms the timer for the earliest lock still listed.
func (s *renewals) fire(gen uint64) {
	s.mu.Lock()
	if gen != s.gen {
		s.mu.Unlock() // replaced or stopped while this firing was on its way
		return
	}
	s.timer, s.armedAt = nil, time.Time{}
	now := s.clk.Now()
	var due []*lockKeeper
	var next time.Time
	for lk := s.head; lk != nil; {
		following := lk.next
		switch {
		case !lk.renews:
		case !lk.due.After(now):
			s.unlinkLocked(lk)
			lk.calls.Add(1) // under the list's mutex: stop, which removes lk first, then waits for it
			due = append(due, lk)
		case next.IsZero() || lk.due.Before(next):
			next = lk.due
		}
		lk = following
	}
	if !next.IsZero() {
		s.armLocked(next)
	}
	s.mu.Unlock()
	for _, lk := range due {
		go lk.renew()
	}
}

func (s *renewals) unlinkLocked(lk *lockKeeper) {
	if lk.renews {
		s.renewing--
	}
	if lk.prev != nil {
		lk.prev.next = lk.next
	} else {
		s.head = lk.next
	}
	if lk.next != nil {
		lk.next.prev = lk.prev
	} else {
		s.tail = lk.prev
	}
	lk.prev, lk.next, lk.listed = nil, nil, false
}

// renewInterval is the wait between renewals of a lock of dur, a message's or a session's:
// Options.LockRenewInterval, else half of dur; never more than two thirds of it, which leaves a third
// of the lock for the renewal call (an interval past the lock would renew only after it expired), and
// never less than minRenewWait.
func (c *config) renewInterval(dur time.Duration) time.Duration {
	iv := c.lockRenewInterval
	if iv <= 0 {
		iv = dur / 2
	}
	return max(min(iv, dur*2/3), minRenewWait)
}
