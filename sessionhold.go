package retry

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/sessionstate"
)

// One message of a served session, in stages: dispatch (a wake-up, a message deferred behind a
// blocked session, or one to run), resume (what a durable hold's record says is due, in order), handle
// and holdInPlace (the envelope, the handler, and a failure's retries waited out in the session), then
// its settle (sessionserved.go). A failure held too long for the session's lock goes into the
// session's record (sessiondurable.go).

// dispatch handles one received message of a held session and reports whether the session may go on
// (false: release it, so that what was left unsettled comes back before anything later).
func (r *sessionRun) dispatch(stop context.Context, hs *servedSession, msg *azservicebus.ReceivedMessage) bool {
	if r.lostBeforeRun(hs, msg) {
		return false
	}
	if hs.holdNotDeferred {
		// The first message after the held one was not found deferred: unless it is the held one,
		// back active, the held one is gone.
		if h := hs.ds.st.Hold; h != nil && (msg.SequenceNumber == nil || *msg.SequenceNumber != h.SequenceNumber) {
			if !r.dropMissingHold(hs) {
				// msg was received: it is left unsettled, and reported as such.
				d := r.setAside(hs, msg)
				return r.endSetAside(d, withOutcome(Result{Attempt: d.env.Attempt}, OutcomeLeftForRedelivery, errors.New("retry: the session's record could not be written")))
			}
		}
		hs.holdNotDeferred = false
	}
	if _, wake := sessionstate.IsWakeUp(msg); wake {
		// A wake-up never reaches the handler; any other value of sessionstate.PropControl is the application's.
		return r.control(stop, hs, msg)
	}
	if hs.blocked() {
		return r.deferBehind(stop, hs, msg)
	}
	res := r.handle(stop, hs, msg, nil)
	if !settledForSure(res) {
		return false
	}
	return r.afterSettle(hs, msg, res)
}

// control handles a wake-up: it runs what is due (the hold it names, then the followers), and is
// completed once the record no longer needs it.
func (r *sessionRun) control(stop context.Context, hs *servedSession, msg *azservicebus.ReceivedMessage) bool {
	if hs.ds == nil {
		// Durable holds are off here, but another consumer (or this one, configured otherwise) may
		// have held the session: the wake-up says so, and the record is honoured.
		if err := r.loadState(hs); err != nil {
			return false
		}
	}
	if hs.ds.foreign {
		return r.settleControl(hs, msg)
	}
	if h := hs.ds.st.Hold; h != nil && h.DeadLetterReason == "" && h.WakeID == msg.MessageID {
		// The broker delivered the wake-up at the hold's time on its own clock: the hold is due, even
		// if this clock is behind.
		if now := r.sc.cfg.clock.Now(); now.Before(h.WakeAt) {
			due := *h
			due.WakeAt = now
			hs.ds.st.Hold = &due
		}
	}
	if r.resume(stop, hs) {
		return false
	}
	if hs.holdNotDeferred {
		// The held message is not deferred, and the wake-up came first: it is gone (a held message
		// back active would have come before its wake-up, scheduled after it).
		if !r.dropMissingHold(hs) || r.resume(stop, hs) {
			return false
		}
	}
	if h := hs.ds.st.Hold; h != nil && h.WakeID == msg.MessageID {
		// Cannot happen (the hold was made due above); completing the wake-up would leave nothing to
		// bring a consumer back to a session whose messages are all deferred.
		r.sc.cfg.logger.Error("a wake-up is still needed after its hold ran; leaving it", slog.String("session_id", hs.sid))
		return false
	}
	return r.settleControl(hs, msg)
}

// settleControl completes a control message that nothing needs any more.
func (r *sessionRun) settleControl(hs *servedSession, msg *azservicebus.ReceivedMessage) bool {
	now := r.sc.cfg.clock.Now()
	d := &delivery{msg: msg, route: route{entity: hs.entity}, ctx: context.WithValue(r.handlerBase, sessionIDKey{}, hs.sid), start: now, now: now}
	// A settle like the others (settleCall); a doubted one needs nothing: a wake-up that comes back is
	// ignored.
	_, err := r.settleCall(hs, d, SettleComplete, func(ctx context.Context, recv SessionReceiver) error {
		return recv.CompleteMessage(ctx, msg, nil)
	})
	if err != nil {
		r.sc.cfg.logger.Debug("completing a wake-up failed; it comes back and is ignored then", slog.String("session_id", hs.sid), errAttr(err))
		return false
	}
	return true
}

// resume runs what the record says is due, in order: the held message once its time has come, then
// the followers, one at a time, until one is held again or none is left. It reports true when the
// session must be released.
func (r *sessionRun) resume(stop context.Context, hs *servedSession) (release bool) {
	for {
		if stopped(stop) {
			return true
		}
		st := hs.ds.st
		var seq int64
		var from *sessionstate.Hold
		switch {
		case st.Hold != nil && st.Hold.DeadLetterReason != "":
			// Blocked until an operator releases it. The record is written before the dead-letter, so
			// the message may still be deferred here, if a consumer stopped between the two.
			if !hs.deadLetterChecked {
				hs.deadLetterChecked = true
				if msg, err := r.receiveDeferred(hs, st.Hold.SequenceNumber); err == nil {
					if !r.deadLetterRecorded(hs, msg, st.Hold) {
						return true
					}
					continue
				} else if !errors.Is(err, errDeferredGone) {
					return true
				}
			}
			return false
		case st.Hold != nil:
			if r.sc.cfg.clock.Now().Before(st.Hold.WakeAt) {
				return false // not yet: its wake-up is scheduled
			}
			seq, from = st.Hold.SequenceNumber, st.Hold
		case len(st.Followers) > 0:
			seq = st.Followers[0]
		default:
			return false
		}
		msg, err := r.receiveDeferred(hs, seq)
		if errors.Is(err, errDeferredGone) && from != nil {
			// Not deferred: it may be back active (see holdNotDeferred); the next receive says.
			hs.holdNotDeferred = true
			return false
		}
		if errors.Is(err, errDeferredGone) {
			r.sc.cfg.logger.Warn("a deferred message of a held session is gone (expired, or settled before a consumer stopped); going on without it",
				slog.String("session_id", hs.sid), slog.Int64("sequence_number", seq))
			if r.writeState(hs, st.Without(seq)) != nil {
				return true
			}
			continue
		}
		if err != nil {
			r.sc.cfg.logger.Warn("receiving a deferred message of a held session failed; releasing the session", slog.String("session_id", hs.sid), errAttr(err))
			return true
		}
		if r.lostBeforeRun(hs, msg) {
			return true
		}
		res := r.handle(stop, hs, msg, from)
		if !settledForSure(res) || !r.afterSettle(hs, msg, res) {
			return true
		}
	}
}

// deferBehind sets msg aside behind what blocks the session, listing it in the record first. The held
// message itself, come back active because a consumer stopped before deferring it, is deferred (or run,
// when due), and one the record says was dead-lettered is dead-lettered; a message already listed is
// deferred again.
func (r *sessionRun) deferBehind(stop context.Context, hs *servedSession, msg *azservicebus.ReceivedMessage) bool {
	p := r.sc.proc
	if msg.SequenceNumber == nil {
		// Every broker-delivered message has one; without it nothing can find it again.
		res := r.handle(stop, hs, msg, nil)
		return settledForSure(res)
	}
	seq := *msg.SequenceNumber
	st := hs.ds.st
	props := map[string]any{}
	switch h := st.Hold; {
	case h != nil && h.SequenceNumber == seq && h.DeadLetterReason != "":
		return r.deadLetterRecorded(hs, msg, h)
	case h != nil && h.SequenceNumber == seq:
		if !r.sc.cfg.clock.Now().Before(h.WakeAt) {
			res := r.handle(stop, hs, msg, h)
			return settledForSure(res) && r.afterSettle(hs, msg, res)
		}
		props[envelope.PropAttempt], props[envelope.PropLastError], props[sessionstate.PropHeldUntil] = int64(h.Attempt), h.LastError, h.WakeAt.UTC()
	case st.Follows(seq):
	case len(st.Followers) >= sessionstate.MaxFollowers:
		d := r.setAside(hs, msg)
		res := Result{Attempt: d.env.Attempt}
		r.deadLetter(d, hs, p.deadLetterDecision(&d.env, msg, r.sc.cfg.reasons.SessionBacklogFull, nil, d.now, false), &res)
		return r.endSetAside(d, res)
	default:
		d := r.setAside(hs, msg)
		next := sessionstate.State{Hold: st.Hold, Followers: append(slices.Clip(st.Followers), seq)}
		if err := r.writeState(hs, next); err != nil {
			return r.endSetAside(d, withOutcome(Result{Attempt: d.env.Attempt}, OutcomeLeftForRedelivery, err))
		}
		return r.deferAside(hs, d, st, props)
	}
	return r.deferAside(hs, r.setAside(hs, msg), st, props)
}

// handle runs one message of a held session to its end, counting it in the health and reporting it to
// OnProcessed once.
// from is the durable hold msg resumes, nil for a message that is not held: its Attempt and LastError
// are the envelope's.
func (r *sessionRun) handle(stop context.Context, hs *servedSession, msg *azservicebus.ReceivedMessage, from *sessionstate.Hold) Result {
	p, c := r.sc.proc, r.sc.stats
	c.received.Add(1)
	c.inFlight.Add(1)
	now := r.sc.cfg.clock.Now()
	// The delivery is the processor's (processor.go), so that the hooks, the logs and the dead-letter
	// decisions see a session message exactly as they see a queue message. Its route has no settler:
	// the session receiver settles, below. The session id rides in the context from the start, so
	// that OnStart sees it too.
	d := &delivery{msg: msg, route: route{entity: hs.entity}, ctx: context.WithValue(r.handlerBase, sessionIDKey{}, hs.sid), start: now, now: now}
	// The delivery is in the processor's record of deliveries in flight (flights.go), as a queue
	// message is: an outcome decided here but left unsettled (the session's lock lost before the
	// complete, say) is remembered for a while (rememberFor), and the redelivery applies it instead of
	// running the handler again. (Within one Run, two deliveries of one message never run at once: the
	// session is served by one worker at a time, sessionsServed. A delivery still running when a Run
	// gave up on it is waited for, as on a queue.)
	var prior *flight
	key, keyed := keyOf(hs.entity, msg)
	if keyed {
		prior = p.flights.enter(&d.flight, key, &hs.lk.keeper, now)
	}
	res := r.holdInPlace(stop, hs, d, from, prior)
	res = p.finish(d, d.env, res)
	if keyed {
		unsettled := res.Outcome == OutcomeLeftForRedelivery || res.PossibleDuplicate
		p.flights.leave(&d.flight, unsettled, d.now, p.rememberFor(&hs.lk.keeper))
	}
	c.count(res)
	return res
}

// applyInherited settles d's message as an earlier delivery decided (dec), without running the
// handler: completed, discarded or dead-lettered. It reports false for a decision a session message
// never gets (a retry copy), which leaves the handler to run.
func (r *sessionRun) applyInherited(hs *servedSession, d *delivery, dec *decision, st *inPlace) bool {
	switch dec.kind {
	case decideComplete, decideDiscard, decideDeadLetter:
	default:
		return false
	}
	d.flight.setDecision(dec)
	d.env = *dec.env
	st.res.Attempt, st.res.HandlerErr, st.res.Inherited = dec.env.Attempt, dec.handlerErr, true
	r.sc.proc.cfg.log(st.hctx, slog.LevelInfo, "redelivery of a message whose outcome was already decided here; applying it without running the handler", d.msg, d.env,
		slog.String("session_id", hs.sid))
	switch dec.kind {
	case decideComplete:
		r.complete(d, hs, &st.res, OutcomeCompleted)
	case decideDiscard:
		r.complete(d, hs, &st.res, OutcomeDiscarded)
	default:
		r.deadLetterHead(d, hs, dec, &st.res)
	}
	return true
}

// holdInPlace is the path of one message: decode its envelope, run the handler, and on a failure let
// the policy decide; a retry waits its delay here, holding the session (nothing else of it runs), and
// calls the handler again with the next attempt. It ends with the message completed, dead-lettered,
// discarded, or left unsettled for the broker to give back in order (lock lost, shutdown, a failed
// settle).
func (r *sessionRun) holdInPlace(stop context.Context, hs *servedSession, d *delivery, from *sessionstate.Hold, prior *flight) Result {
	p := r.sc.proc
	env, envErr := envelope.Decode(d.msg)
	if envErr != nil {
		// Malformed retry properties cannot be trusted to count attempts: dead-letter at once, as the
		// queue consumer does, and let the session go on.
		d.env = envelope.Envelope{OriginalMessageID: d.msg.MessageID, FirstSequenceNumber: -1}
		p.started(d)
		res := Result{Attempt: env.Attempt}
		r.deadLetterHead(d, hs, p.deadLetterDecision(&d.env, d.msg, r.sc.cfg.reasons.InvalidEnvelope, envErr, d.now, false), &res)
		return res
	}
	d.env = seed(d.msg, env, d.route.entity, p.idempotencyKey)
	var st inPlace
	if from != nil {
		// A durable hold's record is written before the message is deferred, so it is the latest word
		// on the attempt, even if the consumer stopped before the deferral stamped the message.
		d.env.Attempt, d.env.LastError, st.firstFailure = from.Attempt, from.LastError, from.FirstFailure
		st.immediateRun = from.ImmediateRetries
	}
	st.hctx = p.started(d)
	st.res.Attempt = d.env.Attempt
	// A decision applies to the attempt it was made at or a later one of this delivery: a session
	// message keeps its sequence number across attempts, and a durable hold another process made
	// since (from) has moved the message on past an attempt this process decided.
	if prior != nil {
		// As a queue message does (process.go takeOver): wait for the earlier deliveries still running
		// (only one a stopped Run gave up on can be), and take the first decision among them.
		dec, left, ok := p.awaitEarlier(d, prior, stop, hs.lk.ctx.Done())
		if !ok {
			return left
		}
		if dec != nil && dec.env.Attempt >= d.env.Attempt && r.applyInherited(hs, d, dec, &st) {
			return st.res
		}
	}
	for {
		adm, ok := r.admitInPlace(stop, hs)
		if !ok {
			p.cfg.log(st.hctx, slog.LevelInfo, "stopped or session lock lost while the outage breaker was open; the message goes back to the session", d.msg, d.env)
			return withOutcome(st.res, OutcomeLeftForRedelivery, r.settleError(hs.lk, context.Canceled))
		}
		herr := r.runHandler(st.hctx, hs.lk, d)
		st.res.Attempt, st.res.HandlerErr = d.env.Attempt, herr
		if r.heldByBreaker(stop, hs, adm, herr) {
			// The breaker is open: the attempt is not spent. The message waits in its session (the lock
			// renewed) and runs again, at the same attempt, once the breaker lets it.
			p.cfg.log(st.hctx, slog.LevelWarn, "outage breaker open: the message waits in its session, its attempt not spent", d.msg, d.env,
				errAttr(herr), slog.String("session_id", hs.sid))
			st.reruns++
			d.now = r.sc.cfg.clock.Now()
			st.hctx = p.startAttempt(d, st.reruns, d.now)
			continue
		}
		if res, done := r.attemptEnded(stop, hs, d, herr, &st); done {
			return res
		}
		if res, done := r.failedInPlace(stop, hs, d, herr, &st); done {
			return res
		}
	}
}

// inPlace is what the attempts of one message held in place share.
type inPlace struct {
	res  Result
	hctx context.Context // the current attempt's context (OnStart's)
	// firstFailure is when the message first failed (kept across durable holds); holdStart when this
	// hold in place began: MaxHold counts from there, since until then the session was not held, only
	// busy.
	firstFailure, holdStart time.Time
	// immediateRun counts the policy's immediate retries since the last delayed one: they come
	// before each delayed retry, as on a queue, wherever the attempt runs (a durable hold carries it).
	immediateRun int
	reruns       int // the handler's calls in this delivery after the first
}

// attemptEnded settles what needs no decision once the handler returned herr: done is true with the
// result when the lock was lost, the handler succeeded (completed even during a shutdown: the work is
// done), or a shutdown ended a failure (no attempt counted). The order of the checks matters: a lost
// lock makes any settle impossible, whatever the handler returned.
func (r *sessionRun) attemptEnded(stop context.Context, hs *servedSession, d *delivery, herr error, st *inPlace) (Result, bool) {
	p := r.sc.proc
	if herr == nil {
		// Decided before anything can fail to settle it, so that a redelivery here inherits it.
		env := d.env
		d.flight.setDecision(&decision{kind: decideComplete, env: &env})
	}
	if lost, why := hs.lk.lost(); lost {
		p.cfg.log(st.hctx, slog.LevelWarn, "session lock lost while the handler ran; the message goes back to the session", d.msg, d.env)
		return withOutcome(st.res, OutcomeLeftForRedelivery, why), true
	}
	if herr == nil {
		r.complete(d, hs, &st.res, OutcomeCompleted)
		return st.res, true
	}
	if stopped(stop) {
		p.cfg.log(st.hctx, slog.LevelInfo, "handler failed during shutdown; the message goes back to the session", d.msg, d.env, errAttr(herr))
		return withOutcome(st.res, OutcomeLeftForRedelivery, context.Canceled), true
	}
	return Result{}, false
}

// failedInPlace decides what the failed attempt becomes: a durable hold, a discard or a dead-letter
// (done, with the result), or a retry in place, waited for here before the next attempt is prepared
// (not done). This goroutine is the session's only one, so waiting here is what keeps every later
// message of the session from running; the session lock is renewed meanwhile by the renewal schedule
// (sessionlock.go, lockrenewer.go).
func (r *sessionRun) failedInPlace(stop context.Context, hs *servedSession, d *delivery, herr error, st *inPlace) (Result, bool) {
	p := r.sc.proc
	if st.holdStart.IsZero() {
		st.holdStart = d.now
	}
	if st.firstFailure.IsZero() {
		st.firstFailure = d.now
	}
	// The same policy order as the queue consumer's (policy.go): Permanent, then the rules, then the
	// Options.
	pol := p.cfg.policyFor(herr)
	st.res.Policy = pol.name
	immediate := immediateLeft(pol, st.immediateRun, herr)
	dec, delay, durable := r.decideInPlace(hs, d, herr, pol, immediate, st.holdStart)
	switch {
	case durable:
		// Too long to wait here: the hold goes into the session (sessiondurable.go), with the count of
		// immediate retries, this one's included, for the attempt that resumes it. A hold for the
		// backoff starts the count again, as a queue's delayed retry does.
		made := 0
		if immediate {
			made = st.immediateRun + 1
		}
		r.holdDurably(hs, d, herr, d.now.Add(delay), st.firstFailure, made, &st.res)
		return st.res, true
	case dec != nil && dec.kind == decideDiscard:
		d.flight.setDecision(dec)
		p.cfg.log(st.hctx, slog.LevelWarn, "a policy discarded the failed message", d.msg, d.env, errAttr(herr), slog.String("policy", pol.name))
		r.complete(d, hs, &st.res, OutcomeDiscarded)
		return st.res, true
	case dec != nil:
		d.flight.setDecision(dec)
		r.deadLetterHead(d, hs, dec, &st.res)
		return st.res, true
	}
	// The queue consumer's line for a retry (settle.go), at its level: the retry waits in the session
	// instead of in a scheduled copy.
	p.cfg.log(st.hctx, slog.LevelInfo, "retry scheduled", d.msg, d.env,
		slog.Int("next_attempt", d.env.Attempt+1), slog.Duration("delay", delay), slog.Time("scheduled_for", d.now.Add(delay)),
		slog.String("held_in", "session"), slog.String("session_id", hs.sid), slog.String("handler_error", p.errorText(herr)))
	if ok, why := r.waitHold(stop, hs.lk, delay); !ok {
		p.cfg.log(st.hctx, slog.LevelInfo, "hold ended early; the message goes back to the session", d.msg, d.env, errAttr(why))
		return withOutcome(st.res, OutcomeLeftForRedelivery, why), true
	}
	if immediate {
		st.res.ImmediateRetries++
		st.immediateRun++
	} else {
		st.immediateRun = 0
	}
	// The next attempt, in this delivery: the envelope moves on as a retry copy's would, so the
	// handler sees Attempt and LastError as it would on a queue.
	d.env.Attempt++
	d.env.LastError = p.errorText(herr)
	st.reruns++
	d.now = r.sc.cfg.clock.Now()
	st.hctx = p.startAttempt(d, st.reruns, d.now)
	return Result{}, false
}

// deadLetterHead dead-letters d's message, the head of its session, as dec says; with
// BlockAfterDeadLetter the block is recorded first (blockingRecord, sessiondurable.go), and a record
// that cannot be written leaves the message unsettled.
func (r *sessionRun) deadLetterHead(d *delivery, hs *servedSession, dec *decision, res *Result) {
	if !r.blockingRecord(hs, d, dec.reason, res.HandlerErr) {
		*res = withOutcome(*res, OutcomeLeftForRedelivery, errors.New("retry: the session's record could not be written"))
		return
	}
	r.deadLetter(d, hs, dec, res)
}

// decideInPlace decides what a failed attempt becomes in a held session: a dead-letter or a discard
// (the decision), a retry in place after delay (nil decision), or a durable hold due after delay
// (durable). immediate says the retry is one of the policy's immediate retries, which wait
// ImmediateDelay instead of the backoff. A retry that would be due after the RetryBudget or after the
// message's expiry is refused up front, as a dead-letter; one due more than MaxHold after the hold
// began is held durably when the session can be (SessionOptions.DurableHolds), else dead-lettered.
func (r *sessionRun) decideInPlace(hs *servedSession, d *delivery, herr error, pol policy, immediate bool, holdStart time.Time) (dec *decision, delay time.Duration, durable bool) {
	p, cfg := r.sc.proc, r.sc.cfg
	env, msg, now := &d.env, d.msg, d.now
	if dec := p.finalDecision(d, herr, pol); dec != nil {
		return dec, 0, false
	}
	// The backoff's delay (or RetryAfter's, capped by the backoff), except for the policy's immediate
	// retries, which wait ImmediateDelay as they do on a queue.
	delay = p.delay(pol, env.Attempt, herr)
	if immediate {
		delay = pol.immDelay
	}
	// Refuse up front what the wait could not end well: past the budget, past the producer's expiry;
	// then past MaxHold, the session would be held in place too long.
	at := now.Add(delay)
	switch {
	case p.overBudget(env, at):
		return p.deadLetterDecision(env, msg, cfg.reasons.BudgetExhausted, herr, now, true), 0, false
	case !cfg.ignoreExpiry && !env.ExpiresAt.IsZero() && !at.Before(env.ExpiresAt):
		return p.deadLetterDecision(env, msg, cfg.reasons.Expired, herr, now, true), 0, false
	case at.Sub(holdStart) > r.sc.scfg.maxHold:
		if r.sc.scfg.durable && hs.canHoldDurably() && msg.SequenceNumber != nil {
			return nil, delay, true
		}
		return p.deadLetterDecision(env, msg, cfg.reasons.SessionHoldExceeded, herr, now, true), 0, false
	}
	return nil, delay, false
}

// runHandler runs the handler with ctx carrying the envelope, cancelled with ErrLockLost if the session
// lock is lost meanwhile, and times it.
func (r *sessionRun) runHandler(ctx context.Context, lk *sessionLock, d *delivery) error {
	clk := r.sc.cfg.clock
	hctx, cancel := context.WithCancelCause(envelope.NewContext(ctx, &d.env))
	unwatch := context.AfterFunc(lk.ctx, func() { cancel(context.Cause(lk.ctx)) })
	start := clk.Now()
	// callHandler turns a panic into a failed attempt, as for the queue consumer.
	err := r.sc.proc.callHandler(hctx, d.msg)
	unwatch()
	cancel(nil)
	d.now = clk.Now()
	d.handlerTime += d.now.Sub(start)
	return err
}

// waitHold waits delay on the clock while the session is held. It reports false, with why, when stop
// ended (a shutdown abandons the hold) or the session lock was lost meanwhile.
func (r *sessionRun) waitHold(stop context.Context, lk *sessionLock, delay time.Duration) (bool, error) {
	ch, stopTimer := timerChan(r.sc.cfg.clock, delay)
	defer stopTimer()
	select {
	case <-ch:
		return true, nil
	case <-stop.Done():
		return false, context.Canceled
	case <-lk.ctx.Done():
		return false, context.Cause(lk.ctx)
	}
}
