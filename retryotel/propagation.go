package retryotel

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Application properties that carry trace context on a Service Bus message. The Azure SDKs write the
// W3C traceparent and tracestate, and repeat the traceparent in Diagnostic-Id (their older property,
// still the only one some producers write); they read traceparent first and fall back on Diagnostic-Id
// (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-end-to-end-tracing). This package
// does the same, whatever propagator it is given, so that chains link even when the global propagator
// was never set.
const (
	// PropTraceparent is the W3C traceparent: the message's creation context.
	PropTraceparent = "traceparent"
	// PropTracestate is the W3C tracestate that goes with it.
	PropTracestate = "tracestate"
	// PropDiagnosticID repeats the traceparent, as the Azure SDKs write and read it.
	PropDiagnosticID = "Diagnostic-Id"
)

// Properties that carry a retry chain's creation context on every retry copy: the producer's context if
// the first delivery had one, else the first attempt's process span. Each copy's traceparent points at
// the previous attempt, so without these a trace viewer would have to walk the links one attempt at a
// time to reach the start. The sbretry- prefix keeps them out of [envelope.Resubmit]'s fresh first
// deliveries, which link to the dead-lettered attempt through traceparent instead.
const (
	// PropOriginTraceparent is the chain's creation context, in traceparent format.
	PropOriginTraceparent = originPrefix + PropTraceparent
	// PropOriginTracestate is the tracestate that goes with it.
	PropOriginTracestate = originPrefix + PropTracestate
)

const originPrefix = "sbretry-origin-"

// w3c is the W3C Trace Context format, always used for traceparent, tracestate and Diagnostic-Id.
var w3c propagation.TraceContext

// propertiesCarrier adapts application properties to a propagator. Only string values are read; a
// producer that wrote a non-string traceparent simply has no context.
type propertiesCarrier struct {
	props  map[string]any
	prefix string
}

func (c propertiesCarrier) Get(key string) string {
	s, _ := c.props[c.prefix+key].(string)
	return s
}

func (c propertiesCarrier) Set(key, value string) { c.props[c.prefix+key] = value }

func (c propertiesCarrier) Keys() []string {
	keys := make([]string, 0, len(c.props))
	for k := range c.props {
		if len(k) >= len(c.prefix) && k[:len(c.prefix)] == c.prefix {
			keys = append(keys, k[len(c.prefix):])
		}
	}
	return keys
}

// incoming is the trace context a delivery arrived with.
type incoming struct {
	// ctx holds what the propagator extracted (the remote span context, baggage).
	ctx context.Context
	// creation is the span context in traceparent (or Diagnostic-Id): the producer's, or on a retry copy
	// written by this package, the previous attempt's process span.
	creation trace.SpanContext
	// origin is the chain's creation context carried in the sbretry-origin- properties (retry copies only).
	origin trace.SpanContext
}

// extract reads the trace context of a delivery's application properties: the configured propagator
// first, then W3C traceparent, then Diagnostic-Id.
func (in *Instrumentation) extract(props map[string]any) incoming {
	carrier := propertiesCarrier{props: props}
	ctx := in.propagator.Extract(context.Background(), carrier)
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		sc = trace.SpanContextFromContext(w3c.Extract(context.Background(), carrier))
	}
	if !sc.IsValid() {
		if id, ok := props[PropDiagnosticID].(string); ok && id != "" {
			sc = trace.SpanContextFromContext(w3c.Extract(context.Background(), propagation.MapCarrier{PropTraceparent: id}))
		}
	}
	origin := trace.SpanContextFromContext(w3c.Extract(context.Background(), propertiesCarrier{props: props, prefix: originPrefix}))
	return incoming{ctx: ctx, creation: sc, origin: origin}
}

// inject writes the span context of ctx into props (a retry copy's application properties) as the
// copy's creation context, replacing the context the copy inherited from the message it copies. It
// leaves props alone when ctx has no valid span context (tracing off): the inherited context is then
// still the best there is. origin is written unless the copy already carries one. It reports whether
// it wrote ctx's context.
func (in *Instrumentation) inject(ctx context.Context, props map[string]any, origin trace.SpanContext) bool {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return false
	}
	// Remove what the copy inherited first: a propagator writes tracestate only when it is non-empty,
	// so a stale one would otherwise survive next to the new traceparent.
	for _, k := range in.propagator.Fields() {
		delete(props, k)
	}
	delete(props, PropTraceparent)
	delete(props, PropTracestate)
	delete(props, PropDiagnosticID)
	carrier := propertiesCarrier{props: props}
	w3c.Inject(ctx, carrier)
	in.propagator.Inject(ctx, carrier)
	if tp, ok := props[PropTraceparent].(string); ok {
		props[PropDiagnosticID] = tp
	}
	if _, ok := props[PropOriginTraceparent]; !ok && origin.IsValid() {
		w3c.Inject(trace.ContextWithRemoteSpanContext(context.Background(), origin), propertiesCarrier{props: props, prefix: originPrefix})
	}
	return true
}
