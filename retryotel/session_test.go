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
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/retryotel"
	"github.com/sbretry/retry/retrytest"
)

// withAddress is connect with every connection's Address set to addr, as the built-in session
// connectors set it (retrytest's leaves it empty).
func withAddress(connect retry.SessionConnector, addr string) retry.SessionConnector {
	return func(ctx context.Context) (*retry.SessionConnection, error) {
		c, err := connect(ctx)
		if c != nil {
			c.Address = addr
		}
		return c, err
	}
}

// A real SessionConsumer over retrytest's session queue, through Instrumentation.SessionConnector and
// Hooks: every message gets a process span with its session id and the server learned from the
// connection, its complete or dead-letter call a child span, the session lock renewals during a hold
// are children of the held message's process span, and the metrics carry the server.
func TestSessionConsumerTelemetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spans := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		inst, err := retryotel.New(&retryotel.Options{TracerProvider: tp, MeterProvider: mp})
		require.NoError(t, err)

		b := newBroker(t, nil, &retrytest.BrokerOptions{EntityPath: "orders", RequiresSession: true, LockDuration: 10 * time.Second})
		sessionOf := map[string]string{"flaky": "order-1", "ok": "order-1", "poison": "order-2"}
		for _, body := range []string{"flaky", "ok", "poison"} {
			sid := sessionOf[body]
			_, err := b.Send(&azservicebus.Message{MessageID: strPtr(body), SessionID: &sid, Body: []byte(body)})
			require.NoError(t, err)
		}
		var mu sync.Mutex
		tries := map[string]int{}
		handler := func(ctx context.Context, msg *azservicebus.ReceivedMessage) error {
			mu.Lock()
			defer mu.Unlock()
			tries[string(msg.Body)]++
			if string(msg.Body) == "poison" || (string(msg.Body) == "flaky" && tries["flaky"] == 1) {
				return errUnavailable
			}
			return nil
		}
		// The holds wait 8 s, past the 5 s renewal interval of a 10 s session lock: each is renewed
		// while a message is held.
		sc, err := retry.NewSessionConsumer(inst.SessionConnector(withAddress(b.SessionConnector(), "sb.example.net:5671")), handler,
			&retry.Options{MaxAttempts: 2, Backoff: backoff.Constant{Interval: 8 * time.Second}, LockDuration: 10 * time.Second,
				Logger: discard(), Hooks: inst.Hooks(retry.Hooks{})},
			&retry.SessionOptions{SessionIdleTimeout: time.Second})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- sc.Run(ctx) }()
		require.NoError(t, b.WaitUntil(t.Context(), func() bool { return len(b.Completed()) == 2 && len(b.DeadLettered()) == 1 }))
		cancel()
		require.NoError(t, <-done)
		require.NoError(t, tp.ForceFlush(context.Background()))

		base := map[attribute.Key]string{
			"messaging.system": "servicebus", "messaging.destination.name": "orders",
			"server.address": "sb.example.net", "server.port": "5671", "sbretry.source.name": "orders",
		}
		byName := map[string][]sdktrace.ReadOnlySpan{}
		byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
		for _, s := range spans.Ended() {
			byName[s.Name()] = append(byName[s.Name()], s)
			byID[s.SpanContext().SpanID()] = s
		}
		// The span of a message carries its own session id.
		session := func(s sdktrace.ReadOnlySpan) map[attribute.Key]string {
			id := attrs(s)["messaging.message.id"].AsString()
			return map[attribute.Key]string{"sbretry.session_id": sessionOf[id]}
		}
		require.Len(t, byName["process orders"], 3, "one process span per message, across its attempts: %v", keys(byName))
		for _, s := range byName["process orders"] {
			assert.Equal(t, trace.SpanKindConsumer, s.SpanKind())
			want{attrs: merge(base, session(s), map[attribute.Key]string{"messaging.operation.type": "process", "messaging.operation.name": "process"})}.check(t, s.Name(), attrs(s))
		}
		require.Len(t, byName["complete orders"], 2)
		require.Len(t, byName["dead_letter orders"], 1)
		for _, s := range append(byName["complete orders"], byName["dead_letter orders"]...) {
			want{attrs: merge(base, session(s), map[attribute.Key]string{"messaging.operation.type": "settle"})}.check(t, s.Name(), attrs(s))
			assert.Equal(t, "process orders", byID[s.Parent().SpanID()].Name(), "%s is a child of its process span", s.Name())
		}
		renewals := byName["renew_session_lock orders"]
		require.NotEmpty(t, renewals, "session lock renewals are traced: %v", keys(byName))
		held := map[string]bool{}
		for _, s := range renewals {
			assert.Equal(t, trace.SpanKindClient, s.SpanKind())
			want{attrs: merge(base, map[attribute.Key]string{"messaging.operation.name": "renew_session_lock", "sbretry.session_id": anyValue}),
				absent: []attribute.Key{"messaging.operation.type", "error.type"}}.check(t, s.Name(), attrs(s))
			if parent, ok := byID[s.Parent().SpanID()]; ok {
				assert.Equal(t, "process orders", parent.Name())
				assert.Equal(t, attrs(parent)["sbretry.session_id"], attrs(s)["sbretry.session_id"], "a renewal's parent is a message of its session")
				held[attrs(parent)["messaging.message.id"].AsString()] = true
			}
		}
		assert.True(t, held["flaky"] && held["poison"], "both holds were renewed under their message's span: %v", held)

		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(context.Background(), &rm))
		for _, name := range []string{"messaging.process.duration", "messaging.client.consumed.messages", "messaging.client.operation.duration", "sbretry.handler.duration", "sbretry.dead_lettered"} {
			points := dataPoints(find(t, rm, name))
			require.NotEmpty(t, points, name)
			for _, set := range points {
				want{attrs: base, absent: []attribute.Key{"sbretry.session_id"}}.check(t, name, setMap(set))
			}
		}
		assert.Equal(t, int64(3), intValue(t, find(t, rm, "messaging.client.consumed.messages"), attribute.String("messaging.destination.name", "orders")))
		assert.NotZero(t, histogramCount(t, find(t, rm, "messaging.client.operation.duration"), attribute.String("messaging.operation.name", "renew_session_lock")))
		state := find(t, rm, "sbretry.consumer.state")
		assert.Equal(t, int64(1), intValue(t, state, attribute.String("sbretry.consumer.state", "stopped")))

		require.NoError(t, tp.Shutdown(context.Background()))
		require.NoError(t, mp.Shutdown(context.Background()))
	})
}

// A session lock renewal the consumer cancels itself (the session released when idle, a shutdown) is
// not an error either: an unset status and no error.type.
func TestSessionRenewalCancelledByTheConsumerIsNotAnError(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	inst, err := retryotel.New(&retryotel.Options{TracerProvider: tp})
	require.NoError(t, err)
	b := newBroker(t, nil, &retrytest.BrokerOptions{EntityPath: "orders", RequiresSession: true})
	sid := "order-1"
	_, err = b.Send(&azservicebus.Message{MessageID: strPtr("m-1"), SessionID: &sid, Body: []byte("x")})
	require.NoError(t, err)
	conn, err := inst.SessionConnector(b.SessionConnector())(t.Context())
	require.NoError(t, err)
	defer func() { assert.NoError(t, conn.Close(context.Background())) }()
	r, err := conn.AcceptNext(t.Context())
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.ErrorIs(t, r.RenewSessionLock(ctx, nil), context.Canceled, "the caller still sees the error")
	require.NoError(t, r.RenewSessionLock(t.Context(), nil))

	ended := spans.Ended()
	require.Len(t, ended, 2)
	for _, s := range ended {
		assert.Equal(t, "renew_session_lock orders", s.Name())
		assert.Equal(t, codes.Unset, s.Status().Code)
		assert.NotContains(t, attrs(s), attribute.Key("error.type"))
	}
	require.NoError(t, tp.Shutdown(context.Background()))
}
