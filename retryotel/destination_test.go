package retryotel_test

import (
	"context"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
)

// A queue's retry copy goes back to the queue: the schedule span names it, links to the creation
// context written into the copy (its parent process span's), and the copy counts as a sent message.
func TestScheduleOnAQueue(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errUnavailable }, nil)
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("order-1")})
	require.Equal(t, retry.OutcomeRetryScheduled, f.process().Outcome)

	schedules := f.ended("schedule orders")
	require.Len(t, schedules, 1)
	s := schedules[0]
	a := attrs(s)
	assert.Equal(t, "orders", a["messaging.destination.name"].AsString())
	require.Len(t, s.Links(), 1, "the schedule span links to the injected creation context")
	assert.True(t, sameSpan(s.Parent(), s.Links()[0].SpanContext))
	assert.Equal(t, a["messaging.message.id"], linkAttrs(s.Links()[0])["messaging.message.id"])

	sched := f.broker.Scheduled()
	require.Len(t, sched, 1)
	assert.Contains(t, sched[0].Message.ApplicationProperties["traceparent"], s.Parent().SpanID().String(), "what is linked is what the copy carries")

	sent := find(t, f.metrics(), "messaging.client.sent.messages")
	assert.Equal(t, int64(1), intValue(t, sent,
		attribute.String("messaging.operation.name", "schedule"), attribute.String("messaging.destination.name", "orders"),
		attribute.String("messaging.system", "servicebus"), attribute.String("sbretry.source.name", "orders")))
}

// Without Instrumentation.Connector a subscription's retry queue is unknown: the schedule is not
// attributed to the topic (where the copy never goes) but carries no destination, and still the
// subscription it belongs to.
func TestScheduleOnASubscriptionWithoutConnector(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errUnavailable },
		&fixtureOptions{retry: retry.Options{EntityPath: "events/Subscriptions/billing"}})
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("evt-1")})
	require.Equal(t, retry.OutcomeRetryScheduled, f.process().Outcome)

	assert.Empty(t, f.ended("schedule events"))
	schedules := f.ended("schedule")
	require.Len(t, schedules, 1)
	a := attrs(schedules[0])
	_, named := a["messaging.destination.name"]
	assert.False(t, named)
	assert.Equal(t, "events", a["sbretry.source.name"].AsString())
	assert.Equal(t, "billing", a["sbretry.source.subscription.name"].AsString())
}

// A later attempt received from a retry queue keeps the subscription its chain started on.
func TestRetryQueueAttemptKeepsItsSubscription(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return nil },
		&fixtureOptions{retry: retry.Options{EntityPath: "billing-retry"}})
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("sbretry-copy-2"), ApplicationProperties: map[string]any{
		envelope.PropAttempt: int64(2), envelope.PropSource: "events/Subscriptions/billing", envelope.PropFirstSequenceNumber: int64(7),
		envelope.PropOriginalMessageID: "evt-1", envelope.PropCorrelationID: "evt-1", envelope.PropKey: "evt-1",
	}})
	require.Equal(t, retry.OutcomeCompleted, f.process().Outcome)

	processes := f.ended("process billing-retry")
	require.Len(t, processes, 1)
	a := attrs(processes[0])
	assert.Equal(t, "billing-retry", a["messaging.destination.name"].AsString())
	_, sub := a["messaging.destination.subscription.name"]
	assert.False(t, sub, "not received from a subscription")
	assert.Equal(t, "events", a["sbretry.source.name"].AsString())
	assert.Equal(t, "billing", a["sbretry.source.subscription.name"].AsString())
	consumed := find(t, f.metrics(), "messaging.client.consumed.messages")
	assert.Equal(t, int64(1), intValue(t, consumed, attribute.String("sbretry.source.subscription.name", "billing"),
		attribute.String("messaging.destination.name", "billing-retry")))
}
