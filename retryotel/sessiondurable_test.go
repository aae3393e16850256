package retryotel_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/retryotel"
	"github.com/sbretry/retry/retrytest"
	"github.com/sbretry/retry/sessionstate"
)

// durableRun is what a session consumer with durable holds reported while one message failed once
// and succeeded at its wake-up.
type durableRun struct {
	spans map[string][]sdktrace.ReadOnlySpan
	byID  map[trace.SpanID]sdktrace.ReadOnlySpan
	rm    metricdata.ResourceMetrics
}

// runDurableHold runs a real SessionConsumer over retrytest's session queue "orders", through
// Instrumentation.SessionConnector and Hooks, with every retry held durably (a MaxHold of 1 ns): the
// message "flaky" of session "s1" fails its first attempt, is deferred with a wake-up scheduled a
// minute later, and succeeds when the wake-up brings it back.
func runDurableHold(t *testing.T) durableRun {
	t.Helper()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	inst, err := retryotel.New(&retryotel.Options{TracerProvider: tp, MeterProvider: mp})
	require.NoError(t, err)

	b := newBroker(t, nil, &retrytest.BrokerOptions{EntityPath: "orders", RequiresSession: true})
	sid := "s1"
	_, err = b.Send(&azservicebus.Message{MessageID: strPtr("flaky"), SessionID: &sid, Body: []byte("x")})
	require.NoError(t, err)
	var mu sync.Mutex
	tries := 0
	handler := func(context.Context, *azservicebus.ReceivedMessage) error {
		mu.Lock()
		defer mu.Unlock()
		if tries++; tries == 1 {
			return errUnavailable
		}
		return nil
	}
	var done sync.WaitGroup
	done.Add(1)
	next := retry.Hooks{OnProcessed: func(p retry.ProcessedParams) {
		if p.Result.Outcome == retry.OutcomeCompleted {
			done.Done()
		}
	}}
	sc, err := retry.NewSessionConsumer(inst.SessionConnector(withAddress(b.SessionConnector(), "sb.example.net:5671")), handler,
		&retry.Options{MaxAttempts: 3, Backoff: backoff.Constant{Interval: time.Minute}, Logger: discard(), Hooks: inst.Hooks(next)},
		&retry.SessionOptions{MaxHold: time.Nanosecond, DurableHolds: true, SessionIdleTimeout: time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	stopped := make(chan error, 1)
	go func() { stopped <- sc.Run(ctx) }()
	done.Wait()
	// The wake-up is completed once the record no longer needs it, after the message's own complete.
	require.NoError(t, b.WaitUntil(t.Context(), func() bool { return len(b.Completed()) == 2 }))
	cancel()
	require.NoError(t, <-stopped)
	require.NoError(t, tp.ForceFlush(context.Background()))

	run := durableRun{spans: map[string][]sdktrace.ReadOnlySpan{}, byID: map[trace.SpanID]sdktrace.ReadOnlySpan{}}
	for _, s := range spans.Ended() {
		run.spans[s.Name()] = append(run.spans[s.Name()], s)
		run.byID[s.SpanContext().SpanID()] = s
	}
	require.NoError(t, reader.Collect(context.Background(), &run.rm))
	require.NoError(t, tp.Shutdown(context.Background()))
	require.NoError(t, mp.Shutdown(context.Background()))
	return run
}

// A durable hold's deferral is a settle: its span and its messaging.client.operation.duration
// measurement carry messaging.operation.type=settle, and the span the disposition status defer, as
// the Service Bus conventions ask of every settlement operation.
func TestDeferSettleSpan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		run := runDurableHold(t)
		defers := run.spans["defer orders"]
		require.Len(t, defers, 1, "the hold's deferral: %v", keys(run.spans))
		s := defers[0]
		want{attrs: map[attribute.Key]string{
			"messaging.system": "servicebus", "messaging.operation.name": "defer", "messaging.operation.type": "settle",
			"messaging.servicebus.disposition_status": "defer", "messaging.destination.name": "orders",
			"messaging.message.id": "flaky", "sbretry.session_id": "s1", "server.address": "sb.example.net",
		}, absent: []attribute.Key{"error.type"}}.check(t, s.Name(), attrs(s))
		assert.Equal(t, "process orders", run.byID[s.Parent().SpanID()].Name(), "a child of the held attempt's process span")

		dur := find(t, run.rm, "messaging.client.operation.duration")
		assert.Equal(t, uint64(1), histogramCount(t, dur, attribute.String("messaging.operation.name", "defer"),
			attribute.String("messaging.operation.type", "settle")))
	})
}

// The message a durable hold deferred is received back by its sequence number when its wake-up comes:
// that call is a "receive_deferred" span (operation type receive, the batch's size, the message and its
// session) and a messaging.client.operation.duration measurement, and the message then has a process
// span of its own for the attempt it resumes.
func TestReceiveDeferredSpan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		run := runDurableHold(t)
		receives := run.spans["receive_deferred orders"]
		require.Len(t, receives, 1, "the held message received back at its wake-up: %v", keys(run.spans))
		s := receives[0]
		assert.Equal(t, trace.SpanKindClient, s.SpanKind())
		want{attrs: map[attribute.Key]string{
			"messaging.system": "servicebus", "messaging.operation.name": "receive_deferred", "messaging.operation.type": "receive",
			"messaging.batch.message_count": "1", "messaging.destination.name": "orders", "messaging.message.id": "flaky",
			"sbretry.session_id": "s1", "server.address": "sb.example.net", "server.port": "5671",
		}, absent: []attribute.Key{"error.type"}}.check(t, s.Name(), attrs(s))

		processes := run.spans["process orders"]
		require.Len(t, processes, 2, "the held attempt and the resumed one")
		assert.Equal(t, int64(1), attrs(processes[0])["sbretry.attempt"].AsInt64())
		assert.Equal(t, "deferred", attrs(processes[0])["sbretry.outcome"].AsString())
		assert.Equal(t, int64(2), attrs(processes[1])["sbretry.attempt"].AsInt64())
		assert.Equal(t, "completed", attrs(processes[1])["sbretry.outcome"].AsString())

		dur := find(t, run.rm, "messaging.client.operation.duration")
		assert.Equal(t, uint64(1), histogramCount(t, dur, attribute.String("messaging.operation.name", "receive_deferred"),
			attribute.String("messaging.operation.type", "receive")))
		consumed := find(t, run.rm, "messaging.client.consumed.messages")
		assert.Equal(t, int64(2), intValue(t, consumed, attribute.String("messaging.operation.name", "receive")),
			"each delivery counted once: the receive_deferred call does not count the resumed one again")
	})
}

// A durable hold seen through the hook calls a session consumer makes for it: the held attempt's
// OnStart, OnRetryCopy with the deferred message (so its deferral carries the attempt's trace context),
// OnSettle for the wake-up's schedule and for the defer, OnProcessed; later the wake-up's complete,
// reported by OnSettle with the wake-up as its message and no delivery; and the resumed attempt's own
// delivery. The wake-up's schedule is a child of the held attempt's process span, names the wake-up and
// counts in messaging.client.sent.messages; its complete is a settle span of its own, with no process
// span; the resumed attempt links to the held one; and every span started is ended.
func TestDurableHoldWakeUpHooks(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return nil }, nil)
	h := f.inst.Hooks(retry.Hooks{})
	sid, seq := "s1", int64(7)
	at := time.Date(2026, 11, 29, 12, 1, 0, 0, time.UTC)
	wakeID := "sbretry-wake-0123456789abcdef-7-2-1796040060000"
	held := &azservicebus.ReceivedMessage{MessageID: "flaky", SessionID: &sid, SequenceNumber: &seq, DeliveryCount: 1}
	env := envelope.Envelope{Attempt: 1, OriginalMessageID: "flaky", FirstSequenceNumber: seq}

	// The held attempt.
	ctx := h.OnStart(retry.StartParams{Context: context.Background(), Message: held, Envelope: env, EntityPath: "orders"})
	props := map[string]any{envelope.PropAttempt: int64(2), envelope.PropLastError: errUnavailable.Error(), sessionstate.PropHeldUntil: at}
	h.OnRetryCopy(retry.RetryCopyParams{Context: ctx, Message: held, Envelope: env,
		Copy: &azservicebus.Message{MessageID: &held.MessageID, ApplicationProperties: props}, Attempt: 2, ScheduledFor: at})
	h.OnSettle(retry.SettleParams{Context: ctx, Message: held, Envelope: env, EntityPath: "orders", Operation: retry.SettleSchedule,
		RetryMessageID: wakeID, Duration: time.Millisecond})
	h.OnSettle(retry.SettleParams{Context: ctx, Message: held, Envelope: env, EntityPath: "orders", Operation: retry.SettleDefer, Duration: time.Millisecond})
	h.OnProcessed(retry.ProcessedParams{Context: ctx, Message: held, Envelope: env, EntityPath: "orders",
		Result: retry.Result{Outcome: retry.OutcomeDeferred, Attempt: 1, HandlerErr: errUnavailable}})
	require.Contains(t, props, retryotel.PropTraceparent, "the deferral carries the held attempt's trace context")

	// The wake-up comes back; the held message is received back with the properties its deferral wrote,
	// resumed and completed; the wake-up is completed.
	resumed := &azservicebus.ReceivedMessage{MessageID: "flaky", SessionID: &sid, SequenceNumber: &seq, DeliveryCount: 2, ApplicationProperties: props}
	env2 := envelope.Envelope{Attempt: 2, OriginalMessageID: "flaky", FirstSequenceNumber: seq, LastError: errUnavailable.Error()}
	ctx2 := h.OnStart(retry.StartParams{Context: context.Background(), Message: resumed, Envelope: env2, EntityPath: "orders"})
	h.OnSettle(retry.SettleParams{Context: ctx2, Message: resumed, Envelope: env2, EntityPath: "orders", Operation: retry.SettleComplete, Duration: time.Millisecond})
	h.OnProcessed(retry.ProcessedParams{Context: ctx2, Message: resumed, Envelope: env2, EntityPath: "orders",
		Result: retry.Result{Outcome: retry.OutcomeCompleted, Attempt: 2}})
	wake := &azservicebus.ReceivedMessage{MessageID: wakeID, SessionID: &sid, ApplicationProperties: map[string]any{
		sessionstate.PropControl: sessionstate.ControlWake, sessionstate.PropWakeSequenceNumber: seq,
	}}
	h.OnSettle(retry.SettleParams{Context: context.Background(), Message: wake, EntityPath: "orders", Operation: retry.SettleComplete, Duration: time.Millisecond})

	assert.Len(t, f.spans.Started(), len(f.spans.Ended()), "every span started was ended")
	processes := f.ended("process orders")
	require.Len(t, processes, 2, "a process span per delivery of the held message, none for the wake-up")
	first, second := processes[0], processes[1]

	schedules := f.ended("schedule orders")
	require.Len(t, schedules, 1)
	s := schedules[0]
	assert.Equal(t, first.SpanContext().SpanID(), s.Parent().SpanID(), "the wake-up's schedule is a child of the held attempt")
	want{attrs: map[attribute.Key]string{
		"messaging.operation.name": "schedule", "messaging.operation.type": "send", "messaging.message.id": wakeID,
		"messaging.destination.name": "orders", "sbretry.attempt": "1", "sbretry.session_id": "s1",
	}}.check(t, s.Name(), attrs(s))
	assert.Empty(t, s.Links(), "the wake-up carries no trace context to link to")
	assert.Equal(t, int64(1), intValue(t, find(t, f.metrics(), "messaging.client.sent.messages"), attribute.String("messaging.operation.name", "schedule")))

	var wakeComplete sdktrace.ReadOnlySpan
	for _, c := range f.ended("complete orders") {
		if attrs(c)["messaging.message.id"].AsString() == wakeID {
			wakeComplete = c
		}
	}
	require.NotNil(t, wakeComplete, "the wake-up's complete is traced")
	assert.False(t, wakeComplete.Parent().IsValid(), "no process span around it")
	want{attrs: map[attribute.Key]string{
		"messaging.operation.type": "settle", "messaging.servicebus.disposition_status": "complete",
		"sbretry.session_id": "s1", "messaging.destination.name": "orders",
	}}.check(t, wakeComplete.Name(), attrs(wakeComplete))

	require.NotEmpty(t, second.Links())
	prev := second.Links()[0]
	assert.True(t, sameSpan(first.SpanContext(), prev.SpanContext), "the resumed attempt links to the held one")
	assert.Equal(t, retryotel.LinkPreviousAttempt, linkAttrs(prev)["sbretry.link"].AsString())
	assert.Equal(t, int64(1), linkAttrs(prev)["sbretry.attempt"].AsInt64())
}

// A durable hold end to end, once the session consumer reports its wake-ups to the hooks (issue 29,
// item 12: OnRetryCopy for the message it defers, OnSettle for the wake-up's schedule and complete):
// the wake-up's schedule is a child of the held attempt and counts in messaging.client.sent.messages,
// its complete is a span of its own, and the resumed attempt links to the held one. It skips while the
// consumer reports no wake-up schedule at all; TestDurableHoldWakeUpHooks checks the same through the
// hook calls themselves.
func TestDurableHoldWakeUpTraced(t *testing.T) {
	var run durableRun
	synctest.Test(t, func(t *testing.T) { run = runDurableHold(t) })
	// Skipped outside the bubble: a skip inside synctest.Test reports the test as passed.
	schedules := run.spans["schedule orders"]
	if len(schedules) == 0 {
		t.Skip("the session consumer does not report a durable hold's wake-up to OnSettle yet (issue 29, item 12)")
	}
	processes := run.spans["process orders"]
	require.Len(t, processes, 2, "the held attempt and the resumed one, none for the wake-up")
	held, resumed := processes[0], processes[1]
	require.Len(t, schedules, 1)
	assert.Equal(t, held.SpanContext().SpanID(), schedules[0].Parent().SpanID(), "the wake-up is scheduled by the held attempt")
	assert.Contains(t, attrs(schedules[0])["messaging.message.id"].AsString(), "sbretry-wake-")
	assert.Equal(t, int64(1), intValue(t, find(t, run.rm, "messaging.client.sent.messages"), attribute.String("messaging.operation.name", "schedule")))

	var wakeCompletes []sdktrace.ReadOnlySpan
	for _, c := range run.spans["complete orders"] {
		if strings.HasPrefix(attrs(c)["messaging.message.id"].AsString(), "sbretry-wake-") {
			wakeCompletes = append(wakeCompletes, c)
		}
	}
	require.Len(t, wakeCompletes, 1, "the wake-up's complete is traced")
	assert.False(t, wakeCompletes[0].Parent().IsValid(), "a span of its own")

	require.NotEmpty(t, resumed.Links(), "the deferral carried the held attempt's context")
	assert.True(t, sameSpan(held.SpanContext(), resumed.Links()[0].SpanContext), "the resumed attempt links to the held one")
	assert.Equal(t, retryotel.LinkPreviousAttempt, linkAttrs(resumed.Links()[0])["sbretry.link"].AsString())
}
