package retry

import (
	"context"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/envelope"
)

// Result describes one [Processor.Process] call.
type Result struct {
	Outcome Outcome
	// Attempt is the attempt number of the processed delivery: of its last handler call, when it made
	// immediate retries.
	Attempt int
	// ImmediateRetries is how many immediate retries the delivery made (see Options.ImmediateRetries).
	ImmediateRetries int
	// Policy names the [Rule] that took the last failure; empty when the Options' policy did.
	Policy string
	// HandlerErr is the error the handler returned (nil on success), still wrapped by [Permanent] or
	// [RetryAfter] if it was; errors.Is and errors.As see through both.
	HandlerErr error
	// Delay, ScheduledFor and SequenceNumber describe the scheduled retry (OutcomeRetryScheduled), or
	// the held copy (OutcomeHeld); for a durable hold (OutcomeDeferred with a HandlerErr), Delay and
	// ScheduledFor say when its next attempt is due.
	Delay          time.Duration
	ScheduledFor   time.Time
	SequenceNumber int64
	// RetryMessageID is the MessageID of the scheduled or held copy.
	RetryMessageID string
	// DeadLetterReason is set for OutcomeDeadLettered (and for failed dead-letter calls).
	DeadLetterReason string
	// SettleErr is the republish, complete or dead-letter failure, if any.
	SettleErr error
	// PossibleDuplicate is true when the retry copy was scheduled but completing the original failed:
	// the broker will redeliver the original. A redelivery that reaches this process completes it without
	// running the handler again (see Inherited); one that reaches another process runs the handler, and its
	// republish reuses the same MessageID, which duplicate detection absorbs. For a [SessionConsumer] it
	// is true when a complete, dead-letter or defer succeeded only after the SDK retried it, which may
	// not have settled it: the session is released, and the message, if still there, comes back before
	// its successors (to run again, or, for a defer, to be deferred again or run once due).
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
//
// The path of one message, file by file: process.go (Process, then its stages in order: decode, keep
// the lock, wait for an earlier delivery, take a handler slot, run the handler, decide, settle, report),
// and what the stages call, none of which calls back: envelope.go (seed the envelope), lockrenewer.go
// (the lock, from receive to settle), flights.go (the memory of deliveries in flight and their
// decisions), decision.go (what a failure becomes), settle.go (the broker calls), observe.go (the hooks
// and the log). This file holds what they share: the Processor, the delivery and its Result. The
// consumer's side of a handler slot is slots.go.
type Processor struct {
	sender   Sender
	handler  Handler
	cfg      *config
	entity   string
	flights  flights
	renewals renewals
	// outage is the consumer's breaker (outage.go); nil for a Processor of one's own, which has no
	// receive loop to pause.
	outage *breaker
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
	return &Processor{sender: sender, handler: handler, cfg: cfg, entity: cfg.entityPath, renewals: renewals{clk: cfg.clock}}
}

// route is where a delivery came from and where its retry copy goes.
type route struct {
	settler Settler // the receiver the message came through
	sender  Sender  // the republish target
	entity  string  // the entity the message came from; it names retry chains
}

// handlerSlot is how a concurrency limit lends a delivery its handler slot: acquire takes one before
// the handler runs (at once if the delivery holds one; waiting otherwise, until ctx ends or the lock
// does), release gives it back once the handler has returned, or while the delivery waits for an
// earlier delivery of the same message, so that the limit's owner can start another handler while this
// one's settle is still in flight. Process without a consumer has none.
type handlerSlot interface {
	acquire(ctx context.Context, lock lockState) bool
	release()
}

// lockState is a lock as acquire sees it: whether it is over, and a channel closed when it ends, asked
// for only when the delivery has to wait (the lock makes it on demand).
type lockState interface {
	ended() bool
	Done() <-chan struct{}
}

// delivery is the state of one delivery on its way through the processor, allocated once: what the
// hooks see, the envelope, the lock, the entry in the in-flight registry and a success's decision.
type delivery struct {
	msg   *azservicebus.ReceivedMessage
	route route
	// ctx is the context the hooks see (OnStart's, of the latest attempt); cleared when the delivery is
	// finished, so that a remembered outcome does not keep it alive. base is the context before OnStart,
	// from which each attempt's is made.
	ctx, base context.Context
	// start is when processing began; now is the latest time read for this delivery (at the start, after
	// the handler, after each broker call): reading the clock once per step instead of once per use is
	// measurable. handlerTime is how long the handler ran.
	start, now  time.Time
	handlerTime time.Duration

	env    envelope.Envelope
	lock   lockKeeper
	flight flight
	dec    decision
}

// noSlot is the handler slot of a delivery with no concurrency limit around it (Process).
type noSlot struct{}

func (noSlot) acquire(context.Context, lockState) bool { return true }
func (noSlot) release()                                {}

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
	// OutcomeHeld: the outage breaker was open (see [outage.Options], [Consumer.Pause]), so the message
	// was rescheduled unchanged, its attempt not spent, for when the breaker probes next, and the
	// original completed.
	OutcomeHeld
	// OutcomeDiscarded: a [Policy] with [ActionDiscard] took the failure; the message was completed
	// without success.
	OutcomeDiscarded
	// OutcomeDeferred: a [SessionConsumer] held the message durably (SessionOptions.DurableHolds): it
	// was deferred in its session, with the hold recorded in the session state and a wake-up
	// scheduled for when its next attempt is due.
	OutcomeDeferred
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
	case OutcomeHeld:
		return "held"
	case OutcomeDiscarded:
		return "discarded"
	case OutcomeDeferred:
		return "deferred"
	}
	return "unknown"
}
