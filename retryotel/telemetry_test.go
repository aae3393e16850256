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
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/retryotel"
	"github.com/sbretry/retry/retrytest"
)

// anyValue is the value of a required attribute whose value the table does not fix.
const anyValue = "\x00any"

// want is a row of the telemetry table: the attributes a span or every data point of a metric must
// carry (anyValue: present, whatever its value) and those it must not.
type want struct {
	attrs  map[attribute.Key]string
	absent []attribute.Key
}

func (w want) check(t *testing.T, what string, got map[attribute.Key]attribute.Value) {
	t.Helper()
	for k, v := range w.attrs {
		g, ok := got[k]
		if !assert.True(t, ok, "%s: %s missing", what, k) {
			continue
		}
		if v != anyValue {
			assert.Equal(t, v, g.Emit(), "%s: %s", what, k)
		}
	}
	for _, k := range w.absent {
		_, ok := got[k]
		assert.False(t, ok, "%s: %s must not be set", what, k)
	}
}

func merge(ms ...map[attribute.Key]string) map[attribute.Key]string {
	out := map[attribute.Key]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// renewSignal wraps the broker's receivers so that the first successful lock renewal of the message
// whose body is "slow" closes renewed: the slow handler waits for it instead of for a time.
func renewSignal(renewed chan struct{}) func(retry.Receiver) retry.Receiver {
	var once sync.Once
	return func(r retry.Receiver) retry.Receiver {
		return &signalReceiver{Receiver: r, fire: func(msg *azservicebus.ReceivedMessage) {
			if string(msg.Body) == "slow" {
				once.Do(func() { close(renewed) })
			}
		}}
	}
}

type signalReceiver struct {
	retry.Receiver
	fire func(*azservicebus.ReceivedMessage)
}

func (r *signalReceiver) RenewMessageLock(ctx context.Context, msg *azservicebus.ReceivedMessage, o *azservicebus.RenewMessageLockOptions) error {
	err := r.Receiver.RenewMessageLock(ctx, msg, o)
	if err == nil {
		r.fire(msg)
	}
	return err
}

// Every span and metric a real Consumer produces on a subscription with a retry queue, through a
// success, a retry that then succeeds, a dead letter after two attempts and a lock renewal, carries the
// attributes the conventions require (and the chain's source), per the table below.
func TestTelemetryTable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spans := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		host, port, err := retryotel.ServerFromConnectionString("Endpoint=sb://sb.example.net/;SharedAccessKeyName=k;SharedAccessKey=secret")
		require.NoError(t, err)
		inst, err := retryotel.New(&retryotel.Options{TracerProvider: tp, MeterProvider: mp, ServerAddress: host, ServerPort: port})
		require.NoError(t, err)

		renewed := make(chan struct{})
		b := newBroker(t, nil, &retrytest.BrokerOptions{
			EntityPath: "orders/Subscriptions/billing", RetryQueue: "billing-retry",
			DuplicateDetection: true, LockDuration: 10 * time.Second,
			WrapReceiver: renewSignal(renewed),
		})
		for _, body := range []string{"ok", "flaky", "poison", "slow"} {
			_, err := b.Send(&azservicebus.Message{MessageID: strPtr(body), Body: []byte(body)})
			require.NoError(t, err)
		}
		succeeded := make(chan string, 8)
		handler := func(ctx context.Context, msg *azservicebus.ReceivedMessage) error {
			first := msg.ApplicationProperties[envelope.PropAttempt] == nil
			switch string(msg.Body) {
			case "poison":
				return errUnavailable
			case "flaky":
				if first {
					return errUnavailable
				}
			case "slow":
				select {
				case <-renewed:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			succeeded <- string(msg.Body)
			return nil
		}
		c, err := retry.NewConsumer(inst.Connector(b.Connector()), handler, &retry.Options{
			MaxAttempts: 2, MaxConcurrency: 4, LockDuration: 10 * time.Second, Logger: discard(),
			Hooks: inst.Hooks(retry.Hooks{}),
		})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		for range 3 {
			<-succeeded
		}
		require.NoError(t, b.WaitUntil(t.Context(), func() bool { return len(b.DeadLettered()) == 1 }))
		cancel()
		require.NoError(t, <-done)
		require.NoError(t, tp.ForceFlush(context.Background()))

		server := map[attribute.Key]string{"server.address": "sb.example.net", "server.port": "5671"}
		base := merge(server, map[attribute.Key]string{
			"messaging.system":                 "servicebus",
			"sbretry.source.name":              "orders",
			"sbretry.source.subscription.name": "billing",
		})
		onSub := merge(base, map[attribute.Key]string{"messaging.destination.name": "orders", "messaging.destination.subscription.name": "billing"})
		onRetry := merge(base, map[attribute.Key]string{"messaging.destination.name": "billing-retry"})
		noSub := []attribute.Key{"messaging.destination.subscription.name"}
		op := func(name, typ string) map[attribute.Key]string {
			m := map[attribute.Key]string{"messaging.operation.name": name}
			if typ != "" {
				m["messaging.operation.type"] = typ
			}
			return m
		}
		perMessage := map[attribute.Key]string{"messaging.message.id": anyValue}

		spanTable := []struct {
			name string
			kind trace.SpanKind
			want want
		}{
			{"process orders", trace.SpanKindConsumer, want{attrs: merge(onSub, op("process", "process"), perMessage,
				map[attribute.Key]string{"messaging.servicebus.message.delivery_count": anyValue, "sbretry.attempt": "1"})}},
			{"process billing-retry", trace.SpanKindConsumer, want{attrs: merge(onRetry, op("process", "process"), perMessage,
				map[attribute.Key]string{"sbretry.attempt": "2"}), absent: noSub}},
			{"schedule billing-retry", trace.SpanKindClient, want{attrs: merge(onRetry, op("schedule", "send"), perMessage), absent: noSub}},
			{"complete orders", trace.SpanKindClient, want{attrs: merge(onSub, op("complete", "settle"), perMessage,
				map[attribute.Key]string{"messaging.servicebus.disposition_status": "complete"})}},
			{"complete billing-retry", trace.SpanKindClient, want{attrs: merge(onRetry, op("complete", "settle"), perMessage,
				map[attribute.Key]string{"messaging.servicebus.disposition_status": "complete"}), absent: noSub}},
			{"dead_letter billing-retry", trace.SpanKindClient, want{attrs: merge(onRetry, op("dead_letter", "settle"), perMessage,
				map[attribute.Key]string{"messaging.servicebus.disposition_status": "dead_letter"}), absent: noSub}},
			{"renew_message_lock orders", trace.SpanKindClient, want{attrs: merge(onSub, op("renew_message_lock", ""), perMessage),
				absent: []attribute.Key{"messaging.operation.type", "error.type"}}},
		}
		byName := map[string][]sdktrace.ReadOnlySpan{}
		byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
		for _, s := range spans.Ended() {
			byName[s.Name()] = append(byName[s.Name()], s)
			byID[s.SpanContext().SpanID()] = s
		}
		for _, row := range spanTable {
			got := byName[row.name]
			if !assert.NotEmpty(t, got, "no span %q among %v", row.name, keys(byName)) {
				continue
			}
			for _, s := range got {
				assert.Equal(t, row.kind, s.SpanKind(), row.name)
				row.want.check(t, row.name, attrs(s))
			}
		}
		assert.Len(t, byName["schedule billing-retry"], 2, "flaky and poison were each scheduled once")
		assert.Len(t, spanTable, len(byName), "every span name is in the table: %v", keys(byName))

		// The schedule span links to the creation context it wrote into the copy: its parent process
		// span, which the next attempt's process span links to as its previous attempt.
		for _, s := range byName["schedule billing-retry"] {
			require.Len(t, s.Links(), 1)
			assert.True(t, sameSpan(s.Parent(), s.Links()[0].SpanContext), "the schedule span links to the injected context")
			assert.Equal(t, attrs(s)["messaging.message.id"], linkAttrs(s.Links()[0])["messaging.message.id"])
			var next sdktrace.ReadOnlySpan
			for _, p := range byName["process billing-retry"] {
				if attrs(p)["messaging.message.id"] == attrs(s)["messaging.message.id"] {
					next = p
				}
			}
			require.NotNil(t, next, "the copy was processed")
			require.NotEmpty(t, next.Links())
			assert.True(t, sameSpan(s.Links()[0].SpanContext, next.Links()[0].SpanContext), "attempt 2 links to the context the schedule span links to")
		}
		// A renewal during the handler is a child of the delivery's process span.
		for _, s := range byName["renew_message_lock orders"] {
			parent, ok := byID[s.Parent().SpanID()]
			require.True(t, ok, "the renewal of %s at %v has a recorded parent", attrs(s)["messaging.message.id"].Emit(), s.StartTime())
			assert.Equal(t, "process orders", parent.Name())
			assert.Equal(t, "slow", attrs(parent)["messaging.message.id"].AsString())
		}

		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(context.Background(), &rm))
		sourced := merge(base, map[attribute.Key]string{"messaging.destination.name": anyValue})
		metricTable := []struct {
			name string
			want want
		}{
			{"messaging.process.duration", want{attrs: merge(sourced, op("process", "")),
				absent: []attribute.Key{"messaging.operation.type", "sbretry.outcome"}}},
			{"messaging.client.consumed.messages", want{attrs: merge(sourced, op("receive", "")),
				absent: []attribute.Key{"messaging.operation.type", "error.type"}}},
			{"messaging.client.sent.messages", want{attrs: merge(onRetry, op("schedule", "")),
				absent: []attribute.Key{"messaging.operation.type", "error.type", "messaging.destination.subscription.name"}}},
			{"messaging.client.operation.duration", want{attrs: merge(sourced, map[attribute.Key]string{"messaging.operation.name": anyValue})}},
			{"sbretry.handler.duration", want{attrs: sourced}},
			{"sbretry.retries.scheduled", want{attrs: merge(sourced, map[attribute.Key]string{"sbretry.attempt": "1"})}},
			{"sbretry.dead_lettered", want{attrs: merge(onRetry, map[attribute.Key]string{"sbretry.dead_letter.reason": anyValue})}},
			{"sbretry.consumer.state", want{attrs: map[attribute.Key]string{"sbretry.consumer.state": anyValue}}},
		}
		for _, row := range metricTable {
			m := find(t, rm, row.name)
			points := dataPoints(m)
			require.NotEmpty(t, points, row.name)
			for _, set := range points {
				row.want.check(t, row.name, setMap(set))
			}
		}
		sent := find(t, rm, "messaging.client.sent.messages")
		assert.Equal(t, int64(2), intValue(t, sent, attribute.String("messaging.destination.name", "billing-retry")))
		consumed := find(t, rm, "messaging.client.consumed.messages")
		assert.Equal(t, int64(4), intValue(t, consumed, attribute.String("messaging.destination.subscription.name", "billing")))
		assert.Equal(t, int64(2), intValue(t, consumed, attribute.String("messaging.destination.name", "billing-retry")))
		ops := find(t, rm, "messaging.client.operation.duration")
		for _, o := range []struct{ name, typ string }{{"schedule", "send"}, {"complete", "settle"}, {"dead_letter", "settle"}} {
			assert.NotZero(t, histogramCount(t, ops, attribute.String("messaging.operation.name", o.name), attribute.String("messaging.operation.type", o.typ)), o.name)
		}
		assert.NotZero(t, histogramCount(t, ops, attribute.String("messaging.operation.name", "renew_message_lock")))

		require.NoError(t, tp.Shutdown(context.Background()))
		require.NoError(t, mp.Shutdown(context.Background()))
	})
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func linkAttrs(l sdktrace.Link) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range l.Attributes {
		out[kv.Key] = kv.Value
	}
	return out
}

func setMap(s attribute.Set) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.ToSlice() {
		out[kv.Key] = kv.Value
	}
	return out
}

// dataPoints returns the attribute sets of m's data points.
func dataPoints(m metricdata.Metrics) []attribute.Set {
	var out []attribute.Set
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	}
	return out
}
