package retryotel

import (
	"context"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbretry/retry/dlqmonitor"
	"github.com/sbretry/retry/internal/entitypath"
)

// opRuntimeProperties names the dead-letter monitor's reads. They are calls to the Service Bus
// administration API (HTTPS), not messaging operations: the conventions name no operation for them.
const opRuntimeProperties = "get_runtime_properties"

// AdminClient returns a [dlqmonitor.AdminClient] that reads through c and instruments each read for
// the dead-letter monitor: pass it to dlqmonitor.New in place of the admin client.
//
//   - Each GetQueueRuntimeProperties or GetSubscriptionRuntimeProperties becomes a CLIENT span
//     "get_runtime_properties {queue or topic}", a child of the poll's context, with messaging.system,
//     messaging.operation.name, the destination (and messaging.destination.subscription.name),
//     server.address, and error.type when the read failed (the response of an entity that does not
//     exist, which the SDK reports as no response and no error, counts as error "notfound", as the
//     monitor reports it). The read is an administration (HTTPS) call, not a messaging operation, so
//     it has no messaging.operation.type, no server.port (the option's port is the AMQP one) and no
//     messaging.client.operation.duration measurement.
//   - Each successful read sets the entity's sbretry.dead_letter.depth gauge
//     ([Instrumentation.RecordDeadLetterDepth]) to the DeadLetterMessageCount it returned, so the gauge
//     follows the monitor's polls without an OnPoll hook.
//
// Nothing of the response other than that count is read.
func (in *Instrumentation) AdminClient(c dlqmonitor.AdminClient) dlqmonitor.AdminClient {
	return &adminClient{next: c, in: in}
}

// adminClient is a [dlqmonitor.AdminClient] whose reads are traced.
type adminClient struct {
	next dlqmonitor.AdminClient
	in   *Instrumentation
}

var _ dlqmonitor.AdminClient = (*adminClient)(nil)

// GetQueueRuntimeProperties reads queueName's runtime properties through the wrapped client.
func (a *adminClient) GetQueueRuntimeProperties(ctx context.Context, queueName string, options *admin.GetQueueRuntimePropertiesOptions) (*admin.GetQueueRuntimePropertiesResponse, error) {
	ctx, end := a.in.startRead(ctx, queueName)
	resp, err := a.next.GetQueueRuntimeProperties(ctx, queueName, options)
	count := int64(-1)
	if resp != nil {
		count = int64(resp.DeadLetterMessageCount)
	}
	end(count, err)
	return resp, err
}

// GetSubscriptionRuntimeProperties reads a subscription's runtime properties through the wrapped client.
func (a *adminClient) GetSubscriptionRuntimeProperties(ctx context.Context, topicName string, subscriptionName string, options *admin.GetSubscriptionRuntimePropertiesOptions) (*admin.GetSubscriptionRuntimePropertiesResponse, error) {
	ctx, end := a.in.startRead(ctx, entitypath.Subscription(topicName, subscriptionName))
	resp, err := a.next.GetSubscriptionRuntimeProperties(ctx, topicName, subscriptionName, options)
	count := int64(-1)
	if resp != nil {
		count = int64(resp.DeadLetterMessageCount)
	}
	end(count, err)
	return resp, err
}

// startRead starts the span of one runtime-properties read of entity. The returned function ends it
// with the dead-letter count read (negative: no response) and the read's error.
func (in *Instrumentation) startRead(ctx context.Context, entity string) (context.Context, func(count int64, err error)) {
	if ctx == nil {
		ctx = context.Background()
	}
	dest := parseEntity(entity)
	attrs := []attribute.KeyValue{semconv.MessagingSystemServiceBus, semconv.MessagingOperationName(opRuntimeProperties)}
	attrs = append(attrs, dest.attrs()...)
	for _, kv := range in.metrics.serverAttrs() {
		if kv.Key == semconv.ServerAddressKey {
			attrs = append(attrs, kv)
		}
	}
	ctx, span := in.tracer.Start(ctx, dest.spanName(opRuntimeProperties),
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrs...),
	)
	return ctx, func(count int64, err error) {
		switch {
		case err != nil:
			span.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)))
			span.SetStatus(codes.Error, statusText(err))
		case count < 0:
			span.SetAttributes(semconv.ErrorTypeKey.String(string(azservicebus.CodeNotFound)))
			span.SetStatus(codes.Error, "entity not found")
		default:
			in.metrics.recordDeadLetterDepth(entity, count)
		}
		span.End()
	}
}
