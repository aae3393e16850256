package retryotel_test

import (
	"context"
	"errors"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/retryotel"
	"github.com/sbretry/retry/retrytest"
)

// find returns the metric called name.
func find(t *testing.T, rm metricdata.ResourceMetrics, name string) metricdata.Metrics {
	t.Helper()
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m
			}
		}
	}
	require.Failf(t, "metric not reported", "%s", name)
	return metricdata.Metrics{}
}

// matches reports whether set holds every one of want.
func matches(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// intValue sums the points of an int64 sum or gauge whose attributes include want.
func intValue(t *testing.T, m metricdata.Metrics, want ...attribute.KeyValue) int64 {
	t.Helper()
	var points []metricdata.DataPoint[int64]
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		points = d.DataPoints
	case metricdata.Gauge[int64]:
		points = d.DataPoints
	default:
		require.Failf(t, "not an int64 sum or gauge", "%s: %T", m.Name, m.Data)
	}
	var n int64
	for _, p := range points {
		if matches(p.Attributes, want) {
			n += p.Value
		}
	}
	return n
}

// histogramCount counts the observations of a float64 histogram whose attributes include want.
func histogramCount(t *testing.T, m metricdata.Metrics, want ...attribute.KeyValue) uint64 {
	t.Helper()
	h, ok := m.Data.(metricdata.Histogram[float64])
	require.Truef(t, ok, "%s is %T", m.Name, m.Data)
	var n uint64
	for _, p := range h.DataPoints {
		if matches(p.Attributes, want) {
			n += p.Count
		}
	}
	return n
}

var (
	system = attribute.String("messaging.system", "servicebus")
	orders = attribute.String("messaging.destination.name", "orders")
)

func TestProcessingMetrics(t *testing.T) {
	calls := 0
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error {
		calls++
		switch calls {
		case 1, 2:
			return errUnavailable // attempts 1 and 2 of order-1 fail
		case 3:
			return nil // attempt 3 succeeds
		}
		return retry.Permanent(errors.New("malformed")) // order-2 is poison
	}, nil)
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("order-1")})
	for range 3 {
		f.process()
		f.broker.AdvanceToNextScheduled(f.clock)
	}
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("order-2")})
	f.process()

	rm := f.metrics()
	process := find(t, rm, "messaging.process.duration")
	assert.Equal(t, "s", process.Unit)
	assert.Equal(t, uint64(4), histogramCount(t, process, system, orders, attribute.String("messaging.operation.name", "process")))
	assert.Equal(t, uint64(3), histogramCount(t, process, attribute.String("error.type", "*errors.errorString")), "order-1's two failures and order-2's")

	consumed := find(t, rm, "messaging.client.consumed.messages")
	assert.Equal(t, "{message}", consumed.Unit)
	assert.Equal(t, int64(4), intValue(t, consumed, system, orders, attribute.String("messaging.operation.name", "receive")))

	ops := find(t, rm, "messaging.client.operation.duration")
	assert.Equal(t, uint64(2), histogramCount(t, ops, attribute.String("messaging.operation.name", "schedule"), attribute.String("messaging.operation.type", "send")))
	assert.Equal(t, uint64(3), histogramCount(t, ops, attribute.String("messaging.operation.name", "complete"), attribute.String("messaging.operation.type", "settle")))
	assert.Equal(t, uint64(1), histogramCount(t, ops, attribute.String("messaging.operation.name", "dead_letter")))

	assert.Equal(t, uint64(4), histogramCount(t, find(t, rm, "sbretry.handler.duration")))

	retries := find(t, rm, "sbretry.retries.scheduled")
	assert.Equal(t, int64(1), intValue(t, retries, orders, attribute.Int("sbretry.attempt", 1)))
	assert.Equal(t, int64(1), intValue(t, retries, orders, attribute.Int("sbretry.attempt", 2)))
	assert.Equal(t, int64(1), intValue(t, find(t, rm, "sbretry.dead_lettered"), orders, attribute.String("sbretry.dead_letter.reason", "RetryPermanentFailure")))
}

func TestLeftForRedeliveryAndPossibleDuplicateMetrics(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errUnavailable }, nil)
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("order-42")})
	f.broker.Fail(retrytest.OpComplete, 1, nil)
	f.process()

	rm := f.metrics()
	assert.Equal(t, int64(1), intValue(t, find(t, rm, "sbretry.possible_duplicates"), orders, attribute.Int("sbretry.attempt", 1)))
	assert.Equal(t, int64(1), intValue(t, find(t, rm, "sbretry.left_for_redelivery"), orders, attribute.String("error.type", "*errors.errorString")))
	assert.Equal(t, uint64(1), histogramCount(t, find(t, rm, "messaging.client.operation.duration"),
		attribute.String("messaging.operation.name", "complete"), attribute.String("error.type", "*errors.errorString")))
}

func TestConsumerStateMetric(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return nil }, nil)
	one, two := f.inst.Hooks(retry.Hooks{}), f.inst.Hooks(retry.Hooks{})
	one.OnStateChange(retry.StateChangeParams{From: retry.StateIdle, To: retry.StateConnecting})
	one.OnStateChange(retry.StateChangeParams{From: retry.StateConnecting, To: retry.StateRunning})
	two.OnStateChange(retry.StateChangeParams{From: retry.StateIdle, To: retry.StateConnecting})

	state := func(s retry.State) int64 {
		return intValue(t, find(t, f.metrics(), "sbretry.consumer.state"), attribute.String("sbretry.consumer.state", s.String()))
	}
	assert.Equal(t, int64(1), state(retry.StateRunning))
	assert.Equal(t, int64(1), state(retry.StateConnecting))

	one.OnStateChange(retry.StateChangeParams{From: retry.StateRunning, To: retry.StateReconnecting, Err: errors.New("link detached")})
	assert.Equal(t, int64(0), state(retry.StateRunning))
	assert.Equal(t, int64(1), state(retry.StateReconnecting))
	assert.Equal(t, int64(0), state(retry.StateIdle), "idle is never reported")
}

func TestDeadLetterDepthGauge(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return nil }, nil)
	f.inst.RecordDeadLetterDepth("orders", 3)
	f.inst.RecordDeadLetterDepth("events/Subscriptions/billing", 1)
	f.inst.RecordDeadLetterDepth("orders", 5)
	f.inst.RecordDeadLetterDepth("invoices", -2)

	depth := find(t, f.metrics(), "sbretry.dead_letter.depth")
	assert.Equal(t, "{message}", depth.Unit)
	assert.Equal(t, int64(5), intValue(t, depth, orders), "the latest poll replaces the earlier one")
	assert.Equal(t, int64(1), intValue(t, depth, attribute.String("messaging.destination.name", "events"),
		attribute.String("messaging.destination.subscription.name", "billing")))
	assert.Equal(t, int64(0), intValue(t, depth, attribute.String("messaging.destination.name", "invoices")))
}

// sbretry.outcome stays off the duration histograms unless Options.DurationOutcome asks for it:
// by default each histogram has one series per entity, source and error.type (a failure's error.type
// stays), and with the option one more per outcome.
func TestDurationOutcomeIsOptIn(t *testing.T) {
	for _, tc := range []struct {
		name    string
		outcome bool
	}{{"default", false}, {"DurationOutcome", true}} {
		t.Run(tc.name, func(t *testing.T) {
			h := &failOnce{}
			f := newFixture(t, h.handle, &fixtureOptions{otel: retryotel.Options{DurationOutcome: tc.outcome}})
			f.broker.Send(&azservicebus.Message{MessageID: strPtr("order-1")})
			require.Equal(t, retry.OutcomeRetryScheduled, f.process().Outcome)
			f.broker.AdvanceToNextScheduled(f.clock)
			require.Equal(t, retry.OutcomeCompleted, f.process().Outcome)

			rm := f.metrics()
			for _, name := range []string{"messaging.process.duration", "sbretry.handler.duration"} {
				m := find(t, rm, name)
				points := dataPoints(m)
				require.NotEmpty(t, points, name)
				for _, set := range points {
					assert.Equal(t, tc.outcome, set.HasValue("sbretry.outcome"), "%s: sbretry.outcome on %v", name, set.Encoded(attribute.DefaultEncoder()))
				}
				assert.Equal(t, uint64(1), histogramCount(t, m, attribute.String("error.type", "*errors.errorString")), "%s: the failure keeps its error.type", name)
				if tc.outcome {
					assert.Equal(t, uint64(1), histogramCount(t, m, attribute.String("sbretry.outcome", "retry-scheduled")), name)
					assert.Equal(t, uint64(1), histogramCount(t, m, attribute.String("sbretry.outcome", "completed")), name)
				} else {
					assert.Len(t, points, 2, "%s: one series for the failure, one for the success", name)
				}
			}
			// The outcome is still on every process span.
			for _, s := range f.ended("process orders") {
				assert.Contains(t, attrs(s), attribute.Key("sbretry.outcome"))
			}
		})
	}
}
