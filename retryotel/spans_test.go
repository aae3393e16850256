package retryotel_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/retryotel"
	"github.com/sbretry/retry/retrytest"
)

// Attempt 1 fails and attempt 2 succeeds: attempt 2's process span links to attempt 1's, both link to
// the producer, and each has its broker calls as child spans.
func TestRetryChainLinksAttempts(t *testing.T) {
	h := &failOnce{}
	f := newFixture(t, h.handle, nil)
	producer, props := f.producerContext()
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("order-42"), CorrelationID: strPtr("conv-7"), Body: []byte("{}"), ApplicationProperties: props})
	enqueued := f.clock.Now()

	res1 := f.process()
	require.Equal(t, retry.OutcomeRetryScheduled, res1.Outcome)
	_, ok := f.broker.AdvanceToNextScheduled(f.clock)
	require.True(t, ok)
	res2 := f.process()
	require.Equal(t, retry.OutcomeCompleted, res2.Outcome)

	processes := f.ended("process orders")
	require.Len(t, processes, 2)
	first, second := processes[0], processes[1]

	// Attempt 1: a CONSUMER span with the conventions' attributes and ours, linked to the producer.
	assert.Equal(t, trace.SpanKindConsumer, first.SpanKind())
	assert.False(t, first.Parent().IsValid(), "the ambient context (none here) is the parent; the message's context is a link")
	a := attrs(first)
	assert.Equal(t, "servicebus", a["messaging.system"].AsString())
	assert.Equal(t, "orders", a["messaging.destination.name"].AsString())
	assert.NotContains(t, a, attribute.Key("messaging.destination.subscription.name"))
	assert.Equal(t, "process", a["messaging.operation.type"].AsString())
	assert.Equal(t, "process", a["messaging.operation.name"].AsString())
	assert.Equal(t, "order-42", a["messaging.message.id"].AsString())
	assert.Equal(t, "conv-7", a["messaging.message.conversation_id"].AsString())
	assert.Equal(t, int64(1), a["messaging.servicebus.message.delivery_count"].AsInt64())
	assert.Equal(t, enqueued.Unix(), a["messaging.servicebus.message.enqueued_time"].AsInt64())
	assert.Equal(t, int64(1), a["sbretry.attempt"].AsInt64())
	assert.Equal(t, "retry-scheduled", a["sbretry.outcome"].AsString())
	assert.Equal(t, res1.ScheduledFor.UTC().Format(time.RFC3339Nano), a["sbretry.retry.scheduled_for"].AsString())
	assert.Equal(t, res1.Delay.Seconds(), a["sbretry.retry.delay"].AsFloat64())
	assert.Equal(t, res1.RetryMessageID, a["sbretry.retry.message_id"].AsString())
	assert.Equal(t, res1.SequenceNumber, a["sbretry.retry.sequence_number"].AsInt64())
	assert.False(t, a["sbretry.inherited"].AsBool())
	assert.False(t, a["sbretry.possible_duplicate"].AsBool())
	assert.Equal(t, "*errors.errorString", a["error.type"].AsString())
	assert.Equal(t, sdktrace.Status{Code: codes.Error, Description: "payment service unavailable"}, first.Status())
	require.Len(t, first.Links(), 1)
	assert.True(t, sameSpan(producer, first.Links()[0].SpanContext))
	assert.Contains(t, first.Links()[0].Attributes, retryotel.AttrLink.String(retryotel.LinkCreation))
	assert.True(t, sameSpan(first.SpanContext(), h.seen[0]), "the handler runs in the process span")

	// The copy carries attempt 1's context, in all three properties, and the chain's origin.
	copyProps := f.broker.Scheduled()[0].Message.ApplicationProperties
	tp, _ := copyProps[retryotel.PropTraceparent].(string)
	assert.Contains(t, tp, first.SpanContext().SpanID().String())
	assert.Equal(t, tp, copyProps[retryotel.PropDiagnosticID])
	origin, _ := copyProps[retryotel.PropOriginTraceparent].(string)
	assert.Contains(t, origin, producer.SpanID().String())

	// Attempt 2 links to attempt 1 and straight back to the producer.
	b := attrs(second)
	assert.Equal(t, int64(2), b["sbretry.attempt"].AsInt64())
	assert.Equal(t, "completed", b["sbretry.outcome"].AsString())
	assert.Equal(t, res1.RetryMessageID, b["messaging.message.id"].AsString())
	assert.Equal(t, a["sbretry.chain_id"].AsString(), b["sbretry.chain_id"].AsString(), "one attribute names the whole history")
	assert.NotEmpty(t, b["sbretry.chain_id"].AsString())
	assert.NotContains(t, b, attribute.Key("error.type"))
	assert.Equal(t, codes.Unset, second.Status().Code)
	require.Len(t, second.Links(), 2)
	assert.True(t, sameSpan(first.SpanContext(), second.Links()[0].SpanContext), "attempt 2 links to attempt 1")
	assert.ElementsMatch(t, []attribute.KeyValue{retryotel.AttrLink.String(retryotel.LinkPreviousAttempt), retryotel.AttrAttempt.Int(1)}, second.Links()[0].Attributes)
	assert.True(t, sameSpan(producer, second.Links()[1].SpanContext), "and to the producer")
	assert.NotEqual(t, first.SpanContext().TraceID(), second.SpanContext().TraceID(), "links, not parents, by default")

	// Settle spans: children of their process span, CLIENT, with explicit timestamps.
	schedule := f.ended("schedule orders")
	require.Len(t, schedule, 1)
	assert.Equal(t, first.SpanContext().SpanID(), schedule[0].Parent().SpanID())
	assert.Equal(t, trace.SpanKindClient, schedule[0].SpanKind())
	s := attrs(schedule[0])
	assert.Equal(t, "send", s["messaging.operation.type"].AsString())
	assert.Equal(t, "schedule", s["messaging.operation.name"].AsString())
	assert.Equal(t, res1.RetryMessageID, s["messaging.message.id"].AsString())
	assert.Equal(t, int64(1), s["sbretry.attempt"].AsInt64())
	assert.Equal(t, res1.ScheduledFor.UTC().Format(time.RFC3339Nano), s["sbretry.retry.scheduled_for"].AsString())

	completes := f.ended("complete orders")
	require.Len(t, completes, 2)
	assert.Equal(t, first.SpanContext().SpanID(), completes[0].Parent().SpanID())
	assert.Equal(t, second.SpanContext().SpanID(), completes[1].Parent().SpanID())
	for _, c := range completes {
		ca := attrs(c)
		assert.Equal(t, "settle", ca["messaging.operation.type"].AsString())
		assert.Equal(t, "complete", ca["messaging.operation.name"].AsString())
		assert.Equal(t, "complete", ca["messaging.servicebus.disposition_status"].AsString())
		assert.Equal(t, "servicebus", ca["messaging.system"].AsString())
		assert.Equal(t, codes.Unset, c.Status().Code)
		assert.False(t, c.EndTime().Before(c.StartTime()))
	}
}

func TestParentFromMessageMakesOneTrace(t *testing.T) {
	h := &failOnce{}
	f := newFixture(t, h.handle, &fixtureOptions{otel: retryotel.Options{ParentFromMessage: true}})
	producer, props := f.producerContext()
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("order-42"), ApplicationProperties: props})
	f.process()
	f.broker.AdvanceToNextScheduled(f.clock)
	f.process()

	processes := f.ended("process orders")
	require.Len(t, processes, 2)
	assert.Equal(t, producer.SpanID(), processes[0].Parent().SpanID())
	assert.Equal(t, processes[0].SpanContext().SpanID(), processes[1].Parent().SpanID(), "attempt 2 is a child of attempt 1")
	assert.Equal(t, producer.TraceID(), processes[1].SpanContext().TraceID(), "producer and every attempt share one trace")
}

func TestDeadLetterSpan(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error {
		return retry.Permanent(errors.New("order 42 has no lines"))
	}, nil)
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("order-42")})
	res := f.process()
	require.Equal(t, retry.OutcomeDeadLettered, res.Outcome)

	processes := f.ended("process orders")
	require.Len(t, processes, 1)
	a := attrs(processes[0])
	assert.Equal(t, "dead-lettered", a["sbretry.outcome"].AsString())
	assert.Equal(t, "RetryPermanentFailure", a["sbretry.dead_letter.reason"].AsString())
	assert.Equal(t, "*errors.errorString", a["error.type"].AsString(), "the Permanent marker is not the error's type")
	assert.Empty(t, processes[0].Links(), "an untraced producer leaves nothing to link to")

	dl := f.ended("dead_letter orders")
	require.Len(t, dl, 1)
	d := attrs(dl[0])
	assert.Equal(t, "settle", d["messaging.operation.type"].AsString())
	assert.Equal(t, "dead_letter", d["messaging.operation.name"].AsString())
	assert.Equal(t, "dead_letter", d["messaging.servicebus.disposition_status"].AsString())
	assert.Equal(t, processes[0].SpanContext().SpanID(), dl[0].Parent().SpanID())
}

func TestFailedSettleSpanAndPossibleDuplicate(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errUnavailable }, nil)
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("order-42")})
	f.broker.Fail(retrytest.OpComplete, 1, nil)
	res := f.process()
	require.True(t, res.PossibleDuplicate)

	completes := f.ended("complete orders")
	require.Len(t, completes, 1)
	assert.Equal(t, codes.Error, completes[0].Status().Code)
	assert.Equal(t, retrytest.ErrInjected.Error(), completes[0].Status().Description)
	assert.Equal(t, "*errors.errorString", attrs(completes[0])["error.type"].AsString())

	a := attrs(f.ended("process orders")[0])
	assert.Equal(t, "left-for-redelivery", a["sbretry.outcome"].AsString())
	assert.True(t, a["sbretry.possible_duplicate"].AsBool())
	assert.Equal(t, res.RetryMessageID, a["sbretry.retry.message_id"].AsString())
}

func TestSubscriptionEntity(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return nil },
		&fixtureOptions{retry: retry.Options{EntityPath: "events/Subscriptions/billing"}})
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("evt-1")})
	f.process()

	processes := f.ended("process events")
	require.Len(t, processes, 1)
	a := attrs(processes[0])
	assert.Equal(t, "events", a["messaging.destination.name"].AsString())
	assert.Equal(t, "billing", a["messaging.destination.subscription.name"].AsString())
	require.Len(t, f.ended("complete events"), 1)
}

// A producer that writes only Diagnostic-Id (older Azure SDKs) is still linked.
func TestDiagnosticIDIsRead(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return nil }, nil)
	producer, props := f.producerContext()
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("order-42"), ApplicationProperties: map[string]any{
		retryotel.PropDiagnosticID: props[retryotel.PropTraceparent],
	}})
	f.process()
	processes := f.ended("process orders")
	require.Len(t, processes, 1)
	require.Len(t, processes[0].Links(), 1)
	assert.True(t, sameSpan(producer, processes[0].Links()[0].SpanContext))
}

// A custom propagator's fields are written next to the W3C ones, and a stale tracestate inherited from
// the original is not left behind.
func TestRetryCopyReplacesInheritedContext(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errUnavailable },
		&fixtureOptions{otel: retryotel.Options{Propagator: propagation.NewCompositeTextMapPropagator(propagation.Baggage{})}})
	_, props := f.producerContext()
	props[retryotel.PropTracestate] = "vendor=stale"
	props["baggage"] = "tenant=contoso"
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("order-42"), ApplicationProperties: props})
	f.process()

	first := f.ended("process orders")[0]
	copyProps := f.broker.Scheduled()[0].Message.ApplicationProperties
	assert.True(t, strings.Contains(copyProps[retryotel.PropTraceparent].(string), first.SpanContext().SpanID().String()))
	assert.NotContains(t, copyProps, retryotel.PropTracestate, "the new span context has no tracestate")
	assert.Equal(t, "tenant=contoso", copyProps["baggage"], "baggage from the message reaches the handler's context and the copy")
}

// A message with malformed retry properties is dead-lettered without calling the handler; it still gets
// a process span with its dead-letter call as a child.
func TestInvalidEnvelopeStillTraced(t *testing.T) {
	called := false
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { called = true; return nil }, nil)
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("order-42"), ApplicationProperties: map[string]any{envelope.PropAttempt: "two"}})
	res := f.process()
	require.Equal(t, retry.OutcomeDeadLettered, res.Outcome)
	require.False(t, called)

	processes := f.ended("process orders")
	require.Len(t, processes, 1, "the span is renamed once OnProcessed says the entity")
	a := attrs(processes[0])
	assert.Equal(t, "RetryInvalidProperties", a["sbretry.dead_letter.reason"].AsString())
	assert.Equal(t, "orders", a["messaging.destination.name"].AsString())
	dl := f.ended("dead_letter orders")
	require.Len(t, dl, 1)
	assert.Equal(t, processes[0].SpanContext().SpanID(), dl[0].Parent().SpanID())
}

// A message that carries a SessionID (a session entity consumed with Options.AllowReorder) has it on
// its process span and its broker calls' spans, in sbretry.session_id; one without has none.
func TestSpansCarryTheMessagesSessionID(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return nil }, nil)
	_, err := f.broker.Send(&azservicebus.Message{MessageID: strPtr("m-1"), SessionID: strPtr("order-1"), Body: []byte("{}")})
	require.NoError(t, err)
	_, err = f.broker.Send(&azservicebus.Message{MessageID: strPtr("m-2"), Body: []byte("{}")})
	require.NoError(t, err)
	require.Equal(t, retry.OutcomeCompleted, f.process().Outcome)
	require.Equal(t, retry.OutcomeCompleted, f.process().Outcome)

	for _, name := range []string{"process orders", "complete orders"} {
		spans := f.ended(name)
		require.Len(t, spans, 2, name)
		assert.Equal(t, "order-1", attrs(spans[0])["sbretry.session_id"].AsString(), name)
		assert.NotContains(t, attrs(spans[1]), attribute.Key("sbretry.session_id"), name)
	}
}
