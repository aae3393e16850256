package retryotel_test

import (
	"context"
	"errors"
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

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/outage"
	"github.com/sbretry/retry/retryotel"
	"github.com/sbretry/retry/retrytest"
)

// Outage mode and retry policies in the telemetry: held and discarded messages are counted, the
// breaker's changes are counted by their states, and a process span names the rule that took its
// failure.
func TestOutageAndPolicyTelemetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spans := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		inst, err := retryotel.New(&retryotel.Options{TracerProvider: tp, MeterProvider: mp})
		require.NoError(t, err)

		errGone := errors.New("customer deleted")
		b := newBroker(t, nil, &retrytest.BrokerOptions{DuplicateDetection: true})
		b.Send(&azservicebus.Message{MessageID: strPtr("gone"), Body: []byte("x")})
		c, err := retry.NewConsumer(b.Connector(), func(_ context.Context, m *azservicebus.ReceivedMessage) error {
			if m.MessageID == "gone" {
				return errGone
			}
			return errUnavailable
		}, &retry.Options{EntityPath: "orders", Logger: discard(), Hooks: inst.Hooks(retry.Hooks{}),
			Policies: []retry.Rule{{Name: "gone", Match: retry.ErrorIs(errGone), Policy: retry.Policy{Action: retry.ActionDiscard}}},
			Outage:   &outage.Options{ConsecutiveFailures: 1, OpenFor: time.Minute}})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		synctest.Wait() // discarded, and waiting for the next message
		require.Equal(t, uint64(1), c.Health().Discarded)
		b.Send(&azservicebus.Message{MessageID: strPtr("down"), Body: []byte("x")})
		synctest.Wait() // tripped, held, and waiting a minute for the probe
		require.Equal(t, uint64(1), c.Health().Held)
		c.Resume()
		cancel()
		require.NoError(t, <-done)

		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(t.Context(), &rm))
		orders := attribute.String("messaging.destination.name", "orders")
		assert.Equal(t, int64(1), intValue(t, find(t, rm, retryotel.MetricDiscarded), orders, attribute.String("sbretry.policy", "gone")))
		assert.Equal(t, int64(1), intValue(t, find(t, rm, retryotel.MetricHeld), orders))
		changes := find(t, rm, retryotel.MetricOutageChanges)
		assert.Equal(t, int64(1), intValue(t, changes, orders, attribute.String("sbretry.outage.from", "closed"), attribute.String("sbretry.outage.to", "open"), attribute.Bool("sbretry.outage.manual", false)), "the trip, on the consumer's entity")
		assert.Equal(t, int64(1), intValue(t, changes, attribute.String("sbretry.outage.from", "open"), attribute.String("sbretry.outage.to", "closed"), attribute.Bool("sbretry.outage.manual", true)), "the resume")

		var sawPolicy, sawHeld bool
		for _, s := range spans.Ended() {
			a := attrs(s)
			if a["sbretry.policy"].AsString() == "gone" {
				sawPolicy = true
				assert.Equal(t, "discarded", a["sbretry.outcome"].AsString())
			}
			if a["sbretry.outcome"].AsString() == "held" {
				sawHeld = true
				assert.NotEmpty(t, a["sbretry.retry.scheduled_for"].AsString(), "when it comes back")
			}
		}
		assert.True(t, sawPolicy)
		assert.True(t, sawHeld)
	})
}
