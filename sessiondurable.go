package retry

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/sessionstate"
)

// Durable holds (SessionOptions.DurableHolds) and blocked sessions (BlockAfterDeadLetter): the
// consumer's side of the record in sessionstate.go. Every step that changes what blocks a session is
// ordered so that a consumer killed between any two calls leaves the session in a state the next
// consumer resumes in order, and never loses a message:
//
//   - Holding a message: (1) schedule the wake-up, (2) write the record naming it, (3) defer the
//     message. Killed after (1): the message comes back unsettled and the wake-up, named by no record,
//     is ignored. After (2): the message comes back active and the record says it is held: it is
//     deferred then (or run, if due).
//   - Deferring a follower: (1) list it in the record, (2) defer it. Killed after (1): it comes back
//     active and listed, and is deferred then.
//   - Ending a hold or running a follower: settle the message first, then write the record without
//     it. Killed between: the record names a message that is gone, which the next consumer finds
//     (receive by sequence number: not found) and drops from the record.
//   - A wake-up is completed only after the record no longer needs it, so that a session whose other
//     messages are all deferred still has a message that makes a consumer accept it.
//
//   - Blocking after a dead-letter (BlockAfterDeadLetter): (1) write the record naming the message as
//     dead-lettered, (2) dead-letter it. Killed after (1): the message is still in the session, active
//     or deferred, and whoever finds it there dead-letters it then.
//
// Decided cases, each with a test in sessiondurable_test.go: a missing state means nothing is held; a
// state that is not our record (another application's, or one that cannot be valid) is left alone and
// the session is held in place only; a record that cannot be written (too large, or any failure)
// leaves the message unsettled and releases the session, so nothing moves out of order; a wake-up
// that names the hold makes it due whatever the local clock says, since the broker's clock delivered
// it (clocks differ; waiting or scheduling again could only add delay, or loop); one that arrives
// twice, or for a hold that is over, is completed and ignored; a deferred message that expired (or was
// settled before a consumer stopped) is dropped from the record with a warning; more than
// sessionstate.MaxFollowers messages behind one hold dead-letter the newcomers (DeadLetterReasons.SessionBacklogFull).
// A state that changed since this consumer read it (its lock was lost, azservicebus took the session
// again, and the session's holder meanwhile wrote) is never written over: the message is left
// unsettled and the session released (serialReceiver.replaceState; the e2e test
// TestSessionStateWrittenMeanwhileIsNotOverwritten, the unit test
// TestSessionStateWriteAfterTheSDKTookTheSessionAgain).

// canHoldDurably reports whether a failure in this session may become a durable hold.
func (hs *servedSession) canHoldDurably() bool {
	return hs.sender != nil && hs.ds != nil && !hs.ds.foreign
}

// blocked reports whether the session's new messages must be deferred.
func (hs *servedSession) blocked() bool {
	return hs.ds != nil && !hs.ds.foreign && hs.ds.st.Blocked()
}

// loadState reads the session's record into hs.ds.
func (r *sessionRun) loadState(hs *servedSession) error {
	ctx, cancel := r.settleContext(hs.lk)
	b, err := hs.recv.GetSessionState(ctx, nil)
	cancel()
	if err != nil {
		return err
	}
	st, derr := sessionstate.Decode(b)
	switch {
	case errors.Is(derr, sessionstate.ErrInvalid):
		// Ours, but impossible: nothing this version writes. It is left for an operator to look at.
		r.sc.cfg.logger.Error("the session's durable hold record is invalid; leaving it alone and holding this session in place only",
			slog.String("session_id", hs.sid), errAttr(derr))
		hs.ds = &durableState{foreign: true}
		return nil
	case derr != nil:
		// Not ours: it is left as it is, and the session is held in place only.
		r.sc.cfg.logger.Warn("the session's state is not a durable hold record; holding this session in place only",
			slog.String("session_id", hs.sid), errAttr(derr))
		hs.ds = &durableState{foreign: true}
		return nil
	}
	hs.ds = &durableState{st: st, raw: b}
	return nil
}

// writeState replaces the session's record with next. A record that would not read back is never
// written.
func (r *sessionRun) writeState(hs *servedSession, next sessionstate.State) error {
	b, err := sessionstate.Marshal(next)
	if err == nil {
		_, err = sessionstate.Decode(b)
	}
	if err != nil {
		r.sc.cfg.logger.Error("refusing to write an invalid durable hold record; releasing the session", slog.String("session_id", hs.sid), errAttr(err))
		return err
	}
	ctx, cancel := r.settleContext(hs.lk)
	err = hs.recv.replaceState(ctx, hs.ds.raw, b)
	cancel()
	switch {
	case errors.Is(err, errStateChanged), errors.Is(err, errSessionRetaken):
		r.sc.cfg.logger.Warn("the session's lock was lost and its state may be another holder's now; writing nothing and releasing the session",
			slog.String("session_id", hs.sid), errAttr(err))
		return err
	case errors.Is(err, errStateWrittenRetaken):
		r.sc.cfg.logger.Error("the SDK took the session again while its durable hold record was written; a state another holder wrote in that moment may have been replaced. Releasing the session",
			slog.String("session_id", hs.sid))
		return err
	case err != nil:
		r.sc.cfg.logger.Warn("writing the session's durable hold record failed; releasing the session", slog.String("session_id", hs.sid), errAttr(err))
		return r.settleError(hs.lk, err)
	}
	hs.ds.st, hs.ds.raw = next, b
	return nil
}

// lostBeforeRun ends msg's delivery unsettled, without running anything, when the session's lock was
// lost by the time it arrived: the call that brought it may have found the session taken again by the
// SDK (serialReceiver.watch), and what this consumer knows of the session (its record, what blocks
// it) may be stale, so nothing may run on it. It reports whether it did.
func (r *sessionRun) lostBeforeRun(hs *servedSession, msg *azservicebus.ReceivedMessage) bool {
	lost, why := hs.lk.lost()
	if !lost {
		return false
	}
	if _, wake := sessionstate.IsWakeUp(msg); wake {
		return true // ours, never the hooks': it goes back when the receiver closes
	}
	d := r.setAside(hs, msg)
	r.endSetAside(d, withOutcome(Result{Attempt: d.env.Attempt}, OutcomeLeftForRedelivery, why))
	return true
}

// errDeferredGone: the record names a deferred message the session no longer has.
var errDeferredGone = errors.New("retry: the deferred message is gone")

// receiveDeferred receives the session's deferred message seq.
func (r *sessionRun) receiveDeferred(hs *servedSession, seq int64) (*azservicebus.ReceivedMessage, error) {
	ctx, cancel := r.settleContext(hs.lk)
	msgs, err := hs.recv.ReceiveDeferredMessages(ctx, []int64{seq}, nil)
	cancel()
	if code, ok := sdkCode(err); ok && code == azservicebus.CodeNotFound {
		return nil, errDeferredGone
	}
	if err != nil {
		return nil, r.settleError(hs.lk, err)
	}
	for _, m := range msgs {
		if m != nil && m.SequenceNumber != nil && *m.SequenceNumber == seq {
			return m, nil
		}
	}
	return nil, errDeferredGone
}

// afterSettle updates the record once msg is settled for good (completed, discarded, dead-lettered):
// the message no longer blocks the session nor waits in it. A durable hold, and a dead-letter that
// blocks the session, wrote their record before settling (holdDurably, blockingRecord). It reports
// false when the record could not be written (the session is released; the next consumer finds the
// message gone).
func (r *sessionRun) afterSettle(hs *servedSession, msg *azservicebus.ReceivedMessage, res Result) bool {
	if hs.ds == nil || hs.ds.foreign || msg.SequenceNumber == nil || res.Outcome == OutcomeDeferred {
		return true
	}
	st := hs.ds.st
	if h := st.Hold; h != nil && h.DeadLetterReason != "" && h.SequenceNumber == *msg.SequenceNumber {
		return true // the record already blocks the session on it
	}
	next := st.Without(*msg.SequenceNumber)
	if next.Equal(st) {
		return true
	}
	return r.writeState(hs, next) == nil
}

// blockingRecord writes, before d's message is dead-lettered with reason, the record that keeps the
// session blocked on it (BlockAfterDeadLetter): written first, so that a consumer stopped between the
// two leaves the block, and the message for the next consumer to dead-letter (deadLetterRecorded).
// It reports false when the record could not be written: the message is then not dead-lettered.
func (r *sessionRun) blockingRecord(hs *servedSession, d *delivery, reason string, cause error) bool {
	if !r.sc.scfg.block || hs.ds == nil || hs.ds.foreign || d.msg.SequenceNumber == nil {
		return true
	}
	seq := *d.msg.SequenceNumber
	next := hs.ds.st.Without(seq)
	next.Hold = &sessionstate.Hold{
		SequenceNumber: seq, MessageID: d.msg.MessageID, Attempt: max(d.env.Attempt+1, 2), LastError: r.sc.proc.errorText(cause),
		DeadLetterReason: reason, DeadLetteredAt: r.sc.cfg.clock.Now(),
	}
	if cause == nil {
		next.Hold.LastError = d.env.LastError
	}
	if r.writeState(hs, next) != nil {
		return false
	}
	r.sc.cfg.logger.Warn("session blocked after a dead-letter until an operator releases it", slog.String("session_id", hs.sid), slog.Int64("sequence_number", seq))
	return true
}

// deadLetterRecorded dead-letters msg, which the record says was dead-lettered (with h's reason) but
// is still in the session: a consumer stopped between writing the record and dead-lettering it. It
// reports whether the session may go on.
func (r *sessionRun) deadLetterRecorded(hs *servedSession, msg *azservicebus.ReceivedMessage, h *sessionstate.Hold) bool {
	p := r.sc.proc
	d := r.setAside(hs, msg)
	var cause error
	if h.LastError != "" {
		cause = errors.New(h.LastError)
	}
	res := Result{Attempt: d.env.Attempt}
	r.deadLetter(d, hs, p.deadLetterDecision(&d.env, msg, h.DeadLetterReason, cause, d.now, cause != nil), &res)
	return r.endSetAside(d, res)
}

// setAside starts the delivery of a message the consumer settles without running the handler
// (deferred behind a hold, or dead-lettered as the record says): counted, with OnStart, as any.
func (r *sessionRun) setAside(hs *servedSession, msg *azservicebus.ReceivedMessage) *delivery {
	c, p := r.sc.stats, r.sc.proc
	c.received.Add(1)
	c.inFlight.Add(1)
	now := r.sc.cfg.clock.Now()
	d := &delivery{msg: msg, route: route{entity: hs.entity}, ctx: context.WithValue(r.handlerBase, sessionIDKey{}, hs.sid), start: now, now: now}
	env, err := envelope.Decode(msg)
	if err != nil {
		env = envelope.Envelope{Attempt: 1, OriginalMessageID: msg.MessageID, FirstSequenceNumber: -1}
	}
	d.env = seed(msg, env, hs.entity, p.idempotencyKey)
	p.started(d)
	return d
}

// endSetAside ends such a delivery with res (OnProcessed, the counters) and reports whether the
// session may go on.
func (r *sessionRun) endSetAside(d *delivery, res Result) bool {
	res = r.sc.proc.finish(d, d.env, res)
	r.sc.stats.count(res)
	return settledForSure(res)
}

// dropMissingHold drops from the record a held message found neither deferred nor first in line: it
// is gone (expired, or settled before a consumer stopped).
func (r *sessionRun) dropMissingHold(hs *servedSession) bool {
	hs.holdNotDeferred = false
	h := hs.ds.st.Hold
	if h == nil || h.DeadLetterReason != "" {
		return true
	}
	r.sc.cfg.logger.Warn("the held message of a session is gone (expired, or settled before a consumer stopped); going on without it",
		slog.String("session_id", hs.sid), slog.Int64("sequence_number", h.SequenceNumber))
	return r.writeState(hs, hs.ds.st.Without(h.SequenceNumber)) == nil
}

// holdDurably holds d's message in its session until at, immediateRetries of the policy's immediate
// retries made by the attempt that resumes it: the wake-up, the record, the deferral, in that order (see the top of this file). Any failure leaves the message unsettled for the broker to
// give back in order, with the session released.
func (r *sessionRun) holdDurably(hs *servedSession, d *delivery, herr error, at, firstFailure time.Time, immediateRetries int, res *Result) {
	p := r.sc.proc
	seq := *d.msg.SequenceNumber
	h := &sessionstate.Hold{
		SequenceNumber: seq, MessageID: d.msg.MessageID, Attempt: d.env.Attempt + 1, FirstFailure: firstFailure,
		WakeAt: at, LastError: p.errorText(herr), ImmediateRetries: immediateRetries,
	}
	h.WakeID = sessionstate.WakeID(hs.sid, seq, h.Attempt, at, nil)
	next := hs.ds.st.Without(seq)
	next.Hold = h
	props := map[string]any{envelope.PropAttempt: int64(h.Attempt), envelope.PropLastError: h.LastError, sessionstate.PropHeldUntil: at.UTC()}
	props = p.heldCopy(d, props, h.Attempt, at)
	if err := r.scheduleWake(hs, d, h); err != nil {
		*res = withOutcome(*res, OutcomeLeftForRedelivery, err)
		return
	}
	if err := r.writeState(hs, next); err != nil {
		*res = withOutcome(*res, OutcomeLeftForRedelivery, err)
		return
	}
	doubted, err := r.deferMessage(hs, d, props)
	if err != nil {
		// The record says the message is held: whoever gets it back defers it, or runs it when due.
		*res = withOutcome(*res, OutcomeLeftForRedelivery, r.settleError(hs.lk, err))
		p.cfg.log(d.ctx, slog.LevelWarn, "defer failed; the message goes back to the session", d.msg, d.env, errAttr(err))
		return
	}
	res.Outcome = OutcomeDeferred
	res.ScheduledFor, res.Delay = at, at.Sub(d.now)
	p.cfg.log(d.ctx, slog.LevelInfo, "session held durably until its retry is due", d.msg, d.env, errAttr(herr), slog.Time("wake_at", at))
	// A defer is a settle: one the SDK retried may not have happened, the message still locked here,
	// and this consumer would then find the hold "gone" once due and run its followers first.
	r.doubt(d, doubted, res)
}

// deferMessage defers d's message with props, a settle like the others (settleCall).
func (r *sessionRun) deferMessage(hs *servedSession, d *delivery, props map[string]any) (doubted bool, err error) {
	return r.settleCall(hs, d, SettleDefer, func(ctx context.Context, recv SessionReceiver) error {
		return recv.DeferMessage(ctx, d.msg, &azservicebus.DeferMessageOptions{PropertiesToModify: props})
	})
}

// scheduleWake schedules h's wake-up into the session.
func (r *sessionRun) scheduleWake(hs *servedSession, d *delivery, h *sessionstate.Hold) error {
	p := r.sc.proc
	if lost, why := hs.lk.lost(); lost {
		return why // without the lock the record cannot be written: a wake-up would wake nothing
	}
	start := p.callStart(d)
	// Bounded by the session lock too: a send the SDK keeps retrying on a broken connection must not
	// keep the worker, and with it the session, once the lock is gone (the sessions soak saw a 15 s
	// stall after a proxy reset).
	ctx, cancel := context.WithTimeout(hs.lk.ctx, r.sc.cfg.settleTimeout)
	_, err := hs.sender.ScheduleMessages(ctx, []*azservicebus.Message{sessionstate.WakeMessage(hs.sid, h)}, h.WakeAt, nil)
	cancel()
	d.now = r.sc.cfg.clock.Now()
	p.settled(d, SettleSchedule, h.WakeID, d.env, start, err)
	if err != nil {
		r.sc.stats.recordFailure(func(h *Health) { h.SendFailures++ }, err)
		r.sc.cfg.logger.Warn("scheduling a wake-up failed; the message goes back to the session", slog.String("session_id", hs.sid), errAttr(err))
	}
	return err
}

// deferAside defers d's message behind what blocks the session (st), stamped with props, and ends its
// delivery.
func (r *sessionRun) deferAside(hs *servedSession, d *delivery, st sessionstate.State, props map[string]any) bool {
	seq := *d.msg.SequenceNumber
	if h := st.Hold; h != nil && h.SequenceNumber != seq {
		props[sessionstate.PropHeldBehind] = h.SequenceNumber
	}
	res := Result{Attempt: d.env.Attempt}
	doubted, err := r.deferMessage(hs, d, props)
	if err != nil {
		r.sc.cfg.logger.Warn("deferring a message behind a held one failed; releasing the session", slog.String("session_id", hs.sid), errAttr(err))
		return r.endSetAside(d, withOutcome(res, OutcomeLeftForRedelivery, r.settleError(hs.lk, err)))
	}
	res.Outcome = OutcomeDeferred
	r.doubt(d, doubted, &res)
	r.sc.cfg.logger.Debug("message deferred behind the session's hold", slog.String("session_id", hs.sid), slog.Int64("sequence_number", seq))
	return r.endSetAside(d, res)
}

// heldCopy lets the OnRetryCopy hook see the message a durable hold is about to defer, as the
// properties its deferral writes (props): a tracer writes the held attempt's trace context there, so
// that the attempt that resumes it links back. The hook may add properties, not change ours. It
// returns the properties to write.
func (p *Processor) heldCopy(d *delivery, props map[string]any, attempt int, at time.Time) map[string]any {
	hook := p.cfg.hooks.OnRetryCopy
	if hook == nil {
		return props
	}
	id := d.msg.MessageID
	m := &azservicebus.Message{MessageID: &id, ApplicationProperties: props}
	ours := maps.Clone(props)
	hook(RetryCopyParams{Context: d.ctx, Message: d.msg, Envelope: d.env, Copy: m, Attempt: attempt, ScheduledFor: at})
	if m.ApplicationProperties == nil {
		m.ApplicationProperties = map[string]any{}
	}
	maps.Copy(m.ApplicationProperties, ours)
	d.now = p.cfg.clock.Now()
	return m.ApplicationProperties
}
