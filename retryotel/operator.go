package retryotel

import (
	"context"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbretry/retry/inspect"
)

// An Instrumentation is the [inspect.Observer] of the operator tools: the inspector, and the redrive
// and purge of its selections in cmd/sbretry and the console.
var _ inspect.Observer = (*Instrumentation)(nil)

// deadLetterSuffix ends the path of a dead-letter queue, as package inspect spells it.
const deadLetterSuffix = "/$DeadLetterQueue"

// StartCall makes an [inspect.Observer] of the Instrumentation: pass it as [inspect.Options].Observer
// and every broker call of the inspector, and of a redrive or purge of its selections, becomes a
// CLIENT span "{operation} {queue or topic}", a child of the call's context, with a
// messaging.client.operation.duration measurement:
//
//   - "peek" and "receive" (operation type receive) carry messaging.batch.message_count, the number of
//     messages the call returned, and count them in messaging.client.consumed.messages;
//   - "complete" and "abandon" (type settle) carry messaging.servicebus.disposition_status and the
//     message's messaging.message.id;
//   - "send", a redrive's fresh first delivery (type send), carries its messaging.message.id, counts in
//     messaging.client.sent.messages, and links to the creation context the message carries (the dead
//     letter's traceparent, which the resubmission keeps), so the redrive joins the message's history.
//     Nothing is written into the message, so its creation context stays the dead letter's and the
//     span is CLIENT, not PRODUCER, as the conventions ask of a send whose context is not the
//     message's creation context;
//   - "cancel_scheduled", the cancel of a pending retry copy, carries the copy's messaging.message.id
//     and no messaging.operation.type, which is "Conditionally Required If applicable" and has no value
//     for it (like renew_message_lock).
//
// The destination is the queue, or the topic and messaging.destination.subscription.name; a call on a
// dead-letter queue carries the entity it belongs to and [AttrSubQueue] "dead_letter". Every span and
// metric carries server.address and server.port from [Options], and error.type when the call failed
// (the span's status then holds the redacted error text). No message body or property value other
// than the trace context is read.
func (in *Instrumentation) StartCall(ctx context.Context, c inspect.Call) (context.Context, func(inspect.CallResult)) {
	if ctx == nil {
		ctx = context.Background()
	}
	start := time.Now()
	dest, deadLetter := operatorEntity(c.Entity)
	op := c.Operation
	attrs := []attribute.KeyValue{semconv.MessagingSystemServiceBus, semconv.MessagingOperationName(op)}
	attrs = append(attrs, dest.attrs()...)
	attrs = append(attrs, in.metrics.serverAttrs()...)
	if deadLetter {
		attrs = append(attrs, AttrSubQueue.String(SubQueueDeadLetter))
	}
	var opType attribute.KeyValue
	var extra []attribute.KeyValue
	var links []trace.Link
	switch op {
	case inspect.OpPeek, inspect.OpReceive:
		opType = semconv.MessagingOperationTypeReceive
	case inspect.OpComplete:
		opType = semconv.MessagingOperationTypeSettle
		extra = append(extra, semconv.MessagingServiceBusDispositionStatusComplete)
	case inspect.OpAbandon:
		opType = semconv.MessagingOperationTypeSettle
		extra = append(extra, semconv.MessagingServiceBusDispositionStatusAbandon)
	case inspect.OpSend:
		opType = semconv.MessagingOperationTypeSend
		if sc := in.extract(c.Properties).creation; sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{AttrLink.String(LinkCreation)}})
		}
	}
	if c.MessageID != "" {
		extra = append(extra, semconv.MessagingMessageID(c.MessageID))
	}
	// counted goes on the consumed and sent metrics, which have no messaging.operation.type in the
	// conventions; typed on the span and the operation-duration metric.
	counted := attrs
	typed := attrs
	if opType.Valid() {
		typed = append(attrs[:len(attrs):len(attrs)], opType)
	}
	ctx, span := in.tracer.Start(ctx, dest.spanName(op),
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(start),
		trace.WithLinks(links...),
		trace.WithAttributes(typed...),
		trace.WithAttributes(extra...),
	)
	return ctx, func(r inspect.CallResult) {
		end := time.Now()
		if r.Err != nil {
			et := semconv.ErrorTypeKey.String(errorType(r.Err))
			counted = append(counted[:len(counted):len(counted)], et)
			typed = append(typed[:len(typed):len(typed)], et)
			span.SetAttributes(et)
			span.SetStatus(codes.Error, statusText(r.Err))
		}
		switch op {
		case inspect.OpPeek, inspect.OpReceive:
			// Conditionally required on batch operations; a peek or receive asks for a batch, so it is
			// set also when the reply was empty.
			span.SetAttributes(semconv.MessagingBatchMessageCount(r.Messages))
			in.metrics.recordConsumed(ctx, int64(r.Messages), counted)
		case inspect.OpSend:
			in.metrics.recordSent(ctx, counted)
		}
		in.metrics.recordOperation(ctx, end.Sub(start), typed)
		span.End(trace.WithTimestamp(end))
	}
}

// operatorEntity splits an inspector path into the destination and whether it is the entity's
// dead-letter queue.
func operatorEntity(path string) (destination, bool) {
	if n := len(path) - len(deadLetterSuffix); n >= 0 && strings.EqualFold(path[n:], deadLetterSuffix) {
		return parseEntity(path[:n]), true
	}
	return parseEntity(path), false
}
