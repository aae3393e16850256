package retryotel_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/retryotel"
	"github.com/sbretry/retry/retrytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, sbtest.IgnoreSDKLeak()) }

// newBroker is retrytest.New for a test's fixed options: an error fails the test.
func newBroker(t testing.TB, clk retry.Clock, opts *retrytest.BrokerOptions) *retrytest.Broker {
	t.Helper()
	b, err := retrytest.New(clk, opts)
	require.NoError(t, err)
	return b
}

// fixture drives a real retry.Processor over the in-memory broker on a mock clock, with the
// instrumentation's hooks installed and the SDK's in-memory span recorder and manual metric reader
// behind them.
type fixture struct {
	t      *testing.T
	clock  *clock.Mock
	broker *retrytest.Broker
	recv   retry.Receiver
	proc   *retry.Processor
	tp     *sdktrace.TracerProvider
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	inst   *retryotel.Instrumentation
}

type fixtureOptions struct {
	retry retry.Options
	otel  retryotel.Options
	next  retry.Hooks
}

func newFixture(t *testing.T, handler retry.Handler, fo *fixtureOptions) *fixture {
	t.Helper()
	if fo == nil {
		fo = &fixtureOptions{}
	}
	f := &fixture{t: t, clock: clock.NewMock(), spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	f.clock.Set(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	f.broker = newBroker(t, f.clock, &retrytest.BrokerOptions{DuplicateDetection: true})
	f.recv = f.broker.Receiver()
	f.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(f.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(f.reader))
	t.Cleanup(func() {
		assert.NoError(t, f.tp.Shutdown(context.Background()))
		assert.NoError(t, mp.Shutdown(context.Background()))
	})
	oo := fo.otel
	oo.TracerProvider, oo.MeterProvider = f.tp, mp
	inst, err := retryotel.New(&oo)
	require.NoError(t, err)
	f.inst = inst
	ro := fo.retry
	ro.Clock = f.clock
	if ro.EntityPath == "" {
		ro.EntityPath = "orders"
	}
	ro.Logger = discard()
	ro.Hooks = inst.Hooks(fo.next)
	f.proc, err = retry.NewProcessor(f.broker.Sender(), handler, &ro)
	require.NoError(t, err)
	return f
}

// process receives the next message, which must be available now, and processes it.
func (f *fixture) process() retry.Result {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msgs, err := f.recv.ReceiveMessages(ctx, 1, nil)
	require.NoError(f.t, err)
	require.Len(f.t, msgs, 1)
	return f.proc.Process(context.Background(), f.recv, msgs[0])
}

// ended returns the ended spans called name, in the order they ended.
func (f *fixture) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range f.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// producerContext starts and ends a producer span and returns its context written into application
// properties, as a traced producer would send it.
func (f *fixture) producerContext() (trace.SpanContext, map[string]any) {
	ctx, span := f.tp.Tracer("producer").Start(context.Background(), "send orders", trace.WithSpanKind(trace.SpanKindProducer))
	span.End()
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	props := map[string]any{}
	for k, v := range carrier {
		props[k] = v
	}
	return span.SpanContext(), props
}

func (f *fixture) metrics() metricdata.ResourceMetrics {
	f.t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(f.t, f.reader.Collect(context.Background(), &rm))
	return rm
}

// attrs returns a span's attributes by key.
func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// sameSpan reports whether a and b name the same span (a link's context is remote, the span's is not).
func sameSpan(a, b trace.SpanContext) bool {
	return a.TraceID() == b.TraceID() && a.SpanID() == b.SpanID()
}

func strPtr(s string) *string { return &s }

var errUnavailable = errors.New("payment service unavailable")

// failOnce fails the first call and succeeds after, remembering the span context each call ran in.
type failOnce struct {
	calls int
	seen  []trace.SpanContext
}

func (h *failOnce) handle(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
	h.calls++
	h.seen = append(h.seen, trace.SpanContextFromContext(ctx))
	if h.calls == 1 {
		return errUnavailable
	}
	return nil
}

func TestHooksComposeWithTheUsersOwn(t *testing.T) {
	type ctxKey struct{}
	var calls []string
	var processedSpanRecording bool
	var handlerValue any
	next := retry.Hooks{
		OnStart: func(p retry.StartParams) context.Context {
			calls = append(calls, "start")
			assert.True(t, trace.SpanFromContext(p.Context).SpanContext().IsValid(), "the user's OnStart sees the process span")
			return context.WithValue(p.Context, ctxKey{}, "mine")
		},
		OnRetryCopy: func(p retry.RetryCopyParams) {
			calls = append(calls, "retry-copy")
			assert.Contains(t, p.Copy.ApplicationProperties, retryotel.PropTraceparent, "the context is written before the user's hook")
		},
		OnSettle: func(p retry.SettleParams) { calls = append(calls, "settle:"+p.Operation) },
		OnProcessed: func(p retry.ProcessedParams) {
			calls = append(calls, "processed")
			processedSpanRecording = trace.SpanFromContext(p.Context).IsRecording()
		},
		OnStateChange: func(retry.StateChangeParams) { calls = append(calls, "state") },
	}
	f := newFixture(t, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
		handlerValue = ctx.Value(ctxKey{})
		return errUnavailable
	}, &fixtureOptions{next: next})
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("order-42"), Body: []byte("{}")})
	res := f.process()
	require.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
	f.inst.Hooks(next).OnStateChange(retry.StateChangeParams{From: retry.StateIdle, To: retry.StateConnecting})

	assert.Equal(t, []string{"start", "retry-copy", "settle:schedule", "settle:complete", "processed", "state"}, calls)
	assert.Equal(t, "mine", handlerValue, "the context the user's OnStart returned reaches the handler")
	assert.True(t, processedSpanRecording, "the span ends after the user's OnProcessed, which may still annotate it")
	require.Len(t, f.ended("process orders"), 1)
}

func TestNewWithDefaultsUsesTheGlobals(t *testing.T) {
	inst, err := retryotel.New(nil)
	require.NoError(t, err)
	mock := clock.NewMock()
	broker := newBroker(t, mock, nil)
	recv := broker.Receiver()
	proc, err := retry.NewProcessor(broker.Sender(), func(context.Context, *azservicebus.ReceivedMessage) error { return errUnavailable },
		&retry.Options{EntityPath: "orders", Clock: mock, Logger: discard(), Hooks: inst.Hooks(retry.Hooks{})})
	require.NoError(t, err)
	broker.Send(&azservicebus.Message{MessageID: strPtr("order-1")})
	msgs, err := recv.ReceiveMessages(context.Background(), 1, nil)
	require.NoError(t, err)
	res := proc.Process(context.Background(), recv, msgs[0])
	assert.Equal(t, retry.OutcomeRetryScheduled, res.Outcome, "the no-op global providers change nothing")
	copyProps := broker.Scheduled()[0].Message.ApplicationProperties
	assert.NotContains(t, copyProps, retryotel.PropTraceparent, "no valid span context, nothing injected")
	inst.RecordDeadLetterDepth("orders", 1)
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
