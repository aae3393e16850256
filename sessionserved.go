package retry

import (
	"context"
	"log/slog"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/sessionstate"
)

// A served session, as the stages of its messages share it (sessionhold.go, sessiondurable.go), and
// the settle calls on its receiver (complete, dead-letter; the durable hold's defer is in
// sessiondurable.go), each made the way the queue consumer makes its settles (settle.go).

// servedSession is one accepted session while a worker serves it (held, in the sense of holds, only
// while a message of it waits in place or durably).
type servedSession struct {
	// recv is the session's receiver, its calls made one at a time (sessionreceiver.go).
	recv        *serialReceiver
	lk          *sessionLock
	sid, entity string
	// sender schedules wake-ups; nil when the connection has none.
	sender Sender
	// ds is the session's record, nil when neither durable holds nor blocking are on and no wake-up
	// made the consumer read it.
	ds *durableState
	// holdNotDeferred: the held message was not found deferred. It may have come back active (a
	// consumer stopped between writing the record and deferring it), in which case it is the first
	// message received; anything else received first means it is gone.
	holdNotDeferred bool
	// deadLetterChecked: for a session blocked after a dead-letter, the dead-lettered message was
	// looked for among the deferred ones (it is there if a consumer stopped before dead-lettering it).
	deadLetterChecked bool
}

// durableState is what the consumer knows of a held session's record.
type durableState struct {
	st sessionstate.State
	// raw is the state as this consumer last read or wrote it: a write replaces only that
	// (serialReceiver.replaceState).
	raw []byte
	// foreign: the session's state is not our record; it is never written, and the session is held in
	// place only.
	foreign bool
}

// withOutcome is res with its outcome and settle error set.
func withOutcome(res Result, o Outcome, err error) Result {
	res.Outcome, res.SettleErr = o, err
	return res
}

// settledForSure reports whether res's message is settled beyond doubt, so that the session may go
// on with its next message.
func settledForSure(res Result) bool {
	return res.Outcome != OutcomeLeftForRedelivery && !res.PossibleDuplicate
}

// settleCall makes one settle call (op: complete, dead-letter, defer) on hs's receiver, the way the
// queue consumer makes its settles (settle.go): under the session's lock keeper, bounded by the settle
// timeout cut to the lock's remaining time and ended by the lock's end (beginLockBound), its error
// marked as a lost lock if the lock was lost meanwhile and its success doubted when the SDK had to retry
// it (endLockBound; the time measured leaves out the wait for the receiver's turn). OnSettle sees the
// call's own error, and nothing when no call was made (the lock was already gone). d.now moves to when
// it returned.
func (r *sessionRun) settleCall(hs *servedSession, d *delivery, op string, call func(context.Context, SessionReceiver) error) (doubted bool, err error) {
	p, clk, lk := r.sc.proc, r.sc.cfg.clock, &hs.lk.keeper
	d.now = clk.Now() // a session-state call may have come between the last step and this one
	ctx, cancel, err := r.sc.cfg.beginLockBound(lk, d.now)
	if err != nil {
		return false, err
	}
	start := p.callStart(d)
	took, callErr := hs.recv.timed(ctx, clk, func(recv SessionReceiver) error { return call(ctx, recv) })
	doubted, err = endLockBound(lk, took, cancel, callErr)
	d.now = clk.Now()
	p.settled(d, op, "", d.env, start, callErr)
	return doubted, err
}

// complete completes d's message, with outcome on success. A failed complete leaves the message for
// the broker to give back (the session is then released, so that it comes back before its followers).
func (r *sessionRun) complete(d *delivery, hs *servedSession, res *Result, outcome Outcome) {
	p := r.sc.proc
	doubted, err := r.settleCall(hs, d, SettleComplete, func(ctx context.Context, recv SessionReceiver) error {
		return recv.CompleteMessage(ctx, d.msg, nil)
	})
	if err != nil {
		*res = withOutcome(*res, OutcomeLeftForRedelivery, r.settleError(hs.lk, err))
		p.cfg.log(d.ctx, slog.LevelWarn, "complete failed; the message goes back to the session", d.msg, d.env, errAttr(err))
		return
	}
	res.Outcome = outcome
	r.doubt(d, doubted, res)
}

// deadLetter dead-letters d's message as dec says. A failed dead-letter leaves the message for the
// broker to give back.
func (r *sessionRun) deadLetter(d *delivery, hs *servedSession, dec *decision, res *Result) {
	p, lk := r.sc.proc, hs.lk
	reason, desc := dec.reason, dec.desc
	res.DeadLetterReason = reason
	doubted, err := r.settleCall(hs, d, SettleDeadLetter, func(ctx context.Context, recv SessionReceiver) error {
		return recv.DeadLetterMessage(ctx, d.msg, &azservicebus.DeadLetterOptions{Reason: &reason, ErrorDescription: &desc, PropertiesToModify: dec.props})
	})
	if err != nil {
		*res = withOutcome(*res, OutcomeLeftForRedelivery, r.settleError(lk, err))
		p.cfg.log(d.ctx, slog.LevelWarn, "dead-letter failed; the message goes back to the session", d.msg, d.env, errAttr(err))
		return
	}
	res.Outcome = OutcomeDeadLettered
	p.cfg.log(d.ctx, slog.LevelWarn, "message dead-lettered", d.msg, d.env, slog.String("reason", reason))
	r.doubt(d, doubted, res)
}

// doubt marks a settle whose success is doubted (see endLockBound) as possibly not done: azservicebus
// v1.11 reports success for a retried settle that the broker had rejected, the message still locked
// (soak/README.md findings 1 and 3). The session is then released (see settledForSure), so that the
// message, if it is still there, comes back before its successors and runs again, rather than after
// them.
func (r *sessionRun) doubt(d *delivery, doubted bool, res *Result) {
	if !doubted {
		return
	}
	res.PossibleDuplicate = true
	r.sc.proc.cfg.log(d.ctx, slog.LevelWarn, "a settle succeeded only after the SDK retried it, which may not have settled it; releasing the session", d.msg, d.env)
}

// settleError is the SettleErr of a failed settle: ErrLockLost when the session lock ended, else err.
func (r *sessionRun) settleError(lk *sessionLock, err error) error {
	if lost, why := lk.lost(); lost {
		return why
	}
	return err
}

// settleContext bounds one settle call: by the settle timeout, since the SDK's recovery after a lost
// session lock takes about 30 s, and by the session lock, since a settle after it ended cannot succeed.
func (r *sessionRun) settleContext(lk *sessionLock) (context.Context, context.CancelFunc) {
	return context.WithTimeout(lk.ctx, r.sc.cfg.settleTimeout)
}
