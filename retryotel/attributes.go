package retryotel

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/entitypath"
)

// Attribute keys of our own, under the sbretry. prefix so that they can never collide with a semantic
// convention. The semantic-convention keys come from the semconv package (v1.43.0, the version this
// module of OpenTelemetry ships); see https://opentelemetry.io/docs/specs/semconv/messaging/azure-messaging/
// for the Service Bus ones and https://opentelemetry.io/docs/specs/semconv/messaging/messaging-spans/
// for the general messaging ones.
const (
	// AttrAttempt is the attempt number of the delivery (envelope.Envelope.Attempt): 1 for a first
	// delivery. On a "schedule" span and the retries-scheduled metric it is the failed attempt's number.
	AttrAttempt = attribute.Key("sbretry.attempt")
	// AttrOutcome is what the processor did with the delivery, retry.Outcome's String, on every
	// process span (and on the duration histograms with [Options].DurationOutcome):
	//   - "completed": the handler succeeded and the message was completed;
	//   - "retry-scheduled": a retry copy was scheduled for the next attempt, the original completed;
	//   - "dead-lettered": the message was dead-lettered ([AttrDeadLetterReason] says why);
	//   - "left-for-redelivery": the message was deliberately left unsettled (lock lost, shutdown, a
	//     failed settle), so the broker delivers it again;
	//   - "held": the outage breaker was open, so the message was rescheduled without spending an
	//     attempt, for the breaker's next probe;
	//   - "discarded": a retry policy discarded the failure ([AttrPolicy]) and completed the message;
	//   - "deferred": a session consumer held the message durably (deferred in its session, with a
	//     wake-up scheduled), or deferred it behind the hold of an earlier message of its session.
	AttrOutcome = attribute.Key("sbretry.outcome")
	// AttrChainID names the retry chain (envelope.Envelope.ChainID): every attempt of one message carries
	// the same value, so a single attribute query finds a message's whole history across traces.
	AttrChainID = attribute.Key("sbretry.chain_id")
	// AttrCorrelationID is the chain's correlation id (envelope.Envelope.CorrelationID).
	AttrCorrelationID = attribute.Key("sbretry.correlation_id")
	// AttrRetryScheduledFor is when the next attempt is due (RFC 3339, UTC), set for a scheduled retry.
	AttrRetryScheduledFor = attribute.Key("sbretry.retry.scheduled_for")
	// AttrRetryDelay is the wait before the next attempt, in seconds.
	AttrRetryDelay = attribute.Key("sbretry.retry.delay")
	// AttrRetryMessageID is the MessageID of the scheduled retry copy.
	AttrRetryMessageID = attribute.Key("sbretry.retry.message_id")
	// AttrRetrySequenceNumber is the sequence number the broker gave the scheduled copy; it is what an
	// operator cancels a pending retry by.
	AttrRetrySequenceNumber = attribute.Key("sbretry.retry.sequence_number")
	// AttrDeadLetterReason is the DeadLetterReason the processor wrote (retry.Result.DeadLetterReason).
	AttrDeadLetterReason = attribute.Key("sbretry.dead_letter.reason")
	// AttrInherited is true when the handler did not run because an earlier delivery in this process
	// had decided the outcome (retry.Result.Inherited).
	AttrInherited = attribute.Key("sbretry.inherited")
	// AttrPossibleDuplicate is true when the retry copy was scheduled but completing the original failed
	// (retry.Result.PossibleDuplicate).
	AttrPossibleDuplicate = attribute.Key("sbretry.possible_duplicate")
	// AttrLink says what a span link of a process span points at: [LinkCreation] or
	// [LinkPreviousAttempt].
	AttrLink = attribute.Key("sbretry.link")
	// AttrConsumerState is the consumer state (retry.State's String) on the consumer-state metric.
	AttrConsumerState = attribute.Key("sbretry.consumer.state")
	// AttrPolicy names the retry policy rule that took the delivery's last failure (retry.Result.Policy),
	// absent when the Options' policy did.
	AttrPolicy = attribute.Key("sbretry.policy")
	// AttrImmediateRetries is how many immediate retries the delivery made.
	AttrImmediateRetries = attribute.Key("sbretry.immediate_retries")
	// AttrOutageFrom and AttrOutageTo are the outage breaker's states ("closed", "open", "half-open") a
	// change went from and to; AttrOutageManual says that Pause or Resume made it.
	AttrOutageFrom   = attribute.Key("sbretry.outage.from")
	AttrOutageTo     = attribute.Key("sbretry.outage.to")
	AttrOutageManual = attribute.Key("sbretry.outage.manual")
	// AttrSourceName is the queue or topic on which the delivery's retry chain started (the envelope's
	// sbretry-source, split like messaging.destination.name). Every span and metric of every attempt
	// carries it: a subscription's retries are received from and scheduled to its retry queue, so
	// messaging.destination.name says the retry queue there, while this says the topic.
	AttrSourceName = attribute.Key("sbretry.source.name")
	// AttrSourceSubscriptionName is, for a chain that started on a subscription, that subscription's
	// name: a dashboard filtered on it sees the first delivery and every retry of the subscription's
	// messages. The conventions' messaging.destination.subscription.name is set only where messages are
	// received from the subscription ("Conditionally Required If messages are received from the
	// subscription", https://opentelemetry.io/docs/specs/semconv/messaging/azure-messaging/), so it is
	// absent on the retry queue's deliveries; this attribute is not.
	AttrSourceSubscriptionName = attribute.Key("sbretry.source.subscription.name")
	// AttrSubQueue names the sub-queue an operator tool's call was made on ([SubQueueDeadLetter]),
	// absent for a call on the entity itself. A dead-letter queue belongs to its entity: the call's
	// messaging.destination.name (and messaging.destination.subscription.name) name that entity, as
	// they name it for its deliveries, and this attribute tells the two apart.
	AttrSubQueue = attribute.Key("sbretry.sub_queue")
	// AttrSessionID is the Service Bus session id of a message received from a session-enabled entity
	// (the handler's retry.SessionIDFromContext under a retry.SessionConsumer, else the message's
	// SessionID), on the process span and the spans of its broker calls and session lock renewals. The
	// semantic conventions have no attribute for it: the Service Bus attributes
	// (https://opentelemetry.io/docs/specs/semconv/messaging/azure-messaging/) name none,
	// messaging.message.conversation_id is the message's correlation id there (and carries it), and
	// session.id is a client application's user session (https://opentelemetry.io/docs/specs/semconv/general/session/),
	// not a broker's message group. It goes on spans only: session ids are unbounded, so no metric
	// carries it.
	AttrSessionID = attribute.Key("sbretry.session_id")
)

// SubQueueDeadLetter is the value of [AttrSubQueue] for a call on a dead-letter queue.
const SubQueueDeadLetter = "dead_letter"

// Values of [AttrLink].
const (
	// LinkCreation marks the link to the message's creation context: the producer's, or for a chain
	// whose producer was not traced, the first attempt's process span.
	LinkCreation = "creation"
	// LinkPreviousAttempt marks the link from attempt n+1 to attempt n's process span.
	LinkPreviousAttempt = "previous_attempt"
)

// Values of messaging.operation.name. The Service Bus conventions list "complete", "dead_letter",
// "defer" (settlement operations) and "schedule" (a sender operation) as operation names, and "process"
// among their examples (https://opentelemetry.io/docs/specs/semconv/messaging/azure-messaging/).
const (
	opProcess    = "process"
	opComplete   = "complete"
	opDeadLetter = "dead_letter"
	opDefer      = "defer"
	opSchedule   = "schedule"
	// opReceive names the consumed-messages metric: the conventions list receive, peek, poll and
	// consume as its operation names ("messaging.client.consumed.messages",
	// https://opentelemetry.io/docs/specs/semconv/messaging/messaging-metrics/), and Service Bus pulls
	// every message this consumer gets with a receive call.
	opReceive = "receive"
	// opReceiveDeferred is the receive of deferred messages by their sequence numbers, a Service Bus
	// "receiver operation" name in the conventions.
	opReceiveDeferred = "receive_deferred"
	// opRenewLock is the lock renewal, a Service Bus "receiver operation" name in the conventions.
	opRenewLock = "renew_message_lock"
	// opRenewSessionLock is a session lock's renewal, one of the conventions' Service Bus "session
	// operations" (accept_session, get_session_state, set_session_state, renew_session_lock).
	opRenewSessionLock = "renew_session_lock"
)

// Error types this package reports in error.type, besides a Service Bus SDK error's Code ("locklost",
// "connlost", "timeout", "unauthorized", "notfound", "closed") and, for any other error, the canonical
// type name of the innermost error under [fmt.Errorf], [retry.Permanent] and [retry.RetryAfter] wrappers
// (semconv.ErrorType), or the value of an ErrorType() string method anywhere in the error's chain. The
// semantic conventions ask instrumentations to document this list and keep it low in cardinality.
const (
	// ErrorTypeHandlerPanic is a handler that panicked (retry.ErrHandlerPanic).
	ErrorTypeHandlerPanic = "handler_panic"
	// ErrorTypeCanceled is a context cancelled before the operation finished (a handler stopped by a
	// shutdown, a settle cut short). A lock renewal (renew_message_lock, renew_session_lock) that the
	// consumer cancelled itself, because the message was settled, the session released or the consumer
	// stopped, is not a failure: its span has no error.type and an unset status.
	ErrorTypeCanceled = "canceled"
)

// destination is where a delivery came from, split the way the conventions want it: a queue or topic
// in messaging.destination.name and, for a subscription, its name in
// messaging.destination.subscription.name.
type destination struct {
	name, subscription string
}

// parseEntity splits a retry entity path: "queue", or "topic/Subscriptions/subscription" (the segment's
// case is ignored, as Service Bus ignores it).
func parseEntity(path string) destination {
	if topic, sub, ok := entitypath.Split(path); ok {
		return destination{name: topic, subscription: sub}
	}
	return destination{name: path}
}

// attrs returns the destination attributes, leaving out what is unknown.
func (d destination) attrs() []attribute.KeyValue {
	kv := make([]attribute.KeyValue, 0, 2)
	if d.name != "" {
		kv = append(kv, semconv.MessagingDestinationName(d.name))
	}
	if d.subscription != "" {
		kv = append(kv, semconv.MessagingDestinationSubscriptionName(d.subscription))
	}
	return kv
}

// sourceAttrs returns the chain-source attributes ([AttrSourceName], [AttrSourceSubscriptionName]).
func (d destination) sourceAttrs() []attribute.KeyValue {
	kv := make([]attribute.KeyValue, 0, 2)
	if d.name != "" {
		kv = append(kv, AttrSourceName.String(d.name))
	}
	if d.subscription != "" {
		kv = append(kv, AttrSourceSubscriptionName.String(d.subscription))
	}
	return kv
}

// chainSource is where the chain of a delivery received from entity started: the envelope's Source,
// or for a first delivery (whose Source the processor seeds only after OnStart may have run) the
// entity itself.
func chainSource(env envelope.Envelope, entity string) destination {
	if env.Source != "" {
		return parseEntity(env.Source)
	}
	return parseEntity(entity)
}

// spanName is "{messaging.operation.name} {destination}", or the operation alone when the destination is
// unknown, as the messaging span conventions ask.
func (d destination) spanName(op string) string {
	if d.name == "" {
		return op
	}
	return op + " " + d.name
}

// fmtWrapErrorType is the type fmt.Errorf returns for a single %w.
var fmtWrapErrorType = reflect.TypeOf(fmt.Errorf("%w", errors.New("")))

// errorType classifies err for error.type; see the ErrorType constants for the list.
func errorType(err error) string {
	var typed interface{ ErrorType() string }
	if errors.As(err, &typed) {
		if s := typed.ErrorType(); s != "" {
			return s
		}
	}
	var sbErr *azservicebus.Error
	switch {
	case errors.As(err, &sbErr) && sbErr.Code != "":
		return string(sbErr.Code)
	case errors.Is(err, retry.ErrLockLost):
		return string(azservicebus.CodeLockLost)
	case errors.Is(err, retry.ErrHandlerPanic):
		return ErrorTypeHandlerPanic
	case errors.Is(err, context.DeadlineExceeded):
		return string(azservicebus.CodeTimeout)
	case errors.Is(err, context.Canceled):
		return ErrorTypeCanceled
	}
	return semconv.ErrorType(unmark(err)).Value.AsString()
}

// unmark strips the wrappers that say nothing about what failed: fmt.Errorf's, and the retry package's
// Permanent and RetryAfter markers, so that error.type names the handler's own error.
func unmark(err error) error {
	for err != nil {
		var next error
		switch e := err.(type) {
		case *retry.RetryAfterError:
			next = e.Err
		default:
			u := errors.Unwrap(err)
			// The retry package's Permanent marker is unexported: it is the only wrapper in the chain
			// that IsPermanent sees and whose unwrapped error it no longer sees.
			if reflect.TypeOf(err) == fmtWrapErrorType || (u != nil && retry.IsPermanent(err) && !retry.IsPermanent(u)) {
				next = u
			}
		}
		if next == nil {
			return err
		}
		err = next
	}
	return err
}
