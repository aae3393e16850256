package retry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/internal/redact"
)

// Outcome says what the processor did with a delivery.
type Outcome int

const (
	// OutcomeCompleted: the handler succeeded and the message was completed.
	OutcomeCompleted Outcome = iota + 1
	// OutcomeRetryScheduled: a copy was scheduled for the next attempt and the original completed.
	OutcomeRetryScheduled
	// OutcomeDeadLettered: the message was dead-lettered with one of our reasons.
	OutcomeDeadLettered
	// OutcomeLeftForRedelivery: the message was deliberately not settled (lock lost, shutdown, or a
	// republish/settle call failed), so the broker redelivers it. Nothing is lost.
	OutcomeLeftForRedelivery
)

func (o Outcome) String() string {
	switch o {
	case OutcomeCompleted:
		return "completed"
	case OutcomeRetryScheduled:
		return "retry-scheduled"
	case OutcomeDeadLettered:
		return "dead-lettered"
	case OutcomeLeftForRedelivery:
		return "left-for-redelivery"
	}
	return "unknown"
}

// Result describes one [Processor.Process] call.
type Result struct {
	Outcome Outcome
	// Attempt is the attempt number of the processed delivery.
	Attempt int
	// HandlerErr is the error the handler returned (nil on success), still wrapped by [Permanent] or
	// [RetryAfter] if it was; errors.Is and errors.As see through both.
	HandlerErr error
	// Delay, ScheduledFor and SequenceNumber describe the scheduled retry (OutcomeRetryScheduled).
	Delay          time.Duration
	ScheduledFor   time.Time
	SequenceNumber int64
	// RetryMessageID is the MessageID of the scheduled copy.
	RetryMessageID string
	// DeadLetterReason is set for OutcomeDeadLettered (and for failed dead-letter calls).
	DeadLetterReason string
	// SettleErr is the republish, complete or dead-letter failure, if any.
	SettleErr error
	// PossibleDuplicate is true when the retry copy was scheduled but completing the original failed:
	// the broker will redeliver the original. A redelivery that reaches this process completes it without
	// running the handler again (see Inherited); one that reaches another process runs the handler, and its
	// republish reuses the same MessageID, which duplicate detection absorbs.
	PossibleDuplicate bool
	// Inherited is true when the handler did not run because an earlier delivery of the same message, in
	// this process, had already decided the outcome but could not settle it (its lock died with a
	// connection, or its settle call failed): this delivery applied that outcome with its own lock.
	Inherited bool
}

// Processor runs the handler for one message and settles it: complete on success, schedule a retry copy
// then complete on failure, dead-letter when attempts are spent. It is safe for concurrent use; it
// remembers which messages it is handling, so that a redelivery of a message still in its hands never
// runs a second handler (see [Result.Inherited]). [Consumer] is the receive loop around it. Use it
// directly when you own the receive loop. Create it with [NewProcessor]; the zero value is not usable.
type Processor struct {
	sender  Sender
	handler Handler
	cfg     *config
	entity  string
	flights flights

	renewOnce sync.Once
	renewals  *renewer

	realClock bool      // the clock is the real one: its readings can be deadlines
	timers    sync.Pool // *reusableTimer, bounding settle calls
}

// callTimer returns a timer to bound one settle call with; put it back in p.timers once disarmed.
func (p *Processor) callTimer() *reusableTimer {
	if t, ok := p.timers.Get().(*reusableTimer); ok {
		return t
	}
	return new(reusableTimer)
}

// NewProcessor returns a Processor that republishes retries through sender (the entity the retry copies
// go to: normally the queue itself). Set Options.EntityPath to the entity the messages are received
// from; it names retry chains. nil opts means defaults.
func NewProcessor(sender Sender, handler Handler, opts *Options) (*Processor, error) {
	if sender == nil {
		return nil, &OptionError{Field: "sender", Reason: "must not be nil"}
	}
	if handler == nil {
		return nil, &OptionError{Field: "handler", Reason: "must not be nil"}
	}
	cfg, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	return newProcessor(sender, handler, cfg), nil
}

// newProcessor builds a Processor on an already validated config. The Consumer keeps one for its whole
// life and passes each connection's sender per call, so that its memory of in-flight messages spans
// reconnects.
func newProcessor(sender Sender, handler Handler, cfg *config) *Processor {
	_, real := cfg.clock.(realClock)
	return &Processor{sender: sender, handler: handler, cfg: cfg, entity: cfg.entityPath, realClock: real}
}

// Process handles msg, received in peek-lock mode through settler. It calls the handler with a context
// that carries the [Envelope] and is cancelled when ctx ends or the lock is lost. The lock is renewed
// from the start until the message is settled, independently of ctx: a loop that cancels ctx to shut
// down still has its in-flight messages settled. Settle calls are bounded by the settle timeout and by
// the lock's remaining time. A handler that fails after ctx was cancelled is not settled: the broker
// redelivers the message without an attempt counted. A deadline is not a cancellation: a handler that
// fails because a deadline expired (ctx's, one set by Hooks.OnStart, or the handler's own) has made a
// failed attempt, retried with its backoff like any other.
func (p *Processor) Process(ctx context.Context, settler Settler, msg *azservicebus.ReceivedMessage) Result {
	if p == nil || p.cfg == nil {
		return Result{Outcome: OutcomeLeftForRedelivery, SettleErr: ErrNotConfigured}
	}
	if settler == nil {
		return Result{Outcome: OutcomeLeftForRedelivery, SettleErr: ErrNilSettler}
	}
	base := context.WithoutCancel(ctx)
	return p.process(ctx, base, base, settler, p.sender, p.entity, msg, nil)
}

// slotLostCause is why a delivery got no handler slot: its lock ended, its context did, or the
// consumer stopped receiving before a slot came free.
func slotLostCause(lk *lockKeeper, ctx context.Context) error {
	if why := lk.why(); why != nil {
		return why
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return context.Canceled
}

// doner is what reacquire needs of a lock keeper: whether the lock is over, and a channel closed when
// it is, made only when it is asked for.
type doner interface {
	ended() bool
	Done() <-chan struct{}
}

// slots is how the consumer lends a delivery its handler slot (or, for a delivery received ahead, a
// prefetch place until a slot frees up): release gives it back once the handler has returned (or while
// the delivery waits for an earlier one of the same message), reacquire takes one (again) before a
// handler runs. Process without a consumer has none.
type slots interface {
	release()
	// holding reports whether the delivery holds a handler slot; one received ahead of a free slot
	// (prefetched) waits for one with reacquire before its handler runs.
	holding() bool
	// reacquire takes a handler slot, waiting for one unless one is free; waited reports whether it
	// had to. It gives up when ctx ends or the lock is lost (lock.Done), which it looks at only if it
	// waits.
	reacquire(ctx context.Context, lock doner) (ok, waited bool)
	// startCall tells the consumer which broker call is in flight, so that a shutdown that gives up can
	// end it; the consumer also ends it at its deadline (one timer serves all its workers' calls).
	// endCall says that the call has returned.
	startCall(c *settleCall)
	endCall()
	// handlerParent returns what the handler's context of a delivery processed under ctx derives from:
	// ctx itself, or, when ctx is the worker's own context, the worker's values without its
	// cancellation, and then the worker's context too, whose end the worker passes on to the handler
	// running under lk (runsHandler; nil once it has returned) through the lock keeper, so that starting
	// a handler registers with no context.
	handlerParent(ctx context.Context) (parent, worker context.Context)
	runsHandler(lk *lockKeeper)
}

// process is Process with the consumer's extras: settleBase is the context every settle, renewal and
// republish belongs to (the consumer cancels it when it gives up on a shutdown, so that nothing is
// settled after Run returned), detached is settleBase without its cancellation (settle calls derive
// from it, checking settleBase before they start, so that they cost no registration with a context
// that every message shares), sender is the current connection's, and sl, if set, holds the
// delivery's handler slot or prefetch place: the slot is taken before the handler runs and given back
// once it has returned (or is skipped, or while an earlier delivery is awaited), before the message is
// settled, so the consumer can start another handler while this one's settle is still in flight.
func (p *Processor) process(ctx, settleBase, detached context.Context, settler Settler, sender Sender, entity string, msg *azservicebus.ReceivedMessage, sl slots) (res Result) {
	release := func() {
		if sl != nil {
			sl.release()
		}
	}
	if msg == nil {
		return Result{Outcome: OutcomeLeftForRedelivery, SettleErr: ErrNilMessage}
	}
	clk := p.cfg.clock
	now := clk.Now()
	// Everything this delivery needs to keep is one allocation.
	dv := &delivery{ob: observed{ctx: ctx, entity: entity, start: now, now: now, detached: detached, sl: sl}}
	ob := &dv.ob
	defer func() { ob.ctx = nil }() // a remembered outcome must not keep the handler's context alive
	if isProbe(msg) {
		// A connection check's probe whose cancellation was lost: not a user's message.
		release()
		cctx, cancel := context.WithTimeout(settleBase, p.cfg.settleTimeout)
		err := settler.CompleteMessage(cctx, msg, nil)
		cancel()
		res = Result{Outcome: OutcomeCompleted, Attempt: 1, SettleErr: err}
		if err != nil {
			res.Outcome = OutcomeLeftForRedelivery
		}
		return p.finish(ob, msg, Envelope{Attempt: 1, OriginalMessageID: msg.MessageID, FirstSequenceNumber: -1}, res)
	}
	env := &dv.env
	var envErr error
	*env, envErr = DecodeEnvelope(msg)
	lk := &dv.lk
	if envErr != nil {
		release()
		res = Result{Attempt: env.Attempt}
		*env = Envelope{OriginalMessageID: msg.MessageID, FirstSequenceNumber: -1}
		p.keepLock(lk, settleBase, settler, msg, env, now)
		defer lk.stop()
		p.started(ob, msg, *env)
		d := p.deadLetterDecision(env, msg, p.cfg.reasons.InvalidEnvelope, envErr, now, false)
		p.settleDeadLetter(ob, lk, settler, msg, d, &res)
		return p.finish(ob, msg, *env, res)
	}
	*env = seed(msg, *env, entity, p.idempotencyKey)
	res.Attempt = env.Attempt
	// stop is the caller's context: its cancellation is a shutdown. The handler's context (OnStart's,
	// and whatever the handler derives from it) may carry deadlines of its own, and a deadline that
	// expires is a failed attempt, never a shutdown.
	stop := ctx
	ctx = p.started(ob, msg, *env)
	p.keepLock(lk, settleBase, settler, msg, env, now)
	defer lk.stop()

	// One handling per message at a time: a redelivery of a message still in flight here takes over.
	var f *flight
	if key, ok := keyOf(entity, msg); ok {
		f = &dv.fl
		prior := p.flights.enter(f, key, lk, now)
		unsettled := false
		defer func() { p.flights.leave(f, unsettled, ob.now, p.rememberFor(lk)) }()
		defer func() { unsettled = res.Outcome == OutcomeLeftForRedelivery || lk.slowSettle.Load() }()
		if prior != nil {
			release() // waiting for the earlier delivery must not keep other messages from their handlers
			// Wait for every earlier delivery still in this process, not just the latest: one that gave
			// up waiting leaves its own earlier one running, and that one's decision is the one to apply.
			var d *decision
			for pr := prior; pr != nil && d == nil; pr = p.flights.priorOf(pr) {
				pr.supersede()
				select {
				case <-pr.finished():
				case <-lk.Done():
					ob.now = clk.Now()
					return p.finish(ob, msg, *env, p.leftForRedelivery(msg, *env, ErrLockLost, "lock lost while waiting for an earlier delivery of the message"))
				case <-stop.Done():
					ob.now = clk.Now()
					return p.finish(ob, msg, *env, p.leftForRedelivery(msg, *env, stop.Err(), "stopped while waiting for an earlier delivery of the message"))
				}
				d = pr.decision()
			}
			if d != nil {
				release()
				f.setDecision(d)
				res = Result{Attempt: d.env.Attempt, HandlerErr: d.handlerErr, Inherited: true}
				p.log(ctx, slog.LevelInfo, "redelivery of a message whose outcome was already decided here; applying it without running the handler", msg, *d.env)
				ob.now = clk.Now()
				p.apply(ob, settleBase, lk, f, settler, sender, msg, d, &res)
				return p.finish(ob, msg, *d.env, res)
			}
			if sl != nil {
				if ok, _ := sl.reacquire(stop, lk); !ok {
					ob.now = clk.Now()
					return p.finish(ob, msg, *env, p.leftForRedelivery(msg, *env, slotLostCause(lk, stop), "stopped or lock lost while waiting for a handler slot"))
				}
			}
			ob.now = clk.Now()
		}
	}

	if sl != nil && !sl.holding() {
		// Received ahead of a free handler slot: its lock is kept (renewed) while it waits for one.
		ok, waited := sl.reacquire(stop, lk)
		if !ok {
			ob.now = clk.Now()
			return p.finish(ob, msg, *env, p.leftForRedelivery(msg, *env, slotLostCause(lk, stop), "stopped or lock lost while waiting for a handler slot"))
		}
		if waited {
			ob.now = clk.Now()
		}
	}
	handlerStart := ob.now
	handlerErr, lockLost := p.runHandler(ctx, lk, sl, msg, env)
	ob.now = clk.Now()
	ob.handler = ob.now.Sub(handlerStart)
	release()
	res.HandlerErr = handlerErr
	var d *decision
	switch {
	case lockLost:
		res.Outcome = OutcomeLeftForRedelivery
		res.SettleErr = ErrLockLost
		if handlerErr == nil {
			// The work is done; only the complete is impossible. Remember it, so the redelivery here
			// completes without running the handler again.
			d = &dv.dec
			*d = decision{kind: decideComplete, env: env}
		}
		p.log(ctx, slog.LevelWarn, "message lock lost while the handler ran; the broker will redeliver it", msg, *env)
	case handlerErr == nil:
		d = &dv.dec
		*d = decision{kind: decideComplete, env: env}
	case stopped(stop):
		// Shutdown cancelled the handler; leave the message for redelivery rather than count an attempt.
		res.Outcome = OutcomeLeftForRedelivery
		p.log(ctx, slog.LevelInfo, "handler failed during shutdown; the broker will redeliver the message", msg, *env, errAttr(handlerErr))
	default:
		d = p.decideFailure(ob, msg, env, handlerErr, ob.now)
	}
	if f != nil && d != nil {
		f.setDecision(d)
	}
	if d != nil && !lockLost {
		p.apply(ob, settleBase, lk, f, settler, sender, msg, d, &res)
	}
	return p.finish(ob, msg, *env, res)
}

// stopped reports whether the caller's context was cancelled: only that is a shutdown, which leaves a
// failed delivery for redelivery without counting its attempt. A context that ended at its deadline
// (a caller's per-message timeout) makes the failure a failed attempt, as a handler's own timeout does:
// otherwise a handler that keeps timing out would be redelivered at once, with no backoff, until the
// broker dead-letters it for its delivery count.
func stopped(ctx context.Context) bool { return errors.Is(ctx.Err(), context.Canceled) }

// delivery is the state of one delivery, allocated once: what the hooks see, the envelope, the lock,
// the entry in the in-flight registry and a success's decision.
type delivery struct {
	ob  observed
	env Envelope
	lk  lockKeeper
	fl  flight
	dec decision
}

// rememberFor is how long an unsettled outcome is kept for its redelivery: long enough for the lock
// to run out and the message to come back.
func (p *Processor) rememberFor(lk *lockKeeper) time.Duration {
	return max(minRememberOutcome, 2*lk.duration+2*p.cfg.settleTimeout)
}

// leftForRedelivery is the result of a delivery deliberately not settled.
func (p *Processor) leftForRedelivery(msg *azservicebus.ReceivedMessage, env Envelope, err error, text string) Result {
	p.log(context.Background(), slog.LevelInfo, text, msg, env, errAttr(err))
	return Result{Outcome: OutcomeLeftForRedelivery, Attempt: env.Attempt, SettleErr: err}
}

// runHandler runs the handler. It reports the handler's error and whether the lock was lost while it
// ran (in which case nothing may be settled with this delivery's lock).
func (p *Processor) runHandler(ctx context.Context, lk *lockKeeper, sl slots, msg *azservicebus.ReceivedMessage, env *Envelope) (err error, lockLost bool) {
	parent, worker := ctx, context.Context(nil)
	if sl != nil {
		parent, worker = sl.handlerParent(ctx)
	}
	hctx, cancel := context.WithCancelCause(withEnvelope(parent, env))
	if worker != nil {
		sl.runsHandler(lk)
	}
	lk.watchHandler(cancel, worker)
	err = p.callHandler(hctx, msg)
	lk.unwatchHandler()
	if worker != nil {
		sl.runsHandler(nil)
	}
	cancel(nil)
	return err, lk.lost()
}

// callHandler calls the handler, turning a panic into an error so that one bad message cannot crash the
// consumer; the panicking delivery counts as a failed attempt.
func (p *Processor) callHandler(ctx context.Context, msg *azservicebus.ReceivedMessage) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrHandlerPanic, r)
		}
	}()
	return p.handler(ctx, msg)
}

// decideFailure decides between retry and dead-letter after a failed attempt.
func (p *Processor) decideFailure(ob *observed, msg *azservicebus.ReceivedMessage, env *Envelope, herr error, now time.Time) *decision {
	cfg := p.cfg
	switch {
	case IsPermanent(herr):
		return p.deadLetterDecision(env, msg, cfg.reasons.Permanent, herr, now, true)
	case env.Attempt >= cfg.maxAttempts:
		return p.deadLetterDecision(env, msg, cfg.reasons.MaxAttempts, herr, now, true)
	case hasNonDataBody(msg):
		return p.deadLetterDecision(env, msg, cfg.reasons.UnsupportedBody, herr, now, true)
	}

	delay := p.delay(env.Attempt, herr)
	at := now.Add(delay)
	if cfg.retryBudget > 0 && !env.FirstEnqueuedTime.IsZero() && at.After(env.FirstEnqueuedTime.Add(cfg.retryBudget)) {
		return p.deadLetterDecision(env, msg, cfg.reasons.BudgetExhausted, herr, now, true)
	}
	// Service Bus counts a TimeToLive from the (scheduled) enqueue time, so a copy that carried the
	// original TTL would silently extend the producer's deadline by every delay. The copy gets what is
	// left of the producer's lifetime instead, and a retry that would be due after it is refused.
	var ttl *time.Duration
	switch {
	case cfg.ignoreExpiry:
		if msg.TimeToLive != nil && *msg.TimeToLive > 0 {
			t := *msg.TimeToLive
			ttl = &t
		}
	case !env.ExpiresAt.IsZero():
		if !at.Before(env.ExpiresAt) {
			return p.deadLetterDecision(env, msg, cfg.reasons.Expired, herr, now, true)
		}
		// A TimeToLive travels as 32-bit milliseconds; no honest expiry leaves more, so a larger one is a
		// forged property and is cut rather than wrapped around into a copy that dies at once.
		left := min(env.ExpiresAt.Sub(at), maxTimeToLive)
		if left < time.Millisecond {
			// Whole milliseconds on the wire, and 0 means no TTL: a copy with less left would never expire.
			return p.deadLetterDecision(env, msg, cfg.reasons.Expired, herr, now, true)
		}
		ttl = &left
	}

	next := env.Attempt + 1
	errText := p.errorText(herr)
	copyMsg := retryCopy(msg, *env, next, errText, ttl)
	if hook := cfg.hooks.OnRetryCopy; hook != nil {
		id := *copyMsg.MessageID
		hook(RetryCopyParams{Context: ob.ctx, Message: msg, Envelope: *env, Copy: copyMsg, Attempt: next, ScheduledFor: at})
		copyMsg.MessageID = &id    // the id is the chain's: a hook may add properties, not rename the copy
		ob.now = p.cfg.clock.Now() // the hook's time counts against the lock
	}
	if !fitsLimits(copyMsg, cfg.maxMessageSize) {
		return p.deadLetterDecision(env, msg, cfg.reasons.MessageTooLarge, herr, now, false)
	}
	return &decision{kind: decideRetry, env: env, handlerErr: herr,
		retryPlan: &retryPlan{copyMsg: copyMsg, nextTry: next, delay: delay, at: at, errText: errText}}
}

// maxTimeToLive is the largest TimeToLive the AMQP header can carry (its ttl field is a uint in ms).
const maxTimeToLive = time.Duration(math.MaxUint32) * time.Millisecond

// delay is the wait before the attempt after attempt n: the backoff's, or the handler's RetryAfter,
// always within [0, the backoff's cap]. A custom Backoff's delays are bounded the same way, so that a
// bug in it cannot schedule in the past or beyond the duplicate-detection window sized for the cap.
func (p *Processor) delay(n int, herr error) time.Duration {
	d := p.cfg.backoff.Delay(n)
	var ra *RetryAfterError
	if errors.As(herr, &ra) {
		d = ra.Delay
	}
	return min(max(d, 0), p.cfg.maxDelay)
}

// errorText renders a handler error for the broker (the last-error property and the dead-letter
// description): through Options.ErrorText if set, always redacted and truncated.
func (p *Processor) errorText(err error) string {
	if err == nil {
		return ""
	}
	text := ""
	if r := p.cfg.errorText; r != nil {
		text = r(err)
	} else {
		text = err.Error()
	}
	return truncate(redact.String(text), p.cfg.descriptionLimit)
}

// deadLetterDecision builds a dead-letter decision with our reason. The dead letter carries the final
// attempt, the time, the reason and (unless the message is already at the header limits) the last
// error as application properties, so that an operator sees what happened without decoding anything.
func (p *Processor) deadLetterDecision(env *Envelope, msg *azservicebus.ReceivedMessage, reason string, cause error, now time.Time, withError bool) *decision {
	desc := p.errorText(cause)
	props := map[string]any{
		PropDeadLetterAttempt: int64(env.Attempt),
		PropDeadLetterTime:    now.UTC(),
		PropDeadLetterReason:  reason,
	}
	if withError {
		props[PropLastError] = desc
		if env.Source != "" {
			props[PropSource] = env.Source
		}
		if _, ok := msg.ApplicationProperties[PropFirstSequenceNumber]; !ok {
			props[PropFirstSequenceNumber] = env.FirstSequenceNumber
		}
		// A first delivery carries no envelope yet: record its key and correlation id, so that an
		// operator finds the dead letter by them as by a retry copy's; unless they would take the
		// message's properties over the header limit, where the dead-letter itself would fail.
		identity := map[string]any{}
		for name, v := range map[string]string{PropKey: env.Key, PropCorrelationID: env.CorrelationID, PropOriginalMessageID: env.OriginalMessageID} {
			if _, ok := msg.ApplicationProperties[name]; !ok && v != "" {
				identity[name] = v
			}
		}
		if propertiesSize(msg.ApplicationProperties)+propertiesSize(props)+propertiesSize(identity) <= maxHeaderSize {
			maps.Copy(props, identity)
		}
	}
	return &decision{kind: decideDeadLetter, env: env, handlerErr: cause, deadLetterPlan: &deadLetterPlan{reason: reason, desc: desc, props: props}}
}

// apply carries out d with this delivery's lock.
func (p *Processor) apply(ob *observed, settleBase context.Context, lk *lockKeeper, f *flight, settler Settler, sender Sender, msg *azservicebus.ReceivedMessage, d *decision, res *Result) {
	switch d.kind {
	case decideComplete:
		p.settleComplete(ob, lk, settler, msg, *d.env, res)
	case decideRetry:
		p.settleRetry(ob, settleBase, lk, f, settler, sender, msg, d, res)
	case decideDeadLetter:
		p.settleDeadLetter(ob, lk, settler, msg, d, res)
	}
}

// slowSettle is how long a settle call must take before its success is doubted (see lockBound): the
// SDK's first retry of a settle waits about 4 s, a settle that is not retried takes milliseconds.
const slowSettle = 2 * time.Second

// errLockGone is returned for a settle call not made because the lock had already run out or a
// redelivery superseded it: the call could only fail.
var errLockGone = fmt.Errorf("%w: not settling with an expired lock", ErrLockLost)

// lockBound runs one settle call that needs the lock, unless the lock is already gone. ob.now is the
// time the call starts; it is moved to the time it returned.
func (p *Processor) lockBound(ob *observed, lk *lockKeeper, call func(ctx context.Context) error) error {
	start := ob.now
	if !lk.alive(start) {
		return errLockGone
	}
	sc := &ob.call
	if !sc.deadline.IsZero() {
		sc = new(settleCall) // a second lock-bound call of one delivery
	}
	d := lk.beginSettle(sc, ob.detached, p.cfg.settleTimeout, start, p.realClock)
	err := p.bounded(ob, lk.base, sc, d, call)
	lk.endSettle()
	ob.now = p.cfg.clock.Now()
	if err == nil && ob.now.Sub(start) >= slowSettle {
		// azservicebus v1.11 with go-amqp v1.7 can report a settle as done after the broker rejected it
		// (a busy broker's rejection marks the delivery settled, and the SDK's retry then sends nothing):
		// the message is redelivered although the call returned nil. Only a settle that the SDK retried
		// takes this long, so its outcome is remembered like a failed one, for the redelivery.
		lk.slowSettle.Store(true)
	}
	if err != nil && lk.lost() {
		return fmt.Errorf("%w: %w", ErrLockLost, err)
	}
	return err
}

// bounded runs one broker call with sc as its context, ended after d (at sc's deadline): by the
// consumer, which is told about the call so that a shutdown that gives up (it cancels base) ends it too,
// or, for Process, by a pooled timer.
func (p *Processor) bounded(ob *observed, base context.Context, sc *settleCall, d time.Duration, call func(ctx context.Context) error) error {
	var tm *reusableTimer
	if ob.sl != nil {
		ob.sl.startCall(sc)
	} else {
		tm = p.callTimer()
		tm.arm(d, sc)
	}
	if base.Err() != nil {
		sc.end(context.Canceled) // the shutdown gave up just now
	}
	err := call(sc)
	if tm != nil {
		tm.disarm()
		p.timers.Put(tm)
	} else {
		ob.sl.endCall()
	}
	sc.end(context.Canceled)
	return err
}

// newCall returns the context of a broker call that is not lock-bound, due to end after d.
func (p *Processor) newCall(ob *observed, d time.Duration) *settleCall {
	now := ob.now
	if !p.realClock {
		now = time.Now()
	}
	return &settleCall{values: ob.detached, deadline: now.Add(d)}
}

// settleRetry schedules the copy (unless an earlier delivery already did), then completes the original.
func (p *Processor) settleRetry(ob *observed, settleBase context.Context, lk *lockKeeper, f *flight, settler Settler, sender Sender, msg *azservicebus.ReceivedMessage, d *decision, res *Result) {
	env := *d.env
	res.Delay, res.ScheduledFor, res.RetryMessageID = d.delay, d.at, *d.copyMsg.MessageID
	if !d.scheduled {
		if !lk.alive(ob.now) {
			// A redelivery will run the attempt again; scheduling now could only make a second successor.
			res.Outcome, res.SettleErr = OutcomeLeftForRedelivery, errLockGone
			return
		}
		if settleBase.Err() != nil {
			res.Outcome, res.SettleErr = OutcomeLeftForRedelivery, context.Cause(settleBase)
			return
		}
		// Not lock-bound: once started, the schedule's outcome must be known, so it is bounded only by
		// the settle timeout.
		sc := p.newCall(ob, p.cfg.settleTimeout)
		var seqs []int64
		err := p.brokerCall(ob, SettleSchedule, res.RetryMessageID, msg, env, func() error {
			return p.bounded(ob, settleBase, sc, p.cfg.settleTimeout, func(ctx context.Context) (err error) {
				seqs, err = sender.ScheduleMessages(ctx, []*azservicebus.Message{d.copyMsg}, d.at, nil)
				return err
			})
		})
		ob.now = p.cfg.clock.Now()
		if err != nil {
			res.Outcome = OutcomeLeftForRedelivery
			res.SettleErr = err
			if f != nil {
				f.setDecision(nil) // the attempt must run again
			}
			p.log(settleBase, slog.LevelError, "republishing the retry failed; the original stays for redelivery", msg, env,
				slog.Int("next_attempt", d.nextTry), errAttr(err), slog.String("handler_error", d.errText))
			return
		}
		var seq int64
		if len(seqs) > 0 {
			seq = seqs[0]
		}
		if f != nil {
			f.markScheduled(d, seq)
		} else {
			d.scheduled, d.seq = true, seq
		}
		p.log(settleBase, slog.LevelInfo, "retry scheduled", msg, env,
			slog.Int("next_attempt", d.nextTry), slog.Duration("delay", d.delay), slog.Time("scheduled_for", d.at),
			slog.String("retry_message_id", res.RetryMessageID), slog.Int64("retry_sequence_number", seq), slog.String("handler_error", d.errText))
	}
	res.SequenceNumber = d.seq
	err := p.lockBound(ob, lk, func(ctx context.Context) error {
		return p.brokerCall(ob, SettleComplete, "", msg, env, func() error { return settler.CompleteMessage(ctx, msg, nil) })
	})
	if err != nil {
		res.Outcome = OutcomeLeftForRedelivery
		res.SettleErr = err
		res.PossibleDuplicate = true
		p.log(settleBase, slog.LevelWarn, "retry scheduled but completing the original failed; its redelivery will be completed without running the handler", msg, env, errAttr(err))
		return
	}
	res.Outcome = OutcomeRetryScheduled
}

// settleComplete completes a successful delivery.
func (p *Processor) settleComplete(ob *observed, lk *lockKeeper, settler Settler, msg *azservicebus.ReceivedMessage, env Envelope, res *Result) {
	err := p.lockBound(ob, lk, func(ctx context.Context) error {
		return p.brokerCall(ob, SettleComplete, "", msg, env, func() error { return settler.CompleteMessage(ctx, msg, nil) })
	})
	if err != nil {
		res.Outcome = OutcomeLeftForRedelivery
		res.SettleErr = err
		level := slog.LevelError
		if brokerWillRedeliver(err) || errors.Is(err, ErrLockLost) {
			level = slog.LevelWarn
		}
		p.log(context.Background(), level, "completing the message failed; the broker will redeliver it", msg, env, errAttr(err))
		return
	}
	res.Outcome = OutcomeCompleted
	p.log(context.Background(), slog.LevelDebug, "message completed", msg, env)
}

// settleDeadLetter dead-letters msg with d's reason; on failure the message stays for redelivery.
func (p *Processor) settleDeadLetter(ob *observed, lk *lockKeeper, settler Settler, msg *azservicebus.ReceivedMessage, d *decision, res *Result) {
	res.DeadLetterReason = d.reason
	reason, desc := d.reason, d.desc
	err := p.lockBound(ob, lk, func(ctx context.Context) error {
		return p.brokerCall(ob, SettleDeadLetter, "", msg, *d.env, func() error {
			return settler.DeadLetterMessage(ctx, msg, &azservicebus.DeadLetterOptions{Reason: &reason, ErrorDescription: &desc, PropertiesToModify: d.props})
		})
	})
	if err != nil {
		res.Outcome = OutcomeLeftForRedelivery
		res.SettleErr = err
		p.log(ob.detached, slog.LevelError, "dead-lettering failed; the message stays for redelivery", msg, *d.env, slog.String("reason", reason), errAttr(err))
		return
	}
	res.Outcome = OutcomeDeadLettered
	p.log(ob.detached, slog.LevelWarn, "message dead-lettered", msg, *d.env, slog.String("reason", reason), slog.String("description", desc))
}

// seed fills what a first delivery's envelope lacks: the key, the correlation id (the message's
// CorrelationID, else the key) and the chain's identity (this processor's entity and the delivery's
// sequence number). A copy written before v0.2 has no chain identity either; its chain is re-based on
// its own delivery, whose sequence number is as stable across redeliveries.
func seed(msg *azservicebus.ReceivedMessage, env Envelope, entity string, key func(*azservicebus.ReceivedMessage) string) Envelope {
	if env.Key == "" {
		env.Key = key(msg)
		if len(env.Key) > maxEnvelopeString {
			sum := sha256.Sum256([]byte(env.Key))
			env.Key = "sha256-" + hex.EncodeToString(sum[:])
		}
	}
	if env.CorrelationID == "" {
		env.CorrelationID = env.Key
		if msg.CorrelationID != nil && *msg.CorrelationID != "" && len(*msg.CorrelationID) <= maxEnvelopeString {
			env.CorrelationID = *msg.CorrelationID
		}
	}
	if env.Source == "" {
		env.Source = entity
	}
	if env.FirstSequenceNumber < 0 && msg.SequenceNumber != nil {
		env.FirstSequenceNumber = *msg.SequenceNumber
	}
	return env
}

// idempotencyKey returns the configured key, falling back to the sequence number and then the lock
// token so that a message without a MessageID still gets a stable key.
func (p *Processor) idempotencyKey(msg *azservicebus.ReceivedMessage) string {
	if p.cfg.userKey {
		return p.userIdempotencyKey(msg)
	}
	return keyOrFallback(defaultKey(msg), msg)
}

// userIdempotencyKey is idempotencyKey with Options.IdempotencyKey, which may panic.
func (p *Processor) userIdempotencyKey(msg *azservicebus.ReceivedMessage) (key string) {
	defer func() {
		if r := recover(); r != nil {
			key = msg.MessageID // a panicking IdempotencyKey must not take the consumer down
			p.log(context.Background(), slog.LevelError, "Options.IdempotencyKey panicked; using the MessageID", msg, Envelope{}, slog.Any("panic", r))
		}
	}()
	return keyOrFallback(p.cfg.key(msg), msg)
}

// keyOrFallback returns k, or, if it is empty, the sequence number and then the lock token.
func keyOrFallback(k string, msg *azservicebus.ReceivedMessage) string {
	if k != "" {
		return k
	}
	if msg.SequenceNumber != nil {
		return fmt.Sprintf("seq-%d", *msg.SequenceNumber)
	}
	return fmt.Sprintf("lock-%x", msg.LockToken)
}

// hasNonDataBody reports a body the SDK exposes only through RawAMQPMessage, which an
// azservicebus.Message copy cannot carry byte for byte: an AMQP value, an AMQP sequence, or more than
// one data section (the SDK fills ReceivedMessage.Body only for exactly one; with several, Body is nil
// and a copy would silently lose the content).
func hasNonDataBody(msg *azservicebus.ReceivedMessage) bool {
	raw := msg.RawAMQPMessage
	return raw != nil && (raw.Body.Value != nil || len(raw.Body.Sequence) > 0 || len(raw.Body.Data) > 1)
}

// finish reports res to the OnProcessed hook and returns it, so every path through Process is
// observed exactly once.
func (p *Processor) finish(ob *observed, msg *azservicebus.ReceivedMessage, env Envelope, res Result) Result {
	if hook := p.cfg.hooks.OnProcessed; hook != nil {
		hook(ProcessedParams{
			Context: ob.ctx, Message: msg, Envelope: env, Result: res, EntityPath: ob.entity,
			HandlerDuration: ob.handler, Duration: p.cfg.clock.Now().Sub(ob.start),
		})
	}
	return res
}

// observed is what the hooks see of one delivery besides the message: the context OnStart returned, the
// entity, when processing started and how long the handler ran.
type observed struct {
	ctx     context.Context
	entity  string
	start   time.Time
	handler time.Duration
	// now is the latest time read for this delivery: at the start, after the handler, after each
	// broker call. Reading the clock once per step instead of once per use is measurable.
	now time.Time
	// detached is the settle base without its cancellation, for the settle calls' contexts.
	detached context.Context
	// call is the context of the delivery's lock-bound settle call.
	call settleCall
	// sl is the consumer's hold on the delivery's slots, nil for Process.
	sl slots
}

// started runs the OnStart hook, whose context becomes the delivery's.
func (p *Processor) started(ob *observed, msg *azservicebus.ReceivedMessage, env Envelope) context.Context {
	if hook := p.cfg.hooks.OnStart; hook != nil {
		if hctx := hook(StartParams{Context: ob.ctx, Message: msg, Envelope: env, EntityPath: ob.entity, Time: ob.start}); hctx != nil {
			ob.ctx = hctx
		}
	}
	return ob.ctx
}

// brokerCall runs one broker call made for a delivery and reports it to the OnSettle hook; copyID is
// the retry copy's MessageID when the call schedules it.
func (p *Processor) brokerCall(ob *observed, op, copyID string, msg *azservicebus.ReceivedMessage, env Envelope, call func() error) error {
	hook := p.cfg.hooks.OnSettle
	if hook == nil {
		return call()
	}
	start := p.cfg.clock.Now()
	err := call()
	hook(SettleParams{Context: ob.ctx, Message: msg, Envelope: env, EntityPath: ob.entity, Operation: op, RetryMessageID: copyID,
		Start: start, Duration: p.cfg.clock.Now().Sub(start), Err: err})
	return err
}

// log writes one line with the message's identity. Bodies are never logged.
func (p *Processor) log(ctx context.Context, level slog.Level, text string, msg *azservicebus.ReceivedMessage, env Envelope, attrs ...slog.Attr) {
	lg := p.cfg.logger
	if !lg.Enabled(ctx, level) {
		return
	}
	base := []slog.Attr{
		slog.String("message_id", msg.MessageID),
		slog.String("correlation_id", env.CorrelationID),
		slog.Int("attempt", env.Attempt),
	}
	if msg.SequenceNumber != nil {
		base = append(base, slog.Int64("sequence_number", *msg.SequenceNumber))
	}
	lg.LogAttrs(ctx, level, text, append(base, attrs...)...)
}

// errAttr renders err with secrets redacted.
func errAttr(err error) slog.Attr {
	if err == nil {
		return slog.String("error", "")
	}
	return slog.String("error", redact.String(err.Error()))
}
