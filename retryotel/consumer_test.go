package retryotel_test

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/retryotel"
	"github.com/sbretry/retry/retrytest"
)

// A real Consumer, on the real clock inside a synctest bubble: every attempt of a poison message is
// linked to the one before it, and the state metric follows the consumer from connecting to stopped.
func TestConsumerChainAndState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spans := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		inst, err := retryotel.New(&retryotel.Options{TracerProvider: tp, MeterProvider: mp})
		require.NoError(t, err)

		b := newBroker(t, nil, &retrytest.BrokerOptions{DuplicateDetection: true})
		b.Send(&azservicebus.Message{MessageID: strPtr("poison"), Body: []byte("x")})
		c, err := retry.NewConsumer(b.Connector(), func(context.Context, *azservicebus.ReceivedMessage) error { return errUnavailable },
			&retry.Options{MaxAttempts: 3, EntityPath: "orders", Logger: discard(), Hooks: inst.Hooks(retry.Hooks{})})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		require.NoError(t, b.WaitUntil(t.Context(), func() bool { return len(b.DeadLettered()) == 1 }))
		cancel()
		require.NoError(t, <-done)

		var processes []sdktrace.ReadOnlySpan
		for _, s := range spans.Ended() {
			if s.Name() == "process orders" {
				processes = append(processes, s)
			}
		}
		require.Len(t, processes, 3)
		for i, s := range processes {
			a := attrs(s)
			assert.Equal(t, int64(i+1), a["sbretry.attempt"].AsInt64())
			assert.Equal(t, attrs(processes[0])["sbretry.chain_id"], a["sbretry.chain_id"])
			if i > 0 {
				require.NotEmpty(t, s.Links())
				assert.True(t, sameSpan(processes[i-1].SpanContext(), s.Links()[0].SpanContext), "attempt %d links to attempt %d", i+1, i)
			}
		}
		assert.Equal(t, "dead-lettered", attrs(processes[2])["sbretry.outcome"].AsString())

		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(context.Background(), &rm))
		state := find(t, rm, "sbretry.consumer.state")
		assert.Equal(t, int64(1), intValue(t, state, attribute.String("sbretry.consumer.state", "stopped")))
		assert.Equal(t, int64(0), intValue(t, state, attribute.String("sbretry.consumer.state", "running")))
		assert.Equal(t, int64(0), intValue(t, state, attribute.String("sbretry.consumer.state", "connecting")))

		require.NoError(t, tp.Shutdown(context.Background()))
		require.NoError(t, mp.Shutdown(context.Background()))
	})
}
