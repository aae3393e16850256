package retryotel

import (
	"context"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/outage"
)

// ScopeName is the instrumentation scope of the tracer and the meter: the import path of this package,
// as the OpenTelemetry API asks.
const ScopeName = "github.com/sbretry/retry/retryotel"

// Options configures [New]. A nil *Options means all defaults; the zero value of every field means its
// documented default.
type Options struct {
	// TracerProvider creates the tracer. Nil means otel.GetTracerProvider(), looked up once in New.
	TracerProvider trace.TracerProvider
	// MeterProvider creates the meter. Nil means otel.GetMeterProvider(), looked up once in New.
	MeterProvider metric.MeterProvider
	// Propagator reads and writes the trace context in application properties, in addition to the W3C
	// traceparent, tracestate and Diagnostic-Id properties this package always handles (so chains link
	// even if no propagator was configured). Nil means otel.GetTextMapPropagator(); set it to carry
	// baggage or another format.
	Propagator propagation.TextMapPropagator
	// ParentFromMessage makes a delivery's trace context the parent of its process span instead of only
	// a link, so a message's producer and every attempt land in one trace. The messaging conventions
	// allow this for single-message processing but default to links, because the span then leaves the
	// context it was started in (https://opentelemetry.io/docs/specs/semconv/messaging/messaging-spans/);
	// false (the default) keeps the ambient context as parent and links to the message's context.
	ParentFromMessage bool
	// ServerAddress is the Service Bus namespace's host name ("contoso.servicebus.windows.net"), put in
	// server.address on every span and metric: the conventions make it "Conditionally Required If
	// available" on the Service Bus spans and on every messaging metric
	// (https://opentelemetry.io/docs/specs/semconv/messaging/azure-messaging/). Empty means learning it
	// from the connections [Instrumentation.Connector] and [Instrumentation.SessionConnector] wrap (their
	// [retry.Connection].Address or [retry.SessionConnection].Address, which the built-in connectors
	// set), and leaving it out until one is made. Set it for the operator tools
	// ([ServerFromConnectionString] reads it from a connection string's Endpoint; with a credential it
	// is the namespace), or to report a name other than the endpoint's. One Instrumentation reports one
	// namespace; use one per namespace.
	ServerAddress string
	// ServerPort is the namespace's port, put in server.port (Recommended) when ServerAddress is set
	// (a learned address brings its own port).
	// Zero means the port is not reported; outside 0 to 65535 is invalid. Service Bus listens on
	// 5671 (AMQP over TLS), or 443 with AMQP over WebSockets.
	ServerPort int
	// DurationOutcome adds [AttrOutcome] (sbretry.outcome, what the processor did with the delivery)
	// to the messaging.process.duration and sbretry.handler.duration histograms. False (the default)
	// leaves it out: it is not among the conventions' attributes of messaging.process.duration
	// (https://opentelemetry.io/docs/specs/semconv/messaging/messaging-metrics/), and its seven
	// values would multiply every series of both histograms (each bucket, per entity, source and
	// error.type) by up to seven. error.type stays, as the conventions require of a failed processing;
	// the outcome is on every process span, and the outcomes have counters of their own
	// ([MetricRetriesScheduled], [MetricDeadLettered], [MetricLeftForRedelivery], [MetricHeld],
	// [MetricDiscarded]). The conventions ask for attributes that multiply a metric's series to be
	// opt-in ("Opt-In", https://opentelemetry.io/docs/specs/semconv/general/attribute-requirement-level/):
	// set it to split the durations by outcome.
	DurationOutcome bool
}

// Instrumentation turns a consumer's [retry.Hooks] into OpenTelemetry spans and metrics, and the
// operator tools' broker calls too: it is an [inspect.Observer] ([Instrumentation.StartCall]) and wraps
// the dead-letter monitor's client ([Instrumentation.AdminClient]). Create it with [New]; the zero
// value is not usable. It is safe for concurrent use, and one Instrumentation may serve
// several consumers: every metric carries the entity it describes.
type Instrumentation struct {
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	parentMsg  bool
	metrics    *instruments

	// live maps a delivery's message to its telemetry state from OnStart to OnProcessed, so that a lock
	// renewal, which the core makes on a context of its own, finds the process span it belongs to.
	live sync.Map // *azservicebus.ReceivedMessage -> *delivery
	// retryQueues maps an entity to the queue its retry copies are scheduled to, as learned by
	// [Instrumentation.Connector]; see copyDestination.
	retryQueues sync.Map // string -> string

	// orphans holds the process span of a delivery whose OnStart never ran (the processor dead-letters a
	// message with malformed retry properties before it), from its first OnSettle to its OnProcessed.
	orphans sync.Map // *azservicebus.ReceivedMessage -> *delivery

	// sessions maps a session to the delivery being handled in it, from OnStart to OnProcessed, so that
	// a session lock renewal ([Instrumentation.SessionConnector]), which the core makes on a goroutine
	// of its own, finds the process span it belongs to.
	sessions sync.Map // sessionKey -> *delivery
}

// New returns an Instrumentation on the providers of opts. It fails if ServerPort is out of range or a
// metric instrument cannot be created (a MeterProvider that refuses one of them).
func New(opts *Options) (*Instrumentation, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.ServerPort < 0 || o.ServerPort > 65535 {
		return nil, fmt.Errorf("retryotel: Options.ServerPort %d is not a port (0 to 65535)", o.ServerPort)
	}
	if o.TracerProvider == nil {
		o.TracerProvider = otel.GetTracerProvider()
	}
	if o.MeterProvider == nil {
		o.MeterProvider = otel.GetMeterProvider()
	}
	if o.Propagator == nil {
		o.Propagator = otel.GetTextMapPropagator()
	}
	var server []attribute.KeyValue
	if o.ServerAddress != "" {
		server = append(server, semconv.ServerAddress(o.ServerAddress))
		if o.ServerPort > 0 {
			server = append(server, semconv.ServerPort(o.ServerPort))
		}
	}
	m, err := newInstruments(o.MeterProvider.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL)), server, o.DurationOutcome)
	if err != nil {
		return nil, err
	}
	return &Instrumentation{
		tracer:     o.TracerProvider.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		propagator: o.Propagator,
		parentMsg:  o.ParentFromMessage,
		metrics:    m,
	}, nil
}

// Hooks returns hooks that record telemetry and then call next's hook of the same name, so that
// instrumentation and a user's own hooks compose:
//
//	inst, err := retryotel.New(nil)
//	...
//	opts := &retry.Options{Hooks: inst.Hooks(retry.Hooks{OnProcessed: myAudit})}
//
// OnStart starts the delivery's process span and passes a context carrying it to next.OnStart (whose
// returned context, if any, must derive from it). OnRetryCopy writes the span's context into the copy
// before next.OnRetryCopy sees it. OnProcessed records the outcome, calls next.OnProcessed, and only
// then ends the span, so a user's hook may still annotate it and log with its trace id. Nil hooks in
// next are skipped.
func (in *Instrumentation) Hooks(next retry.Hooks) retry.Hooks {
	return retry.Hooks{
		OnStart: func(p retry.StartParams) context.Context {
			ctx := in.onStart(p)
			if next.OnStart != nil {
				p.Context = ctx
				if nctx := next.OnStart(p); nctx != nil {
					ctx = nctx
				}
			}
			return ctx
		},
		OnRetryCopy: func(p retry.RetryCopyParams) {
			in.onRetryCopy(p)
			if next.OnRetryCopy != nil {
				next.OnRetryCopy(p)
			}
		},
		OnSettle: func(p retry.SettleParams) {
			in.onSettle(p)
			if next.OnSettle != nil {
				next.OnSettle(p)
			}
		},
		OnProcessed: func(p retry.ProcessedParams) {
			end := in.onProcessed(p)
			if next.OnProcessed != nil {
				next.OnProcessed(p)
			}
			end()
		},
		OnStateChange: func(p retry.StateChangeParams) {
			in.metrics.stateChanged(p)
			if next.OnStateChange != nil {
				next.OnStateChange(p)
			}
		},
		OnOutage: func(p outage.Change) {
			in.metrics.outageChanged(p)
			if next.OnOutage != nil {
				next.OnOutage(p)
			}
		},
	}
}

// RecordDeadLetterDepth reports n messages in the dead-letter queue of entity (a queue, or
// "topic/Subscriptions/subscription"), for the sbretry.dead_letter.depth gauge ([MetricDeadLetterDepth]). It is the hook
// point for a dead-letter monitor: call it after every poll; the gauge reports the latest value per
// entity. A negative n is recorded as zero.
func (in *Instrumentation) RecordDeadLetterDepth(entity string, n int64) {
	in.metrics.recordDeadLetterDepth(entity, max(n, 0))
}
