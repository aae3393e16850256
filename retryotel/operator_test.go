package retryotel_test

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbretry/retry/dlqmonitor"
	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/dlqaction"
	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/retryotel"
)

// The operator tools' broker calls, against the emulator in the subscription layout (the topic
// "events" with its subscription "billing", and the retry queue "billing-retry"): a dead-letter poll,
// a status and a cancel of a pending retry, a redrive and a purge. Each dead-letter queue holds one
// message, so nothing is received on the way and abandoned: TestOperatorTelemetryOfAFailedRedrive has
// the abandon and the failures. Every span and metric carries the attributes the
// conventions require, per the table below.
func TestOperatorTelemetryTable(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	h := sbtest.NewSubscription(t)
	host, port, err := retryotel.ServerFromConnectionString(h.Em.ConnectionString())
	require.NoError(t, err)
	inst, err := retryotel.New(&retryotel.Options{TracerProvider: tp, MeterProvider: mp, ServerAddress: host, ServerPort: port})
	require.NoError(t, err)
	h.Seed(t, "pending-1", "perm-1", "max-1")
	ctx := sbtest.Context(t)

	// The monitor, before anything is redriven: one dead letter in each dead-letter queue.
	ac, err := admin.NewClientFromConnectionString(h.Em.ConnectionString(), h.Em.AdminClientOptions())
	require.NoError(t, err)
	mon, err := dlqmonitor.New(inst.AdminClient(ac), []string{sbtest.SubscriptionPath, sbtest.RetryQueue, "absent"}, nil)
	require.NoError(t, err)
	results := mon.Poll(ctx)
	require.NoError(t, results[0].Err)
	require.NoError(t, results[1].Err)
	require.ErrorIs(t, results[2].Err, dlqmonitor.ErrNotFound)

	in, err := inspect.New(h.Client, h.Entity, &inspect.Options{RetryQueue: h.RetryQueue, Observer: inst})
	require.NoError(t, err)
	st, err := in.Status(ctx, "pending-1")
	require.NoError(t, err)
	require.Len(t, st.Pending, 1)
	_, err = in.Cancel(ctx, st.Pending[0].Ref())
	require.NoError(t, err)

	// redrive selects one dead letter by its ref, as the CLI's --seq does.
	redrive := func(id, target string) error {
		t.Helper()
		st, err := in.Status(ctx, id)
		require.NoError(t, err)
		require.Len(t, st.DeadLetters, 1, id)
		sel, err := dlqaction.Select(ctx, in, inspect.DeadLetterFilter{Refs: []inspect.Ref{st.DeadLetters[0].Ref()}})
		require.NoError(t, err)
		require.Len(t, sel.Items, 1)
		_, err = dlqaction.Execute(ctx, h.Client, in, dlqaction.NewRedrivePlan(sel, target, 0), nil)
		return err
	}
	require.NoError(t, redrive("perm-1", sbtest.RetryQueue))
	st, err = in.Status(ctx, "max-1")
	require.NoError(t, err)
	require.Len(t, st.DeadLetters, 1)
	sel, err := dlqaction.Select(ctx, in, inspect.DeadLetterFilter{Refs: []inspect.Ref{st.DeadLetters[0].Ref()}})
	require.NoError(t, err)
	done, err := dlqaction.Execute(ctx, h.Client, in, dlqaction.NewPurgePlan(sel), nil)
	require.NoError(t, err)
	require.Equal(t, 1, done)
	require.NoError(t, tp.ForceFlush(ctx))

	server := map[attribute.Key]string{"server.address": "127.0.0.1", "server.port": strconv.Itoa(port)}
	base := merge(server, map[attribute.Key]string{"messaging.system": "servicebus"})
	onSub := merge(base, map[attribute.Key]string{"messaging.destination.name": "events", "messaging.destination.subscription.name": "billing"})
	onRetry := merge(base, map[attribute.Key]string{"messaging.destination.name": "billing-retry"})
	dlq := map[attribute.Key]string{"sbretry.sub_queue": "dead_letter"}
	op := func(name, typ string) map[attribute.Key]string {
		m := map[attribute.Key]string{"messaging.operation.name": name}
		if typ != "" {
			m["messaging.operation.type"] = typ
		}
		return m
	}
	batch := map[attribute.Key]string{"messaging.batch.message_count": anyValue}
	perMessage := map[attribute.Key]string{"messaging.message.id": anyValue}
	settled := func(status string) map[attribute.Key]string {
		return merge(perMessage, map[attribute.Key]string{"messaging.servicebus.disposition_status": status})
	}
	noSub := []attribute.Key{"messaging.destination.subscription.name"}
	// Chains are the consumer's: an operator's call belongs to none.
	notAChain := []attribute.Key{"sbretry.source.name", "sbretry.source.subscription.name", "error.type"}
	ok := func(more ...attribute.Key) []attribute.Key {
		return append(append([]attribute.Key(nil), notAChain...), more...)
	}
	admin := map[attribute.Key]string{"messaging.system": "servicebus", "server.address": "127.0.0.1", "messaging.operation.name": "get_runtime_properties"}
	notMessaging := []attribute.Key{"messaging.operation.type", "server.port"}

	// Rows are keyed by span name and sub-queue: a dead-letter queue's calls are named for its entity.
	spanTable := []struct {
		name, subQueue string
		want           want
	}{
		{"peek events", "", want{attrs: merge(onSub, op("peek", "receive"), batch), absent: ok("sbretry.sub_queue")}},
		{"peek events", "dead_letter", want{attrs: merge(onSub, dlq, op("peek", "receive"), batch), absent: ok()}},
		{"peek billing-retry", "", want{attrs: merge(onRetry, op("peek", "receive"), batch), absent: ok(noSub...)}},
		{"peek billing-retry", "dead_letter", want{attrs: merge(onRetry, dlq, op("peek", "receive"), batch), absent: ok(noSub...)}},
		{"cancel_scheduled billing-retry", "", want{attrs: merge(onRetry, op("cancel_scheduled", ""), perMessage),
			absent: ok("messaging.operation.type", "sbretry.sub_queue")}},
		{"receive events", "dead_letter", want{attrs: merge(onSub, dlq, op("receive", "receive"), batch), absent: ok()}},
		{"complete events", "dead_letter", want{attrs: merge(onSub, dlq, op("complete", "settle"), settled("complete")), absent: ok()}},
		{"send billing-retry", "", want{attrs: merge(onRetry, op("send", "send"), perMessage), absent: ok(noSub...)}},
		{"receive billing-retry", "dead_letter", want{attrs: merge(onRetry, dlq, op("receive", "receive"), batch), absent: ok(noSub...)}},
		{"complete billing-retry", "dead_letter", want{attrs: merge(onRetry, dlq, op("complete", "settle"), settled("complete")), absent: ok(noSub...)}},
		{"get_runtime_properties events", "", want{attrs: merge(admin, map[attribute.Key]string{
			"messaging.destination.name": "events", "messaging.destination.subscription.name": "billing"}), absent: append(notMessaging, "error.type")}},
		{"get_runtime_properties billing-retry", "", want{attrs: merge(admin, map[attribute.Key]string{
			"messaging.destination.name": "billing-retry"}), absent: append(notMessaging, "error.type")}},
		{"get_runtime_properties absent", "", want{attrs: merge(admin, map[attribute.Key]string{
			"messaging.destination.name": "absent", "error.type": "notfound"}), absent: notMessaging}},
	}
	byRow := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans.Ended() {
		k := s.Name() + "|" + attrs(s)["sbretry.sub_queue"].AsString()
		byRow[k] = append(byRow[k], s)
	}
	for _, row := range spanTable {
		k := row.name + "|" + row.subQueue
		got := byRow[k]
		if !assert.NotEmpty(t, got, "no span %q among %v", k, keys(byRow)) {
			continue
		}
		for _, s := range got {
			assert.Equal(t, trace.SpanKindClient, s.SpanKind(), k)
			row.want.check(t, k, attrs(s))
			_, failed := attrs(s)["error.type"]
			assert.Equal(t, failed, s.Status().Code == codes.Error, "%s: an error status exactly when error.type is set", k)
		}
	}
	assert.Len(t, spanTable, len(byRow), "every span is in the table: %v", keys(byRow))
	assert.Len(t, byRow["send billing-retry|"], 1)
	assert.Len(t, byRow["cancel_scheduled billing-retry|"], 1)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	anyDest := merge(base, map[attribute.Key]string{"messaging.destination.name": anyValue})
	metricTable := []struct {
		name string
		want want
	}{
		{"messaging.client.operation.duration", want{attrs: merge(anyDest, map[attribute.Key]string{"messaging.operation.name": anyValue}), absent: notAChain[:2]}},
		{"messaging.client.consumed.messages", want{attrs: merge(anyDest, map[attribute.Key]string{"messaging.operation.name": anyValue}),
			absent: ok("messaging.operation.type")}},
		{"messaging.client.sent.messages", want{attrs: merge(anyDest, op("send", "")), absent: ok("messaging.operation.type")}},
		{"sbretry.dead_letter.depth", want{attrs: map[attribute.Key]string{"server.address": "127.0.0.1", "messaging.destination.name": anyValue}}},
	}
	for _, row := range metricTable {
		m := find(t, rm, row.name)
		points := dataPoints(m)
		require.NotEmpty(t, points, row.name)
		for _, set := range points {
			row.want.check(t, row.name, setMap(set))
		}
	}
	ops := find(t, rm, "messaging.client.operation.duration")
	for _, o := range []struct{ name, typ string }{{"peek", "receive"}, {"receive", "receive"}, {"send", "send"}, {"complete", "settle"}} {
		assert.NotZero(t, histogramCount(t, ops, attribute.String("messaging.operation.name", o.name), attribute.String("messaging.operation.type", o.typ)), o.name)
	}
	assert.Equal(t, uint64(1), histogramCount(t, ops, attribute.String("messaging.operation.name", "cancel_scheduled")))
	assert.Zero(t, histogramCount(t, ops, attribute.String("messaging.operation.name", "get_runtime_properties")), "not a messaging operation")

	sent := find(t, rm, "messaging.client.sent.messages")
	retryQueue := attribute.String("messaging.destination.name", "billing-retry")
	assert.Equal(t, int64(1), intValue(t, sent, retryQueue))
	consumed := find(t, rm, "messaging.client.consumed.messages")
	receive := attribute.String("messaging.operation.name", "receive")
	deadLetter := attribute.String("sbretry.sub_queue", "dead_letter")
	assert.Equal(t, int64(1), intValue(t, consumed, receive, attribute.String("messaging.destination.subscription.name", "billing"), deadLetter), "perm-1, by the redrive")
	assert.Equal(t, int64(1), intValue(t, consumed, receive, retryQueue, deadLetter), "max-1, by the purge")
	assert.Positive(t, intValue(t, consumed, attribute.String("messaging.operation.name", "peek"), retryQueue))
	depth := find(t, rm, "sbretry.dead_letter.depth")
	assert.Equal(t, int64(1), intValue(t, depth, attribute.String("messaging.destination.subscription.name", "billing")), "as the poll read it")
	assert.Equal(t, int64(1), intValue(t, depth, retryQueue))

	require.NoError(t, tp.Shutdown(context.Background()))
	require.NoError(t, mp.Shutdown(context.Background()))
}

// A redrive that cannot send (its target does not exist) reports the failed send with error.type, on
// the span (with an error status) and on messaging.client.sent.messages and
// messaging.client.operation.duration, and the abandon of the dead letter it had received.
func TestOperatorTelemetryOfAFailedRedrive(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	h := sbtest.New(t)
	host, port, err := retryotel.ServerFromConnectionString(h.Em.ConnectionString())
	require.NoError(t, err)
	inst, err := retryotel.New(&retryotel.Options{TracerProvider: tp, MeterProvider: mp, ServerAddress: host, ServerPort: port})
	require.NoError(t, err)
	h.Seed(t, "perm-1")
	ctx := sbtest.Context(t)
	in, err := inspect.New(h.Client, h.Entity, &inspect.Options{Observer: inst})
	require.NoError(t, err)
	sel, err := dlqaction.Select(ctx, in, inspect.DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, sel.Items, 1)
	plan := dlqaction.NewRedrivePlan(sel, "missing-queue", 0)
	_, err = dlqaction.Execute(ctx, h.Client, in, plan, nil)
	var sbErr *azservicebus.Error
	require.ErrorAs(t, err, &sbErr)
	require.Equal(t, azservicebus.CodeNotFound, sbErr.Code)
	require.NoError(t, tp.ForceFlush(ctx))

	base := map[attribute.Key]string{"messaging.system": "servicebus", "server.address": "127.0.0.1", "server.port": strconv.Itoa(port)}
	onDLQ := merge(base, map[attribute.Key]string{"messaging.destination.name": "orders", "sbretry.sub_queue": "dead_letter"})
	spanTable := []struct {
		name string
		want want
	}{
		{"peek orders", want{attrs: merge(onDLQ, map[attribute.Key]string{"messaging.operation.name": "peek", "messaging.operation.type": "receive",
			"messaging.batch.message_count": anyValue}), absent: []attribute.Key{"error.type"}}},
		{"receive orders", want{attrs: merge(onDLQ, map[attribute.Key]string{"messaging.operation.name": "receive", "messaging.operation.type": "receive",
			"messaging.batch.message_count": "1"}), absent: []attribute.Key{"error.type"}}},
		{"send missing-queue", want{attrs: merge(base, map[attribute.Key]string{"messaging.operation.name": "send", "messaging.operation.type": "send",
			"messaging.destination.name": "missing-queue", "messaging.message.id": plan.Items[0].ResubmitID, "error.type": "notfound"}),
			absent: []attribute.Key{"sbretry.sub_queue"}}},
		{"abandon orders", want{attrs: merge(onDLQ, map[attribute.Key]string{"messaging.operation.name": "abandon", "messaging.operation.type": "settle",
			"messaging.servicebus.disposition_status": "abandon", "messaging.message.id": sel.Items[0].MessageID}), absent: []attribute.Key{"error.type"}}},
	}
	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans.Ended() {
		byName[s.Name()] = append(byName[s.Name()], s)
	}
	assert.Len(t, byName, len(spanTable), "every span is in the table: %v", keys(byName))
	for _, row := range spanTable {
		got := byName[row.name]
		if !assert.NotEmpty(t, got, "no span %q among %v", row.name, keys(byName)) {
			continue
		}
		for _, s := range got {
			assert.Equal(t, trace.SpanKindClient, s.SpanKind(), row.name)
			row.want.check(t, row.name, attrs(s))
		}
	}
	send := byName["send missing-queue"][0]
	assert.Equal(t, codes.Error, send.Status().Code)
	assert.Contains(t, send.Status().Description, "missing-queue")

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	failed := attribute.String("error.type", "notfound")
	target := attribute.String("messaging.destination.name", "missing-queue")
	assert.Equal(t, int64(1), intValue(t, find(t, rm, "messaging.client.sent.messages"), target, failed, attribute.String("messaging.operation.name", "send")),
		"the attempt counts, with its error.type")
	assert.Equal(t, uint64(1), histogramCount(t, find(t, rm, "messaging.client.operation.duration"), target, failed, attribute.String("messaging.operation.type", "send")))
	require.NoError(t, tp.Shutdown(context.Background()))
	require.NoError(t, mp.Shutdown(context.Background()))
}

// A redrive's send links to the creation context its message carries (the dead letter's traceparent,
// which the resubmission keeps) and runs as a child of the call's context; the observer's context is
// the span's, so the SDK call is made inside it.
func TestStartCallSendLinksToTheMessage(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	inst, err := retryotel.New(&retryotel.Options{TracerProvider: tp, MeterProvider: sdkmetric.NewMeterProvider()})
	require.NoError(t, err)
	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	producer := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent}))
	require.True(t, producer.IsValid())
	parent, root := tp.Tracer("test").Start(context.Background(), "sbretry dlq redrive")

	msg := &azservicebus.Message{MessageID: strPtr("sbretry-resubmit-1"), ApplicationProperties: map[string]any{"traceparent": traceparent}}
	ctx, done := inst.StartCall(parent, inspect.Call{Operation: inspect.OpSend, Entity: "orders", MessageID: "sbretry-resubmit-1", Properties: msg.ApplicationProperties})
	callSpan := trace.SpanContextFromContext(ctx)
	done(inspect.CallResult{Err: &azservicebus.Error{Code: azservicebus.CodeUnauthorizedAccess}})
	root.End()

	var send sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		if s.Name() == "send orders" {
			send = s
		}
	}
	require.NotNil(t, send)
	assert.True(t, sameSpan(callSpan, send.SpanContext()), "the call runs in the span's context")
	assert.True(t, sameSpan(root.SpanContext(), send.Parent()))
	require.Len(t, send.Links(), 1)
	assert.True(t, sameSpan(producer, send.Links()[0].SpanContext))
	assert.Equal(t, "creation", linkAttrs(send.Links()[0])["sbretry.link"].AsString())
	assert.Equal(t, "unauthorized", attrs(send)["error.type"].AsString())
	assert.Equal(t, codes.Error, send.Status().Code)
	assert.Equal(t, traceparent, msg.ApplicationProperties["traceparent"], "the message is not changed")
	assert.Len(t, msg.ApplicationProperties, 1)
}

// A failed administration read is an error span and leaves the gauge alone; its error text is
// redacted.
func TestAdminClientFailedRead(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	inst, err := retryotel.New(&retryotel.Options{TracerProvider: tp, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	require.NoError(t, err)
	boom := errors.New("GET https://ns.servicebus.windows.net/orders?sig=SharedAccessSignature sr=x&sig=c2VjcmV0&se=1&skn=k: 503")
	c := inst.AdminClient(failingAdmin{err: boom})
	_, err = c.GetQueueRuntimeProperties(context.Background(), "orders", nil)
	require.ErrorIs(t, err, boom)
	_, err = c.GetSubscriptionRuntimeProperties(context.Background(), "events", "billing", nil)
	require.ErrorIs(t, err, boom)

	ended := spans.Ended()
	require.Len(t, ended, 2)
	assert.Equal(t, "get_runtime_properties orders", ended[0].Name())
	assert.Equal(t, "get_runtime_properties events", ended[1].Name())
	assert.Equal(t, "billing", attrs(ended[1])["messaging.destination.subscription.name"].AsString())
	for _, s := range ended {
		assert.Equal(t, codes.Error, s.Status().Code)
		assert.NotContains(t, s.Status().Description, "c2VjcmV0", "the signature is redacted")
		assert.Equal(t, "*errors.errorString", attrs(s)["error.type"].AsString())
	}
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			assert.NotEqual(t, retryotel.MetricDeadLetterDepth, m.Name, "no depth from a failed read")
		}
	}
}

type failingAdmin struct{ err error }

func (f failingAdmin) GetQueueRuntimeProperties(context.Context, string, *admin.GetQueueRuntimePropertiesOptions) (*admin.GetQueueRuntimePropertiesResponse, error) {
	return nil, f.err
}

func (f failingAdmin) GetSubscriptionRuntimeProperties(context.Context, string, string, *admin.GetSubscriptionRuntimePropertiesOptions) (*admin.GetSubscriptionRuntimePropertiesResponse, error) {
	return nil, f.err
}
