package retry

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sbretry/retry/internal/redact"
	"github.com/sbretry/retry/outage"
)

// Outage mode: a breaker on the consumer. While the handlers' failures say that something they depend
// on is down, the consumer stops receiving, and the messages it still holds are held for later instead
// of spending their attempts: each is rescheduled unchanged (same attempt, a MessageID of its own) for
// the next probe, and the original completed. After OpenFor, one probe (a message, or
// outage.Options.HealthCheck) decides: success closes the breaker, failure keeps it open twice as long,
// up to MaxOpenFor.

// admitKind is what the breaker lets a delivery do.
type admitKind int

const (
	admitRun   admitKind = iota // closed: run the handler
	admitProbe                  // half-open: run the handler as the probe
	admitHold                   // open: hold the message for later without running the handler
	admitWait                   // half-open, another delivery probing: wait for its verdict
)

// admission is a delivery's admission; a probe's carries the half-open period it probes (gen), so
// that a probe that outlived its period (a pause and a new trip came meanwhile) decides nothing.
type admission struct {
	kind admitKind
	gen  uint64
}

// probeAskWindow is how long a half-open breaker waits for the message it let a receive loop ask for
// to reach its handler (and become the probe) before it lets a loop ask for another: the message may
// never get there (an earlier delivery's outcome applied instead, say).
const probeAskWindow = 2 * time.Second

// attemptOutcome is what one handler call tells the breaker.
type attemptOutcome int

const (
	attemptNone    attemptOutcome = iota // the handler did not run or was stopped: no evidence
	attemptSuccess                       // it succeeded
	attemptFailure                       // it failed with an error that counts
	attemptNeutral                       // it failed with an error that does not count
)

// breaker is the consumer's outage breaker. It has no goroutine and no timer: the receive loops wait
// on it (gate) and move it from open to half-open when the probe is due, and the processor asks it
// before each handler call (admit) and tells it the outcome (record). It lives as long as the
// Consumer, so a pause survives a Run that ends.
type breaker struct {
	cfg    *outageConfig // nil: no automatic trips, only Pause and Resume
	entity string        // the consumer's entity, for outage.Change (set at connect; b.mu)
	clk    Clock
	logger *slog.Logger
	hook   func(outage.Change)
	closed atomic.Bool // the state is outage.Closed: the processor's fast path

	mu          sync.Mutex
	st          outage.Status
	openFor     time.Duration // the current pause, doubled on failed probes and flapping
	closedAt    time.Time     // when it last closed after a trip
	consecutive int
	win         rateWindow
	probing     bool          // a probe (a message or the health check) is running
	askedUntil  time.Time     // half-open: a loop asked for a message to probe with, until then
	gen         uint64        // counts the half-open periods: a probe's admission carries its own
	notifying   bool          // a goroutine is delivering the pending hook calls (see notify)
	changed     chan struct{} // closed and replaced on every change, for the waiting receive loops
	pending     []outage.Change
}

func newBreaker(cfg *config) *breaker {
	b := &breaker{cfg: cfg.outage, clk: cfg.clock, logger: cfg.logger, hook: cfg.hooks.OnOutage, changed: make(chan struct{})}
	b.closed.Store(true)
	b.st.Since = cfg.clock.Now()
	if b.cfg != nil {
		b.openFor = b.cfg.openFor
		b.win.width = b.cfg.window / rateBuckets
	}
	return b
}

// setEntity names the consumer's entity in the hook calls that follow.
func (b *breaker) setEntity(entity string) {
	b.mu.Lock()
	b.entity = entity
	b.mu.Unlock()
}

// status returns the breaker's state for Health.
func (b *breaker) status() outage.Status {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.st
}

// moveLocked changes the state and queues the hook call (see notify).
func (b *breaker) moveLocked(to outage.State, now time.Time, manual bool, reason string, next time.Time, err error) {
	from := b.st.State
	b.st.State, b.st.Since, b.st.Manual, b.st.NextProbe = to, now, manual, next
	if to == outage.Closed {
		b.st.Reason = ""
	} else if reason != "" {
		b.st.Reason = reason
	}
	b.closed.Store(to == outage.Closed)
	b.probing, b.askedUntil = false, time.Time{}
	b.wakeLocked()
	b.pending = append(b.pending, outage.Change{From: from, To: to, Manual: manual, Reason: b.st.Reason, NextProbe: next, Err: err, EntityPath: b.entity, Time: now})
}

// notify logs and reports the queued changes, in order, one hook call at a time. It is called with
// b.mu not held, after every method that may have changed the state. The first caller delivers
// everything queued, later ones included; a call made meanwhile (another goroutine's, or the hook's own
// Pause or Resume) only queues, so a hook may call back into the consumer without deadlocking.
func (b *breaker) notify() {
	b.mu.Lock()
	if b.notifying {
		b.mu.Unlock()
		return
	}
	b.notifying = true
	for len(b.pending) > 0 {
		ev := b.pending[0]
		b.pending = b.pending[1:]
		b.mu.Unlock()
		b.report(ev)
		b.mu.Lock()
	}
	b.notifying = false
	b.mu.Unlock()
}

// report logs one change and calls the hook with it; a hook that panics is logged, not propagated.
func (b *breaker) report(ev outage.Change) {
	attrs := []any{slog.String("from", ev.From.String()), slog.String("to", ev.To.String()), slog.Bool("manual", ev.Manual)}
	if ev.EntityPath != "" {
		attrs = append(attrs, slog.String("entity", ev.EntityPath))
	}
	if ev.Reason != "" {
		attrs = append(attrs, slog.String("reason", ev.Reason))
	}
	if !ev.NextProbe.IsZero() {
		attrs = append(attrs, slog.Time("next_probe", ev.NextProbe))
	}
	if ev.Err != nil {
		attrs = append(attrs, errAttr(ev.Err))
	}
	level := slog.LevelInfo
	if ev.To == outage.Open {
		level = slog.LevelWarn
	}
	b.logger.Log(context.Background(), level, "outage breaker changed state", attrs...)
	if b.hook == nil {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			b.logger.Error("Hooks.OnOutage panicked", slog.String("panic", redact.String(fmt.Sprint(r))))
		}
	}()
	b.hook(ev)
}

// pause opens the breaker by hand, until resume.
func (b *breaker) pause(reason string) {
	b.mu.Lock()
	if reason == "" {
		reason = "paused by hand"
	}
	reason = truncate(redact.String(reason), defaultDescriptionLimit)
	if !(b.st.State == outage.Open && b.st.Manual && b.st.Reason == reason) {
		b.moveLocked(outage.Open, b.clk.Now(), true, reason, time.Time{}, nil)
	}
	b.mu.Unlock()
	b.notify()
}

// resume closes the breaker, whoever opened it.
func (b *breaker) resume() {
	b.mu.Lock()
	if b.st.State != outage.Closed {
		now := b.clk.Now()
		b.closedAt = now
		b.resetCountsLocked()
		b.moveLocked(outage.Closed, now, true, "", time.Time{}, nil)
	}
	b.mu.Unlock()
	b.notify()
}

// gate is what a receive loop may do now: receive up to limit messages (-1: no limit of the breaker's;
// 1: half-open, one message to probe with), run the health check (check), or wait for changed or
// until (zero: no time) and ask again.
type gate struct {
	limit   int
	check   bool
	changed <-chan struct{}
	until   time.Time
}

// gate tells a receive loop what it may do at now.
func (b *breaker) gate(now time.Time) gate {
	if b.closed.Load() {
		return gate{limit: -1}
	}
	b.mu.Lock()
	defer b.notify()
	defer b.mu.Unlock()
	b.dueLocked(now)
	switch {
	case b.st.State == outage.Closed:
		return gate{limit: -1}
	case b.st.State == outage.Open:
		return gate{changed: b.changed, until: b.st.NextProbe}
	case b.probing:
		return gate{changed: b.changed}
	case b.cfg.healthCheck != nil:
		b.probing = true
		return gate{check: true}
	case now.Before(b.askedUntil):
		return gate{changed: b.changed, until: b.askedUntil}
	}
	b.askedUntil = now.Add(probeAskWindow)
	return gate{limit: 1}
}

// unask tells a half-open breaker that the receive it allowed (gate's limit 1) brought nothing, so
// that a loop may ask again at once.
func (b *breaker) unask() {
	b.mu.Lock()
	if !b.askedUntil.IsZero() {
		b.askedUntil = time.Time{}
		b.wakeLocked()
	}
	b.mu.Unlock()
}

// wakeLocked wakes the receive loops and deliveries waiting for a change.
func (b *breaker) wakeLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// dueLocked moves an open breaker whose probe is due to half-open.
func (b *breaker) dueLocked(now time.Time) {
	if b.st.State == outage.Open && !b.st.Manual && !b.st.NextProbe.IsZero() && !now.Before(b.st.NextProbe) {
		b.moveLocked(outage.HalfOpen, now, false, "", time.Time{}, nil)
		b.st.Probes++
		b.gen++
	}
}

// healthChecked reports the health check's result (see gate).
func (b *breaker) healthChecked(err error) {
	b.mu.Lock()
	if b.st.State == outage.HalfOpen {
		b.probeEndedLocked(b.clk.Now(), err)
	}
	b.mu.Unlock()
	b.notify()
}

// runHealthCheck calls the health check, bounded by its timeout, recovering from a panic. A check cut
// short because ctx (the run) ended says nothing about the dependency: the next run checks again.
func (b *breaker) runHealthCheck(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, b.cfg.checkTimeout)
	defer cancel()
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("retry: outage health check panicked: %v", r)
			}
		}()
		return b.cfg.healthCheck(cctx)
	}()
	if ctx.Err() != nil {
		// Cut short (a shutdown, or the lost lock of the session whose message waited): no verdict.
		// Another waiter runs the check next.
		b.mu.Lock()
		b.probing = false
		b.wakeLocked()
		b.mu.Unlock()
		return
	}
	if err == nil && cctx.Err() != nil {
		err = fmt.Errorf("retry: outage health check: %w", cctx.Err())
	}
	b.healthChecked(err)
}

// probeEndedLocked closes the breaker after a successful probe (err nil) or opens it again for twice
// as long.
func (b *breaker) probeEndedLocked(now time.Time, err error) {
	if err == nil {
		b.closedAt = now
		b.resetCountsLocked()
		b.moveLocked(outage.Closed, now, false, "", time.Time{}, nil)
		return
	}
	b.st.FailedProbes++
	b.openFor = min(2*b.openFor, b.cfg.maxOpenFor)
	b.moveLocked(outage.Open, now, false, "the probe failed: "+truncate(redact.String(err.Error()), 256), now.Add(b.openFor), err)
}

// suspects reports whether a closed breaker's last two counted attempts failed: an outage may be
// starting (see Processor.lastAttemptInAnOutage).
func (b *breaker) suspects() bool {
	if b == nil || b.cfg == nil || !b.closed.Load() {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.st.State == outage.Closed && b.consecutive >= 2
}

// holding reports whether the breaker is open (not half-open): a delivery is held without waiting
// for a handler slot.
func (b *breaker) holding() bool {
	if b == nil || b.closed.Load() {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.st.State == outage.Open && (b.st.Manual || b.st.NextProbe.After(b.clk.Now()))
}

// paused reports whether the breaker is held open by hand ([Consumer.Pause]), with a channel closed at
// its next change, for a session consumer's workers, which stop while paused.
func (b *breaker) paused() (bool, <-chan struct{}) {
	if b == nil {
		return false, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.st.State == outage.Open && b.st.Manual, b.changed
}

// admit tells the processor whether a delivery may run its handler; with admitWait, changed is closed
// when the delivery should ask again.
func (b *breaker) admit() (adm admission, changed <-chan struct{}) {
	if b == nil || b.closed.Load() {
		return admission{kind: admitRun}, nil
	}
	b.mu.Lock()
	defer b.notify()
	defer b.mu.Unlock()
	b.dueLocked(b.clk.Now())
	switch {
	case b.st.State == outage.Closed:
		return admission{kind: admitRun}, nil
	case b.st.State == outage.Open || b.cfg.healthCheck != nil:
		return admission{kind: admitHold}, nil
	case !b.probing:
		b.probing, b.askedUntil = true, time.Time{}
		return admission{kind: admitProbe, gen: b.gen}, nil
	}
	// Half-open with a probe running: its verdict is moments away, and a message held now would wait
	// a whole OpenFor even if the probe closed the breaker.
	return admission{kind: admitWait}, b.changed
}

// record tells the breaker what a handler call admitted as adm came to, and reports whether the
// breaker is open now (not closed), in which case a counted failure is held rather than retried.
func (b *breaker) record(adm admission, out attemptOutcome, err error) (open bool) {
	if b == nil {
		return false
	}
	if b.cfg == nil || (adm.kind == admitRun && out == attemptNone) {
		return !b.closed.Load()
	}
	b.mu.Lock()
	defer b.notify()
	defer b.mu.Unlock()
	now := b.clk.Now()
	if adm.kind == admitProbe {
		if b.st.State != outage.HalfOpen || adm.gen != b.gen {
			// Resumed or paused by hand meanwhile, or this probe's half-open period is over: no verdict.
			return b.st.State != outage.Closed
		}
		switch out {
		case attemptSuccess:
			b.probeEndedLocked(now, nil)
		case attemptFailure:
			b.probeEndedLocked(now, err)
		default:
			b.probing = false // no verdict: let the next message probe
			b.wakeLocked()
		}
		return b.st.State != outage.Closed
	}
	if b.st.State != outage.Closed {
		return true
	}
	switch out {
	case attemptSuccess:
		b.consecutive = 0
		b.win.add(now, false)
	case attemptFailure:
		b.consecutive++
		b.win.add(now, true)
		if reason := b.tripReasonLocked(now); reason != "" {
			b.tripLocked(now, reason, err)
			return true
		}
	}
	return false
}

// tripReasonLocked says why the breaker must trip at now, or "".
func (b *breaker) tripReasonLocked(now time.Time) string {
	c := b.cfg
	if c.consecutive > 0 && b.consecutive >= c.consecutive {
		return strconv.Itoa(b.consecutive) + " failures in a row"
	}
	if c.rate > 0 {
		total, failed := b.win.sum(now)
		if total >= c.minAttempts && float64(failed) >= c.rate*float64(total) {
			return fmt.Sprintf("%d of %d attempts failed within %s", failed, total, c.window)
		}
	}
	return ""
}

// tripLocked opens the breaker. A trip within one Window of the last close means the dependency
// flaps: the pause doubles instead of starting again from OpenFor.
func (b *breaker) tripLocked(now time.Time, reason string, err error) {
	if b.closedAt.IsZero() || now.Sub(b.closedAt) >= b.cfg.window {
		b.openFor = b.cfg.openFor
	} else {
		b.openFor = min(2*b.openFor, b.cfg.maxOpenFor)
	}
	b.st.Trips++
	b.resetCountsLocked()
	if err != nil {
		reason += "; last error: " + truncate(redact.String(err.Error()), 256)
	}
	b.moveLocked(outage.Open, now, false, reason, now.Add(b.openFor), err)
}

func (b *breaker) resetCountsLocked() {
	b.consecutive = 0
	b.win.reset()
}

// holdUntil is when a message held now becomes due again: the next probe, or one OpenFor from now
// when none is planned (paused by hand, or half-open).
func (b *breaker) holdUntil(now time.Time) time.Time {
	if b == nil {
		return now.Add(defaultOutageOpenFor)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if next := b.st.NextProbe; next.After(now) {
		return next
	}
	d := defaultOutageOpenFor
	if b.cfg != nil {
		d = b.openFor
	}
	return now.Add(d)
}

// rateBuckets is how many buckets the failure-rate window is kept in: the window slides by a tenth.
const rateBuckets = 10

// rateWindow counts attempts and failures over the last Window, in buckets of Window/rateBuckets.
type rateWindow struct {
	width   time.Duration
	buckets [rateBuckets]rateBucket
}

type rateBucket struct {
	index         int64 // which width-long span of time the bucket counts (now / width)
	total, failed int
}

func (w *rateWindow) add(now time.Time, failed bool) {
	if w.width <= 0 {
		return
	}
	i := now.UnixNano() / int64(w.width)
	bk := &w.buckets[((i%rateBuckets)+rateBuckets)%rateBuckets] // a clock before 1970 must not panic
	if bk.index != i {
		*bk = rateBucket{index: i}
	}
	bk.total++
	if failed {
		bk.failed++
	}
}

func (w *rateWindow) sum(now time.Time) (total, failed int) {
	if w.width <= 0 {
		return 0, 0
	}
	i := now.UnixNano() / int64(w.width)
	for _, bk := range w.buckets {
		if bk.index > i-rateBuckets && bk.index <= i {
			total += bk.total
			failed += bk.failed
		}
	}
	return total, failed
}

func (w *rateWindow) reset() { w.buckets = [rateBuckets]rateBucket{} }

// await waits until the breaker lets a receive through, running the health check when it wants it, and
// returns gate's limit (-1: none of the breaker's; 1: half-open, one message to probe with), or 0 when
// ctx ended first or the waiter's errand failed (err then says why). A session consumer's workers wait
// here before they accept a session, a message held in its session waits here for the breaker's next
// probe, and the queue consumer's receive loops wait here with their idle probe as errand.
func (b *breaker) await(ctx context.Context, meanwhile *errand) (limit int, err error) {
	for {
		now := b.clk.Now()
		g := b.gate(now)
		switch {
		case g.check:
			b.runHealthCheck(ctx)
			if ctx.Err() != nil {
				return 0, nil // the check was cut short: no verdict, and another waiter may run it
			}
			continue
		case g.changed == nil:
			return g.limit, nil
		}
		var due, tick <-chan time.Time
		stopDue, stopTick := func() bool { return false }, func() bool { return false }
		if !g.until.IsZero() {
			due, stopDue = timerChan(b.clk, max(g.until.Sub(now), 0))
		}
		if meanwhile != nil {
			tick, stopTick = timerChan(b.clk, meanwhile.next())
		}
		select {
		case <-g.changed:
		case <-due:
		case <-ctx.Done():
		case <-tick:
			err = meanwhile.run()
		}
		stopDue()
		stopTick()
		if ctx.Err() != nil {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
	}
}

// errand is what a waiter does on its own schedule while the breaker keeps it waiting: next is how
// long until it is due, run does it, and an error from run ends the wait.
type errand struct {
	next func() time.Duration
	run  func() error
}
