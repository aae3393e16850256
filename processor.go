package retry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
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
	// the broker will redeliver the original, and the next republish reuses the same MessageID, which
	// duplicate detection absorbs.
	PossibleDuplicate bool
}

// Processor runs the handler for one message and settles it: complete on success, schedule a retry copy
// then complete on failure, dead-letter when attempts are spent. It holds no per-message state and is
// safe for concurrent use; [Consumer] is the receive loop around it. Use it directly when you own the
// receive loop. Create it with [NewProcessor]; the zero value is not usable.
type Processor struct {
	sender  Sender
	handler Handler
	cfg     *config
}

// NewProcessor returns a Processor that republishes retries through sender (the entity the retry copies
// go to: the queue itself, or for a subscription, its topic). nil opts means defaults.
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

// newProcessor builds a Processor on an already validated config; the Consumer calls it once per
// connection, because each connection has its own Sender.
func newProcessor(sender Sender, handler Handler, cfg *config) *Processor {
	return &Processor{sender: sender, handler: handler, cfg: cfg}
}

// Process handles msg, received in peek-lock mode through settler. It calls the handler with a context
// that carries the [Envelope] and is cancelled when ctx ends or the lock is lost; while the handler runs,
// the lock is renewed. Settle calls use a context detached from ctx and bounded by the settle timeout, so
// a successful handler's message is completed even during shutdown. A handler that fails after ctx ended
// is not settled: the broker redelivers the message.
func (p *Processor) Process(ctx context.Context, settler Settler, msg *azservicebus.ReceivedMessage) Result {
	if msg == nil {
		return Result{Outcome: OutcomeLeftForRedelivery, SettleErr: ErrNilMessage}
	}
	env, envErr := DecodeEnvelope(msg)
	if envErr != nil {
		res := Result{Attempt: env.Attempt}
		env = Envelope{Attempt: 0, OriginalMessageID: msg.MessageID}
		p.deadLetter(ctx, settler, msg, env, &res, p.cfg.reasons.InvalidEnvelope, envErr)
		return p.finish(msg, env, res)
	}
	res := Result{Attempt: env.Attempt}
	env = p.seed(msg, env)

	handlerErr, lockLost := p.runHandler(ctx, settler, msg, env)
	res.HandlerErr = handlerErr
	switch {
	case lockLost:
		res.Outcome = OutcomeLeftForRedelivery
		res.SettleErr = ErrLockLost
		p.log(ctx, slog.LevelWarn, "message lock lost while the handler ran; the broker will redeliver it", msg, env)
	case handlerErr == nil:
		p.complete(ctx, settler, msg, env, &res)
	case ctx.Err() != nil:
		// Shutdown cancelled the handler; leave the message for redelivery rather than count an attempt.
		res.Outcome = OutcomeLeftForRedelivery
		p.log(ctx, slog.LevelInfo, "handler failed during shutdown; the broker will redeliver the message", msg, env, errAttr(handlerErr))
	default:
		p.fail(ctx, settler, msg, env, &res)
	}
	return p.finish(msg, env, res)
}

// runHandler runs the handler with lock renewal. It reports the handler's error and whether the lock
// was lost (in which case the error is meaningless and nothing may be settled).
func (p *Processor) runHandler(ctx context.Context, settler Settler, msg *azservicebus.ReceivedMessage, env Envelope) (err error, lockLost bool) {
	hctx, cancel := context.WithCancelCause(withEnvelope(ctx, env))
	defer cancel(nil)

	if !p.cfg.lockRenewal {
		return p.callHandler(hctx, msg), false
	}
	// stop ends the renewal as soon as the handler returns, aborting a renew call in flight, so that a
	// hanging broker cannot hold up the settle that follows.
	stop, stopRenewal := context.WithCancel(hctx)
	renewDone := make(chan struct{})
	go func() {
		defer close(renewDone)
		p.renewLock(stop, cancel, settler, msg, env)
	}()
	err = p.callHandler(hctx, msg)
	stopRenewal()
	<-renewDone
	return err, errors.Is(context.Cause(hctx), ErrLockLost)
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

// renewLock keeps msg's lock alive until stop ends. On a lost lock it cancels the handler context with
// [ErrLockLost]. It is the only writer of msg.LockedUntil (the SDK updates it on renewal) while the
// handler runs.
func (p *Processor) renewLock(stop context.Context, cancel context.CancelCauseFunc, settler Settler, msg *azservicebus.ReceivedMessage, env Envelope) {
	clk := p.cfg.clock
	for {
		wait := p.renewWait(msg)
		select {
		case <-stop.Done():
			return
		case <-clk.After(wait):
		}
		rctx, rcancel := context.WithTimeout(stop, p.cfg.settleTimeout)
		err := settler.RenewMessageLock(rctx, msg, nil)
		rcancel()
		if err == nil {
			continue
		}
		if stop.Err() != nil {
			return // the handler finished while the renewal was in flight
		}
		expired := msg.LockedUntil != nil && !clk.Now().Before(*msg.LockedUntil)
		if code, ok := sdkCode(err); (ok && code == azservicebus.CodeLockLost) || expired {
			p.log(stop, slog.LevelWarn, "lock renewal failed: lock lost", msg, env, errAttr(err))
			cancel(ErrLockLost)
			return
		}
		p.log(stop, slog.LevelWarn, "lock renewal failed; will try again", msg, env, errAttr(err))
	}
}

// renewWait is the time until the next renewal: the configured interval, or half of the lock's
// remaining time (at least a second).
func (p *Processor) renewWait(msg *azservicebus.ReceivedMessage) time.Duration {
	if p.cfg.lockRenewInterval > 0 {
		return p.cfg.lockRenewInterval
	}
	wait := 30 * time.Second
	if msg.LockedUntil != nil {
		wait = msg.LockedUntil.Sub(p.cfg.clock.Now()) / 2
	}
	if wait < time.Second {
		wait = time.Second
	}
	return wait
}

// fail decides between retry and dead-letter after a failed attempt.
func (p *Processor) fail(ctx context.Context, settler Settler, msg *azservicebus.ReceivedMessage, env Envelope, res *Result) {
	cfg := p.cfg
	herr := res.HandlerErr
	switch {
	case IsPermanent(herr):
		p.deadLetter(ctx, settler, msg, env, res, cfg.reasons.Permanent, herr)
		return
	case env.Attempt >= cfg.maxAttempts:
		p.deadLetter(ctx, settler, msg, env, res, cfg.reasons.MaxAttempts, herr)
		return
	case hasNonDataBody(msg):
		p.deadLetter(ctx, settler, msg, env, res, cfg.reasons.UnsupportedBody, herr)
		return
	}

	delay := cfg.backoff.Delay(env.Attempt)
	var ra *RetryAfterError
	if errors.As(herr, &ra) {
		delay = min(ra.Delay, cfg.maxDelay)
	}
	now := cfg.clock.Now()
	at := now.Add(delay)
	if cfg.retryBudget > 0 && !env.FirstEnqueuedTime.IsZero() && at.After(env.FirstEnqueuedTime.Add(cfg.retryBudget)) {
		p.deadLetter(ctx, settler, msg, env, res, cfg.reasons.BudgetExhausted, herr)
		return
	}

	next := env.Attempt + 1
	errText := truncate(redact.String(herr.Error()), cfg.descriptionLimit)
	copyMsg := retryCopy(msg, env, next, errText)
	if !fitsLimits(copyMsg, cfg.maxMessageSize) {
		p.deadLetter(ctx, settler, msg, env, res, cfg.reasons.MessageTooLarge, herr)
		return
	}
	res.Delay, res.ScheduledFor, res.RetryMessageID = delay, at, *copyMsg.MessageID

	sctx, cancel := p.settleContext(ctx)
	seqs, err := p.sender.ScheduleMessages(sctx, []*azservicebus.Message{copyMsg}, at, nil)
	cancel()
	if err != nil {
		res.Outcome = OutcomeLeftForRedelivery
		res.SettleErr = err
		p.log(ctx, slog.LevelError, "republishing the retry failed; the original stays for redelivery", msg, env,
			slog.Int("next_attempt", next), errAttr(err), slog.String("handler_error", errText))
		return
	}
	if len(seqs) > 0 {
		res.SequenceNumber = seqs[0]
	}
	p.log(ctx, slog.LevelInfo, "retry scheduled", msg, env,
		slog.Int("next_attempt", next), slog.Duration("delay", delay), slog.Time("scheduled_for", at),
		slog.String("retry_message_id", res.RetryMessageID), slog.String("handler_error", errText))

	cctx, cancel := p.settleContext(ctx)
	err = settler.CompleteMessage(cctx, msg, nil)
	cancel()
	if err != nil {
		res.Outcome = OutcomeLeftForRedelivery
		res.SettleErr = err
		res.PossibleDuplicate = true
		p.log(ctx, slog.LevelWarn, "retry scheduled but completing the original failed; duplicate detection absorbs the re-republish", msg, env, errAttr(err))
		return
	}
	res.Outcome = OutcomeRetryScheduled
}

// complete settles a successful delivery.
func (p *Processor) complete(ctx context.Context, settler Settler, msg *azservicebus.ReceivedMessage, env Envelope, res *Result) {
	cctx, cancel := p.settleContext(ctx)
	err := settler.CompleteMessage(cctx, msg, nil)
	cancel()
	if err != nil {
		res.Outcome = OutcomeLeftForRedelivery
		res.SettleErr = err
		level := slog.LevelError
		if brokerWillRedeliver(err) {
			level = slog.LevelWarn
		}
		p.log(ctx, level, "completing the message failed; the broker will redeliver it", msg, env, errAttr(err))
		return
	}
	res.Outcome = OutcomeCompleted
	p.log(ctx, slog.LevelDebug, "message completed", msg, env)
}

// deadLetter dead-letters msg with reason; on failure the message stays for redelivery.
func (p *Processor) deadLetter(ctx context.Context, settler Settler, msg *azservicebus.ReceivedMessage, env Envelope, res *Result, reason string, cause error) {
	desc := ""
	if cause != nil {
		desc = truncate(redact.String(cause.Error()), p.cfg.descriptionLimit)
	}
	res.DeadLetterReason = reason
	dctx, cancel := p.settleContext(ctx)
	err := settler.DeadLetterMessage(dctx, msg, &azservicebus.DeadLetterOptions{Reason: &reason, ErrorDescription: &desc})
	cancel()
	if err != nil {
		res.Outcome = OutcomeLeftForRedelivery
		res.SettleErr = err
		p.log(ctx, slog.LevelError, "dead-lettering failed; the message stays for redelivery", msg, env, slog.String("reason", reason), errAttr(err))
		return
	}
	res.Outcome = OutcomeDeadLettered
	p.log(ctx, slog.LevelWarn, "message dead-lettered", msg, env, slog.String("reason", reason), slog.String("description", desc))
}

// settleContext bounds one broker call by the settle timeout. It is detached from ctx so that a
// successful handler is still completed during shutdown; the timeout matters because the SDK's settle
// path can retry for about 50 s after a connection drop.
func (p *Processor) settleContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), p.cfg.settleTimeout)
}

// seed fills the key and correlation id of a first delivery: the correlation id comes from the
// message's CorrelationID, else from the idempotency key. Retry copies carry both already.
func (p *Processor) seed(msg *azservicebus.ReceivedMessage, env Envelope) Envelope {
	if env.Key == "" {
		env.Key = p.idempotencyKey(msg)
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
	return env
}

// idempotencyKey returns the configured key, falling back to the sequence number and then the lock
// token so that a message without a MessageID still gets a stable key.
func (p *Processor) idempotencyKey(msg *azservicebus.ReceivedMessage) string {
	if k := p.cfg.key(msg); k != "" {
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
func (p *Processor) finish(msg *azservicebus.ReceivedMessage, env Envelope, res Result) Result {
	if hook := p.cfg.hooks.OnProcessed; hook != nil {
		hook(ProcessedParams{Message: msg, Envelope: env, Result: res})
	}
	return res
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
	lg.LogAttrs(ctx, level, text, append(base, attrs...)...)
}

// errAttr renders err with secrets redacted.
func errAttr(err error) slog.Attr {
	if err == nil {
		return slog.String("error", "")
	}
	return slog.String("error", redact.String(err.Error()))
}
