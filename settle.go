package retry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/sbretry/retry/envelope"
)

// Settling: every broker call made for a delivery once its outcome is decided. Each call is bounded by
// a context.WithTimeout of its own. A lock-bound call (complete, dead-letter) is ended by the lock's end
// too, and is cut to what is left of the lock; the republish of a retry copy is bounded by the settle
// timeout only, since once started its outcome must be known. Both derive from the settle base without
// its cancellation (lockKeeper.values) and are ended by a shutdown that gives up through the renewal
// schedule (renewals.abandon), so that no call registers with the one context every message shares.

// slowSettle is how long a settle call must take before its success is doubted (see endLockBound): the
// SDK's first retry of a settle waits about 4 s, a settle that is not retried takes milliseconds.
const slowSettle = 2 * time.Second

// errLockGone is returned for a settle call not made because the lock had already run out or a
// redelivery superseded it: the call could only fail.
var errLockGone = fmt.Errorf("%w: not settling with an expired lock", ErrLockLost)

// apply carries out dec with d's lock.
func (p *Processor) apply(d *delivery, settleBase context.Context, f *flight, dec *decision, res *Result) {
	switch dec.kind {
	case decideComplete:
		p.settleComplete(d, *dec.env, res)
	case decideRetry:
		p.settleRetry(d, settleBase, f, dec, res)
	case decideDeadLetter:
		p.settleDeadLetter(d, dec, res)
	case decideDiscard:
		p.settleDiscard(d, dec, res)
	}
}

// beginLockBound starts one settle call that needs lk, at now: its context is bounded by the settle
// timeout cut to the lock's remaining time, and ended by the lock's end too. It returns errLockGone,
// and no context, when the lock is already gone. Call endLockBound with the call's error. The session
// consumer's settles go through the same pair, with the session's lock (sessionserved.go settleCall).
func (c *config) beginLockBound(lk *lockKeeper, now time.Time) (context.Context, context.CancelFunc, error) {
	if !lk.alive(now) {
		return nil, nil, errLockGone
	}
	ctx, cancel := context.WithTimeout(lk.values, lk.callTimeout(c.settleTimeout, now))
	lk.follow(&lk.settle, cancel)
	return ctx, cancel, nil
}

// endLockBound ends a call begun by beginLockBound, which took took, and returns its error, marked as
// a lost lock if the lock was lost meanwhile, and whether its success is doubted. azservicebus v1.11
// with go-amqp v1.7 can report a settle as done after the broker rejected it (a busy broker's rejection
// marks the delivery settled, and the SDK's retry then sends nothing): the message is redelivered
// although the call returned nil. Only a settle that the SDK retried takes slowSettle or more, so such
// a success is doubted: the queue consumer remembers its outcome like a failed one's, for the
// redelivery; the session consumer releases the session, so that the message, if still there, comes
// back before its followers.
func endLockBound(lk *lockKeeper, took time.Duration, cancel context.CancelFunc, err error) (doubted bool, _ error) {
	lk.follow(&lk.settle, nil)
	cancel()
	if err != nil && lk.lost() {
		return false, fmt.Errorf("%w: %w", ErrLockLost, err)
	}
	return err == nil && took >= slowSettle, err
}

// complete completes d's message with its lock, and reports the call to the OnSettle hook.
func (p *Processor) complete(d *delivery, env envelope.Envelope) error {
	start := d.now
	ctx, cancel, err := p.cfg.beginLockBound(&d.lock, d.now)
	if err != nil {
		return err
	}
	hookStart := p.callStart(d)
	err = d.route.settler.CompleteMessage(ctx, d.msg, nil)
	p.settled(d, SettleComplete, "", env, hookStart, err)
	return p.endSettle(d, start, cancel, err)
}

// endSettle is endLockBound for d's own lock: d.now moves to the time the call returned, and a doubted
// success is remembered on the lock (see endLockBound).
func (p *Processor) endSettle(d *delivery, start time.Time, cancel context.CancelFunc, err error) error {
	d.now = p.cfg.clock.Now()
	doubted, err := endLockBound(&d.lock, d.now.Sub(start), cancel, err)
	if doubted {
		d.lock.slowSettle.Store(true)
	}
	return err
}

// settleComplete completes a successful delivery.
func (p *Processor) settleComplete(d *delivery, env envelope.Envelope, res *Result) {
	msg := d.msg
	err := p.complete(d, env)
	if err != nil {
		res.Outcome = OutcomeLeftForRedelivery
		res.SettleErr = err
		level := slog.LevelError
		if brokerWillRedeliver(err) || errors.Is(err, ErrLockLost) {
			level = slog.LevelWarn
		}
		p.cfg.log(context.Background(), level, "completing the message failed; the broker will redeliver it", msg, env, errAttr(err))
		return
	}
	res.Outcome = OutcomeCompleted
	p.cfg.log(context.Background(), slog.LevelDebug, "message completed", msg, env)
}

// settleRetry schedules the copy (unless an earlier delivery already did), then completes the original.
func (p *Processor) settleRetry(d *delivery, settleBase context.Context, f *flight, dec *decision, res *Result) {
	msg, env := d.msg, *dec.env
	res.Delay, res.ScheduledFor, res.RetryMessageID = dec.delay, dec.at, *dec.copyMsg.MessageID
	if !dec.scheduled {
		if !d.lock.alive(d.now) {
			// A redelivery will run the attempt again; scheduling now could only make a second successor.
			res.Outcome, res.SettleErr = OutcomeLeftForRedelivery, errLockGone
			return
		}
		if settleBase.Err() != nil {
			res.Outcome, res.SettleErr = OutcomeLeftForRedelivery, context.Cause(settleBase)
			return
		}
		ctx, cancel := context.WithTimeout(d.lock.values, p.cfg.settleTimeout)
		d.lock.followPublish(cancel)
		hookStart := p.callStart(d)
		seqs, err := d.route.sender.ScheduleMessages(ctx, []*azservicebus.Message{dec.copyMsg}, dec.at, nil)
		d.lock.followPublish(nil)
		cancel()
		p.settled(d, SettleSchedule, res.RetryMessageID, env, hookStart, err)
		d.now = p.cfg.clock.Now()
		if err != nil {
			res.Outcome = OutcomeLeftForRedelivery
			res.SettleErr = err
			if f != nil {
				f.setDecision(nil) // the attempt must run again
			}
			p.cfg.log(settleBase, slog.LevelError, "republishing the retry failed; the original stays for redelivery", msg, env,
				slog.Int("next_attempt", dec.nextTry), errAttr(err), slog.String("handler_error", dec.errText))
			return
		}
		var seq int64
		if len(seqs) > 0 {
			seq = seqs[0]
		}
		if f != nil {
			f.markScheduled(dec, seq)
		} else {
			dec.scheduled, dec.seq = true, seq
		}
		text := "retry scheduled"
		if dec.held {
			text = "outage mode: message held for the next probe, its attempt not spent"
		}
		p.cfg.log(settleBase, slog.LevelInfo, text, msg, env,
			slog.Int("next_attempt", dec.nextTry), slog.Duration("delay", dec.delay), slog.Time("scheduled_for", dec.at),
			slog.String("retry_message_id", res.RetryMessageID), slog.Int64("retry_sequence_number", seq), slog.String("handler_error", dec.errText))
	}
	res.SequenceNumber = dec.seq
	err := p.complete(d, env)
	if err != nil {
		res.Outcome = OutcomeLeftForRedelivery
		res.SettleErr = err
		res.PossibleDuplicate = true
		p.cfg.log(settleBase, slog.LevelWarn, "retry scheduled but completing the original failed; its redelivery will be completed without running the handler", msg, env, errAttr(err))
		return
	}
	res.Outcome = OutcomeRetryScheduled
	if dec.held {
		res.Outcome = OutcomeHeld
	}
}

// settleDiscard completes a failed delivery that its policy discards, with a warning that says so.
func (p *Processor) settleDiscard(d *delivery, dec *decision, res *Result) {
	p.settleComplete(d, *dec.env, res)
	if res.Outcome != OutcomeCompleted {
		return // left for redelivery; settleComplete logged why
	}
	res.Outcome = OutcomeDiscarded
	p.cfg.log(d.lock.base, slog.LevelWarn, "message discarded by its retry policy", d.msg, *dec.env,
		slog.String("policy", res.Policy), slog.String("error", p.errorText(dec.handlerErr)))
}

// settleDeadLetter dead-letters the message with dec's reason; on failure it stays for redelivery.
func (p *Processor) settleDeadLetter(d *delivery, dec *decision, res *Result) {
	msg := d.msg
	res.DeadLetterReason = dec.reason
	reason, desc := dec.reason, dec.desc
	start := d.now
	ctx, cancel, err := p.cfg.beginLockBound(&d.lock, d.now)
	if err == nil {
		hookStart := p.callStart(d)
		err = d.route.settler.DeadLetterMessage(ctx, msg, &azservicebus.DeadLetterOptions{Reason: &reason, ErrorDescription: &desc, PropertiesToModify: dec.props})
		p.settled(d, SettleDeadLetter, "", *dec.env, hookStart, err)
		err = p.endSettle(d, start, cancel, err)
	}
	if err != nil {
		res.Outcome = OutcomeLeftForRedelivery
		res.SettleErr = err
		p.cfg.log(d.lock.base, slog.LevelError, "dead-lettering failed; the message stays for redelivery", msg, *dec.env, slog.String("reason", reason), errAttr(err))
		return
	}
	res.Outcome = OutcomeDeadLettered
	p.cfg.log(d.lock.base, slog.LevelWarn, "message dead-lettered", msg, *dec.env, slog.String("reason", reason), slog.String("description", desc))
}

// completeProbe completes a connection check's probe message (see isProbe), bounded by the settle
// timeout.
func (p *Processor) completeProbe(settleBase context.Context, d *delivery) Result {
	ctx, cancel := context.WithTimeout(settleBase, p.cfg.settleTimeout)
	defer cancel()
	err := d.route.settler.CompleteMessage(ctx, d.msg, nil)
	if err != nil {
		return Result{Outcome: OutcomeLeftForRedelivery, Attempt: 1, SettleErr: err}
	}
	return Result{Outcome: OutcomeCompleted, Attempt: 1}
}
