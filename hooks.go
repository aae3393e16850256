package retry

import (
	"context"
	"log/slog"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/redact"
	"github.com/sbretry/retry/outage"
)

// Hooks observe the consumer. Each takes a params struct so fields can be added later without breaking
// callers. Hooks run synchronously on the goroutine that did the work: keep them fast and non-blocking.
// A nil hook is skipped. They are what an instrumentation package (tracing, metrics) builds on, without
// the core depending on it.
type Hooks struct {
	// OnStart runs before each attempt: once when a delivery starts, and again before each call of the
	// handler that the same delivery makes after a failure (an immediate retry, or a [SessionConsumer]'s
	// retry held in place), with StartParams.Rerun counting them. The context it returns (which must
	// derive from StartParams.Context) becomes that attempt's handler context and the Context of the
	// later hooks, so a tracer can start a span here (and keep it, when Rerun > 0). Returning nil
	// keeps the context. A deadline set on it times that attempt out, and each attempt gets its own:
	// StartParams.Context is the delivery's context before OnStart, never an earlier attempt's. A
	// failure once it has expired is a failed attempt, retried with its backoff.
	OnStart func(StartParams) context.Context
	// OnRetryCopy runs before a retry copy is scheduled, so a tracer can carry its trace context into
	// the copy's application properties (attempt n+1 then links to attempt n). It may add properties;
	// the MessageID is restored if changed, and the size limits are checked after the hook. For a
	// [SessionConsumer]'s durable hold, Copy is the held message itself, with the properties its
	// deferral writes: what the hook adds is written on the deferred message, which the resumed
	// attempt reads.
	OnRetryCopy func(RetryCopyParams)
	// OnSettle runs after each broker call made for a delivery: "schedule" (the retry copy),
	// "complete" and "dead-letter", with its timing and error; for a [SessionConsumer]'s durable
	// holds also "defer", "schedule" for the wake-up (RetryMessageID is its MessageID), and
	// "complete" of a wake-up once done, with the wake-up as Message ([github.com/sbretry/retry/sessionstate.IsWakeUp]) and a zero Envelope.
	OnSettle func(SettleParams)
	// OnProcessed runs once per delivery after it is settled (or deliberately left unsettled).
	OnProcessed func(ProcessedParams)
	// OnStateChange runs when the consumer's [State] changes, one change at a time and in order. It
	// must return promptly and must not wait for Run to return: the next change (draining, say, which
	// readiness reports) waits for it, and Run waits for the draining call.
	OnStateChange func(StateChangeParams)
	// OnOutage runs when the outage breaker changes state (see [outage.Options]): a trip, a probe
	// starting, a probe's verdict, a pause or a resume by hand; one change at a time and in order, on
	// the goroutine that caused it (or one that caused a later change), so it must return promptly. It
	// may call Consumer.Pause and Resume: their change is reported after it returns.
	OnOutage func(outage.Change)
}

// StartParams describes a delivery about to be handled. OnStart runs for every delivery, also for one
// with malformed retry properties, which is dead-lettered without calling the handler.
type StartParams struct {
	Context  context.Context
	Message  *azservicebus.ReceivedMessage
	Envelope envelope.Envelope
	// EntityPath is the entity the message was received from.
	EntityPath string
	// Time is when processing started (the attempt, when Rerun > 0), on the processor's Clock.
	Time time.Time
	// Rerun is 0 when the delivery starts, and n before the handler's nth further call in the same
	// delivery (Envelope.Attempt has moved on with it). A hook that starts per-delivery work (a span,
	// a timer) starts it when Rerun is 0 and keeps it for the reruns.
	Rerun int
}

// RetryCopyParams describes a retry copy about to be scheduled.
type RetryCopyParams struct {
	Context  context.Context
	Message  *azservicebus.ReceivedMessage
	Envelope envelope.Envelope
	// Copy is the message to be scheduled; the hook may add application properties.
	Copy *azservicebus.Message
	// Attempt is the attempt number the copy carries; ScheduledFor is when it is due.
	Attempt      int
	ScheduledFor time.Time
}

// Operations reported in SettleParams.Operation.
const (
	SettleSchedule   = "schedule"
	SettleComplete   = "complete"
	SettleDeadLetter = "dead-letter"
	// SettleDefer is a [SessionConsumer]'s deferral of a message it holds durably.
	SettleDefer = "defer"
)

// SettleParams describes one broker call made for a delivery.
type SettleParams struct {
	Context  context.Context
	Message  *azservicebus.ReceivedMessage
	Envelope envelope.Envelope
	// EntityPath is the entity the message was received from.
	EntityPath string
	// Operation is [SettleSchedule], [SettleComplete], [SettleDeadLetter] or [SettleDefer].
	Operation string
	// RetryMessageID is the MessageID of the copy, for SettleSchedule.
	RetryMessageID string
	Start          time.Time
	Duration       time.Duration
	Err            error
}

// ProcessedParams describes one processed delivery.
type ProcessedParams struct {
	// Context is the delivery's context (the one OnStart returned, if it did).
	Context  context.Context
	Message  *azservicebus.ReceivedMessage
	Envelope envelope.Envelope
	Result   Result
	// EntityPath is the entity the message was received from.
	EntityPath string
	// HandlerDuration is how long the handler ran (zero if it did not run); Duration is the whole
	// processing, settles included.
	HandlerDuration, Duration time.Duration
}

// StateChangeParams describes a consumer state transition.
type StateChangeParams struct {
	From, To State
	// Err is the failure that caused the change, if any.
	Err error
}

// finish reports res to the OnProcessed hook and returns it, so every path through Process is
// observed exactly once.
func (p *Processor) finish(d *delivery, env envelope.Envelope, res Result) Result {
	if hook := p.cfg.hooks.OnProcessed; hook != nil {
		hook(ProcessedParams{
			Context: d.ctx, Message: d.msg, Envelope: env, Result: res, EntityPath: d.route.entity,
			HandlerDuration: d.handlerTime, Duration: p.cfg.clock.Now().Sub(d.start),
		})
	}
	return res
}

// started runs the OnStart hook for the delivery's first attempt, whose context becomes the
// delivery's.
func (p *Processor) started(d *delivery) context.Context {
	d.base = d.ctx
	return p.startAttempt(d, 0, d.start)
}

// startAttempt runs the OnStart hook before the handler's call number rerun+1 in d, at, on the
// delivery's context before any OnStart (d.base): each attempt's context, and the deadline a hook sets
// on it, is its own.
func (p *Processor) startAttempt(d *delivery, rerun int, at time.Time) context.Context {
	d.ctx = d.base
	if hook := p.cfg.hooks.OnStart; hook != nil {
		if hctx := hook(StartParams{Context: d.base, Message: d.msg, Envelope: d.env, EntityPath: d.route.entity, Time: at, Rerun: rerun}); hctx != nil {
			d.ctx = hctx
		}
	}
	return d.ctx
}

// callStart is when a broker call for d starts, as the OnSettle hook reports it: read from the clock
// only when the hook is set.
func (p *Processor) callStart(d *delivery) time.Time {
	if p.cfg.hooks.OnSettle == nil {
		return d.now
	}
	return p.cfg.clock.Now()
}

// settled reports one broker call made for a delivery, started at start, to the OnSettle hook; copyID
// is the retry copy's MessageID when the call scheduled it.
func (p *Processor) settled(d *delivery, op, copyID string, env envelope.Envelope, start time.Time, err error) {
	if hook := p.cfg.hooks.OnSettle; hook != nil {
		hook(SettleParams{Context: d.ctx, Message: d.msg, Envelope: env, EntityPath: d.route.entity, Operation: op, RetryMessageID: copyID,
			Start: start, Duration: p.cfg.clock.Now().Sub(start), Err: err})
	}
}

// log writes one line with the message's identity. Bodies are never logged.
func (p *Processor) log(ctx context.Context, level slog.Level, text string, msg *azservicebus.ReceivedMessage, env envelope.Envelope, attrs ...slog.Attr) {
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
