package retry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/redact"
)

// The way of one delivery through the processor, stage by stage: Process and process (the stages in
// order), then each stage. The types they work on are processor.go's; what they call is below them:
// lockrenewer.go (the lock), flights.go (deliveries in flight), decision.go (what a failure becomes),
// settle.go (the broker calls), observe.go (hooks and log). None of those calls back up here.

// Process handles msg, received in peek-lock mode through settler. It calls the handler with a context
// that carries the [envelope.Envelope] and is cancelled when ctx ends or the lock is lost. The lock is renewed
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
	return p.process(ctx, context.WithoutCancel(ctx), msg, route{settler: settler, sender: p.sender, entity: p.entity}, nil)
}

// process is Process with the consumer's extras: settleBase is the context every settle, renewal and
// republish belongs to (the consumer cancels it when it gives up on a shutdown, so that nothing is
// settled after Run returned); slot, if set, is the delivery's handler slot: taken before the handler
// runs, given back once it has returned, before the message is settled.
//
// The stages, in order, each in a function of its own below: decode the envelope (a malformed one is
// dead-lettered), keep the lock, wait for an earlier delivery of the same message (and inherit its
// outcome), hold the message if the outage breaker is open, take a handler slot and pass the breaker
// (admit), run the handler with its immediate retries (attempts), conclude: decide and settle. The
// result is reported once, by finish, here.
func (p *Processor) process(ctx, settleBase context.Context, msg *azservicebus.ReceivedMessage, rt route, slot handlerSlot) (res Result) {
	if msg == nil {
		return Result{Outcome: OutcomeLeftForRedelivery, SettleErr: ErrNilMessage}
	}
	if slot == nil {
		slot = noSlot{}
	}
	now := p.cfg.clock.Now()
	d := &delivery{msg: msg, route: rt, ctx: ctx, start: now, now: now}
	defer func() { d.ctx, d.base = nil, nil }()
	if isProbe(msg) {
		// A connection check's probe whose cancellation was lost: not a user's message.
		slot.release()
		return p.finish(d, envelope.Envelope{Attempt: 1, OriginalMessageID: msg.MessageID, FirstSequenceNumber: -1}, p.completeProbe(settleBase, d))
	}
	env, envErr := envelope.Decode(msg)
	if envErr != nil {
		slot.release()
		return p.finish(d, d.env, p.deadLetterMalformed(d, settleBase, env, envErr))
	}
	d.env = seed(msg, env, rt.entity, p.idempotencyKey)
	res.Attempt = d.env.Attempt
	// ctx is the caller's context: its cancellation is a shutdown. The handler's context (OnStart's,
	// and whatever the handler derives from it) may carry deadlines of its own, and a deadline that
	// expires is a failed attempt, never a shutdown.
	hctx := p.started(d)
	p.keepLock(d, settleBase, now)
	defer d.lock.stop()

	// One handling per message at a time: a redelivery of a message still in flight here takes over.
	var f *flight
	if key, ok := keyOf(rt.entity, msg); ok {
		f = &d.flight
		prior := p.flights.enter(f, key, &d.lock, now)
		defer func() {
			unsettled := res.Outcome == OutcomeLeftForRedelivery || d.lock.slowSettle.Load()
			p.flights.leave(f, unsettled, d.now, p.rememberFor(&d.lock))
		}()
		if prior != nil {
			slot.release() // waiting for the earlier delivery must not keep other messages from their handlers
			if out, env, done := p.takeOver(d, settleBase, f, prior, ctx); done {
				return p.finish(d, env, out)
			}
		}
	}
	// While the outage breaker is open, a message is held for later instead of spending an attempt: at
	// once if it is open now, else once a handler slot is free, which is when it could start.
	if p.outage.holding() {
		slot.release()
		return p.finish(d, d.env, p.hold(d, settleBase, f, nil, res))
	}
	adm, out, ok := p.admitted(d, settleBase, f, ctx, slot, res)
	if !ok {
		return p.finish(d, d.env, out)
	}
	run := p.attempts(d, ctx, hctx, adm, res)
	slot.release()
	if run.held {
		return p.finish(d, d.env, p.hold(d, settleBase, f, run.res.HandlerErr, run.res))
	}
	return p.finish(d, d.env, p.conclude(d, settleBase, f, run))
}

// deadLetterMalformed dead-letters a message whose retry properties cannot be trusted to count its
// attempts, without calling the handler (guessing could loop for ever).
func (p *Processor) deadLetterMalformed(d *delivery, settleBase context.Context, env envelope.Envelope, envErr error) Result {
	res := Result{Attempt: env.Attempt}
	d.env = envelope.Envelope{OriginalMessageID: d.msg.MessageID, FirstSequenceNumber: -1}
	p.keepLock(d, settleBase, d.now)
	defer d.lock.stop()
	p.started(d)
	p.settleDeadLetter(d, p.deadLetterDecision(&d.env, d.msg, p.cfg.reasons.InvalidEnvelope, envErr, d.now, false), &res)
	return res
}

// takeOver waits for the earlier deliveries of d's message still in this process and, if one of them
// decided an outcome it could not settle, applies it with d's lock without running the handler. done
// is false when the handler is to run.
func (p *Processor) takeOver(d *delivery, settleBase context.Context, f, prior *flight, stop context.Context) (res Result, env envelope.Envelope, done bool) {
	inherited, left, ok := p.awaitEarlier(d, prior, stop, d.lock.Done())
	if !ok {
		return left, d.env, true
	}
	if inherited == nil {
		return Result{}, d.env, false
	}
	f.setDecision(inherited)
	res = Result{Attempt: inherited.env.Attempt, HandlerErr: inherited.handlerErr, Inherited: true}
	p.cfg.log(d.ctx, slog.LevelInfo, "redelivery of a message whose outcome was already decided here; applying it without running the handler", d.msg, *inherited.env)
	p.apply(d, settleBase, f, inherited, &res)
	return res, *inherited.env, true
}

// admitted takes d's handler slot (a message received ahead of a free one waits here, its lock kept)
// and asks the outage breaker to let the handler run. ok is false when the delivery ends here, with
// out its result: stopped or lock lost meanwhile, or held because the breaker is open.
func (p *Processor) admitted(d *delivery, settleBase context.Context, f *flight, stop context.Context, slot handlerSlot, res Result) (adm admission, out Result, ok bool) {
	if !slot.acquire(stop, &d.lock) {
		d.now = p.cfg.clock.Now()
		return adm, p.leftForRedelivery(d, slotLostCause(&d.lock, stop), "stopped or lock lost while waiting for a handler slot"), false
	}
	adm, ok = p.admit(d, stop)
	switch {
	case !ok:
		slot.release()
		return adm, p.leftForRedelivery(d, slotLostCause(&d.lock, stop), "stopped or lock lost while the outage breaker probed"), false
	case adm.kind == admitHold:
		slot.release()
		return adm, p.hold(d, settleBase, f, nil, res), false
	}
	return adm, Result{}, true
}

// attemptsRun is what the handler's calls in one delivery came to.
type attemptsRun struct {
	res        Result
	handlerErr error
	lockLost   bool
	// dec is the failure's decision, nil on success, when the lock was lost, or when a shutdown ended
	// the attempts. held is true when the outage breaker takes the failure instead (no attempt spent).
	dec  *decision
	held bool
}

// attempts runs the handler, and again after each failure the policy retries at once (immediate
// retries, each with a fresh OnStart context), until a success, a failure to decide on, a lost lock or
// a shutdown (stop cancelled).
func (p *Processor) attempts(d *delivery, stop, hctx context.Context, adm admission, res Result) attemptsRun {
	clk := p.cfg.clock
	for {
		handlerStart := clk.Now()
		handlerErr, lockLost := p.runHandler(hctx, d)
		d.now = clk.Now()
		d.handlerTime += d.now.Sub(handlerStart)
		res.HandlerErr = handlerErr
		if handlerErr == nil || lockLost || stopped(stop) {
			out := attemptNone
			if handlerErr == nil && !lockLost {
				out = attemptSuccess
			}
			p.outage.record(adm, out, nil)
			return attemptsRun{res: res, handlerErr: handlerErr, lockLost: lockLost}
		}
		// A failed attempt: its policy decides, unless the breaker is open, in which case a failure
		// that counts toward it is held for later without spending the attempt.
		pol := p.cfg.policyFor(handlerErr)
		res.Policy = pol.name
		counts := p.countsAsOutage(handlerErr, pol)
		out := attemptNeutral
		if counts {
			out = attemptFailure
		}
		open := p.outage.record(adm, out, handlerErr)
		if (open && counts) || (counts && p.lastAttemptInAnOutage(d, pol, handlerErr)) || (open && p.retryAtOnce(d, pol, res.ImmediateRetries, handlerErr)) {
			// The breaker is open (no attempt is spent, and no immediate retry calls the dependency that
			// is down), or it may be about to open: see lastAttemptInAnOutage.
			return attemptsRun{res: res, handlerErr: handlerErr, held: true}
		}
		// A deadline that ended the caller's context is a failed attempt, and no time for another.
		if !p.retryAtOnce(d, pol, res.ImmediateRetries, handlerErr) || stop.Err() != nil {
			return attemptsRun{res: res, handlerErr: handlerErr, dec: p.decideFailure(d, handlerErr, pol)}
		}
		if !p.waitImmediate(d, stop, pol.immDelay) {
			if !stopped(stop) && !d.lock.ended() {
				// The caller's deadline passed while waiting.
				return attemptsRun{res: res, handlerErr: handlerErr, dec: p.decideFailure(d, handlerErr, pol)}
			}
			// Stopped, or the lock ended, meanwhile: conclude leaves it for redelivery.
			return attemptsRun{res: res, handlerErr: handlerErr, lockLost: d.lock.lost()}
		}
		// The next attempt runs now, in this delivery: the envelope moves on as a retry copy's would.
		d.env.Attempt++
		d.env.LastError = p.errorText(handlerErr)
		res.Attempt, res.ImmediateRetries = d.env.Attempt, res.ImmediateRetries+1
		adm = admission{kind: admitRun}
		hctx = p.startAttempt(d, res.ImmediateRetries, d.now)
	}
}

// conclude turns what the attempts came to into the delivery's result: a success is completed, a
// failure settled as decided; a lost lock or a shutdown leaves the message for redelivery (a success
// whose complete the lost lock made impossible is remembered, so that the redelivery here completes
// it without running the handler again).
func (p *Processor) conclude(d *delivery, settleBase context.Context, f *flight, run attemptsRun) Result {
	res, dec := run.res, run.dec
	switch {
	case run.lockLost:
		res.Outcome, res.SettleErr = OutcomeLeftForRedelivery, ErrLockLost
		dec = nil
		if run.handlerErr == nil {
			// The work is done; only the complete is impossible. Remember it, so the redelivery here
			// completes without running the handler again.
			dec = &d.dec
			*dec = decision{kind: decideComplete, env: &d.env}
		}
		p.cfg.log(d.ctx, slog.LevelWarn, "message lock lost while the handler ran; the broker will redeliver it", d.msg, d.env)
	case run.handlerErr == nil:
		dec = &d.dec
		*dec = decision{kind: decideComplete, env: &d.env}
	case dec == nil:
		// Shutdown cancelled the handler, or ended an immediate retry's wait (as did a lock that ran
		// out): leave the message for redelivery rather than count an attempt.
		res.Outcome = OutcomeLeftForRedelivery
		p.cfg.log(d.ctx, slog.LevelInfo, "handler failed during shutdown; the broker will redeliver the message", d.msg, d.env, errAttr(run.handlerErr))
	}
	if f != nil && dec != nil {
		f.setDecision(dec)
	}
	if dec != nil && !run.lockLost {
		p.apply(d, settleBase, f, dec, &res)
	}
	return res
}

// admit asks the outage breaker whether d may run its handler, waiting while another delivery probes;
// ok is false when stop ended or the lock did meanwhile.
func (p *Processor) admit(d *delivery, stop context.Context) (adm admission, ok bool) {
	for {
		adm, changed := p.outage.admit()
		if adm.kind != admitWait {
			return adm, true
		}
		select {
		case <-changed:
		case <-stop.Done():
			return adm, false
		case <-d.lock.Done():
			return adm, false
		}
		d.now = p.cfg.clock.Now()
	}
}

// retryAtOnce reports whether a failed attempt gets an immediate retry under pol: one is left (done
// so far), the policy retries, the handler did not ask for a delay of its own ([RetryAfter]), and the
// message has attempts left.
func (p *Processor) retryAtOnce(d *delivery, pol policy, done int, herr error) bool {
	return immediateLeft(pol, done, herr) && pol.action == ActionRetry && !IsPermanent(herr) && d.env.Attempt < pol.maxAttempts
}

// immediateLeft reports whether the failure herr may be retried after pol's ImmediateDelay instead of
// its backoff: an immediate retry is left (done so far), and the handler did not answer with
// [RetryAfter], which ends the immediate retries (a 429 asks for its delay, not another call now).
func immediateLeft(pol policy, done int, herr error) bool {
	var ra *RetryAfterError
	return done < pol.immediate && !errors.As(herr, &ra)
}

// waitImmediate waits delay before an immediate retry; false if the caller stopped or the lock ended
// meanwhile.
func (p *Processor) waitImmediate(d *delivery, stop context.Context, delay time.Duration) bool {
	if delay > 0 {
		ch, stopTimer := timerChan(p.cfg.clock, delay)
		defer stopTimer()
		select {
		case <-ch:
		case <-stop.Done():
		case <-d.lock.Done():
		}
	}
	d.now = p.cfg.clock.Now()
	return stop.Err() == nil && !d.lock.ended()
}

// lastAttemptInAnOutage reports whether a counted failure that would dead-letter d's message for its
// attempts should be held once instead: the breaker is closed but the failure before this one failed
// too, so an outage may be starting, and the breaker cannot know yet. Without this, the messages whose
// last attempt falls in the moments before a trip would be dead-lettered because of the outage. It
// applies once per message: a copy that was held already (PropHeld) is dead-lettered as usual, so a
// message that keeps failing alone is not held for ever.
func (p *Processor) lastAttemptInAnOutage(d *delivery, pol policy, herr error) bool {
	if pol.action != ActionRetry || IsPermanent(herr) || d.env.Attempt < pol.maxAttempts || !p.outage.suspects() {
		return false
	}
	_, held := d.msg.ApplicationProperties[envelope.PropHeld]
	return !held
}

// countsAsOutage reports whether a handler error counts toward the outage breaker: not a permanent
// one, not one a NotOutage policy took, and not one Outage.Counts refuses.
func (p *Processor) countsAsOutage(err error, pol policy) bool {
	oc := p.cfg.outage
	if oc == nil || IsPermanent(err) || pol.notOutage || pol.action != ActionRetry {
		return false
	}
	if oc.counts == nil {
		return true
	}
	counts := false
	func() {
		defer func() {
			if r := recover(); r != nil {
				p.cfg.logger.Error("Outage.Counts panicked; counting the failure", "panic", redact.String(fmt.Sprint(r)))
				counts = true
			}
		}()
		counts = oc.counts(err)
	}()
	return counts
}

// awaitEarlier waits for every earlier delivery of d's message still in this process, newest first,
// after telling each that it has been superseded (its lock is gone: the broker redelivers only once a
// lock has ended). It returns the decision of the first that has one, to be applied with d's lock
// instead of running the handler again; nil if none decided. ok is false when d must stop (its lock was
// lost: lockDone, the message's lock or a session's; or stop ended), with left its result.
//
// Waiting for all of them, not just the latest, matters: one that gave up waiting leaves its own earlier
// one running, and that one's decision is the one to apply.
func (p *Processor) awaitEarlier(d *delivery, prior *flight, stop context.Context, lockDone <-chan struct{}) (inherited *decision, left Result, ok bool) {
	for pr := prior; pr != nil && inherited == nil; pr = p.flights.priorOf(pr) {
		pr.supersede()
		select {
		case <-pr.finished():
		case <-lockDone:
			d.now = p.cfg.clock.Now()
			return nil, p.leftForRedelivery(d, ErrLockLost, "lock lost while waiting for an earlier delivery of the message"), false
		case <-stop.Done():
			d.now = p.cfg.clock.Now()
			return nil, p.leftForRedelivery(d, stop.Err(), "stopped while waiting for an earlier delivery of the message"), false
		}
		inherited = pr.decision()
	}
	d.now = p.cfg.clock.Now()
	return inherited, Result{}, true
}

// runHandler runs the handler under ctx, cancelled also when the lock is lost. It reports the handler's
// error and whether the lock was lost while it ran (in which case nothing may be settled with this
// delivery's lock).
func (p *Processor) runHandler(ctx context.Context, d *delivery) (err error, lockLost bool) {
	hctx, cancel := context.WithCancelCause(envelope.NewContext(ctx, &d.env))
	d.lock.followHandler(cancel)
	err = p.callHandler(hctx, d.msg)
	d.lock.followHandler(nil)
	cancel(nil)
	return err, d.lock.lost()
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

// stopped reports whether the caller's context was cancelled: only that is a shutdown, which leaves a
// failed delivery for redelivery without counting its attempt. A context that ended at its deadline
// (a caller's per-message timeout) makes the failure a failed attempt, as a handler's own timeout does:
// otherwise a handler that keeps timing out would be redelivered at once, with no backoff, until the
// broker dead-letters it for its delivery count.
func stopped(ctx context.Context) bool { return errors.Is(ctx.Err(), context.Canceled) }

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

// rememberFor is how long an unsettled outcome is kept for its redelivery: long enough for the lock
// to run out and the message to come back.
func (p *Processor) rememberFor(lk *lockKeeper) time.Duration {
	lk.mu.Lock() // a renewal may be changing the granted duration (a session's lock is still kept)
	dur := lk.dur
	lk.mu.Unlock()
	return max(minRememberOutcome, 2*dur+2*p.cfg.settleTimeout)
}

// leftForRedelivery is the result of a delivery deliberately not settled.
func (p *Processor) leftForRedelivery(d *delivery, err error, text string) Result {
	p.cfg.log(context.Background(), slog.LevelInfo, text, d.msg, d.env, errAttr(err))
	return Result{Outcome: OutcomeLeftForRedelivery, Attempt: d.env.Attempt, SettleErr: err}
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
			p.cfg.log(context.Background(), slog.LevelError, "Options.IdempotencyKey panicked; using the MessageID", msg, envelope.Envelope{}, slog.Any("panic", r))
		}
	}()
	return keyOrFallback(p.cfg.key(msg), msg)
}

// keepLock starts following d's lock, received at now, under base (the settle base: detached from the
// caller so that a caller cancelling its context does not stop the renewal of a message still being
// worked on). With renewal enabled, the lock is renewed until stop is called.
func (p *Processor) keepLock(d *delivery, base context.Context, now time.Time) {
	cfg := p.cfg
	lk := &d.lock
	lk.base, lk.cfg, lk.sched, lk.msg, lk.env, lk.rcv = base, p.cfg, &p.renewals, d.msg, &d.env, d.route.settler
	lk.values = base
	if base.Done() != nil {
		lk.values = context.WithoutCancel(base)
	}
	lk.dur = grantedLockDuration(cfg.lockDuration, d.msg, now)
	lk.deadline = now.Add(lk.dur)
	lk.each = cfg.renewInterval(lk.dur)
	// Listed either way, so that a shutdown that gives up finds the lock's calls in flight.
	p.renewals.add(lk, now.Add(lk.each), cfg.lockRenewal)
}

// hold keeps d's message for the outage breaker: a copy at the same attempt, due when the breaker
// probes next, then the original completed, so the outage spends no attempt and the message waits in
// the broker, durable, rather than in this process. herr is the failure that found the breaker open
// (nil for a message held before its handler ran). The copy's MessageID is heldMessageID's. A message that
// cannot be copied (no sequence number, a body a copy cannot carry, over the size limits) is left for
// redelivery instead; one whose producer's expiry falls before the hold ends is dead-lettered as
// expired, as a retry due after it would be.
func (p *Processor) hold(d *delivery, settleBase context.Context, f *flight, herr error, res Result) Result {
	msg, env := d.msg, &d.env
	now := p.cfg.clock.Now()
	d.now = now
	at := p.outage.holdUntil(now)
	if msg.SequenceNumber == nil || hasNonDataBody(msg) {
		return p.leftForRedelivery(d, errCannotHold, "outage mode: the message cannot be held; the broker will redeliver it")
	}
	var dec *decision
	if ttl, expired := p.copyTTL(env, msg, at); expired {
		dec = p.deadLetterDecision(env, msg, p.cfg.reasons.Expired, herr, now, herr != nil)
	} else {
		errText := env.LastError
		if herr != nil {
			errText = p.errorText(herr)
		}
		id := heldMessageID(*env, d.route.entity, msg)
		copyMsg := p.buildCopy(d, env.Attempt, errText, ttl, at, id)
		copyMsg.ApplicationProperties[envelope.PropHeld] = now.UTC()
		if why := oversize(copyMsg, p.cfg.maxMessageSize); why != "" {
			return p.leftForRedelivery(d, fmt.Errorf("%w: %s", errCannotHold, why), "outage mode: the held copy would exceed the size limits; the broker will redeliver the message")
		}
		dec = &decision{kind: decideRetry, env: env, handlerErr: herr,
			retryPlan: &retryPlan{copyMsg: copyMsg, nextTry: env.Attempt, delay: at.Sub(now), at: at, errText: errText, held: true}}
	}
	if f != nil {
		f.setDecision(dec)
	}
	p.apply(d, settleBase, f, dec, &res)
	return res
}
