package retry

import (
	"context"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/envelope"
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
