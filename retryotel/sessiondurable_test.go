package retryotel_test

import (
	"context"
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
	"github.com/sbretry/retry/retryotel"
	"github.com/sbretry/retry/retrytest"
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
		&retry.Options{MaxAttempts: 3, Backoff: retry.Constant{Interval: time.Minute}, Logger: discard(), Hooks: inst.Hooks(next)},
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
