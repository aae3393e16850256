package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/redact"
	"github.com/sbretry/retry/retryotel"
)

// Environment variables read when --trace-file is given: a W3C trace context to continue, as the
// OpenTelemetry convention for environment variables as context carriers names them, so that a script
// or CI job that is itself traced gets the command's spans in its trace.
const (
	envTraceparent = "TRACEPARENT"
	envTracestate  = "TRACESTATE"
)

// commandTrace is the tracing of one command run with --trace-file: the file, the provider writing
// to it, and the command's root span.
type commandTrace struct {
	path string
	file *os.File
	exp  *otlpFileExporter
	tp   *sdktrace.TracerProvider
	root trace.Span
}

// startTracing opens --trace-file for appending and returns the command's context, now carrying its
// root span "sbretry COMMAND", and the Observer that records its broker calls (package retryotel).
// [app.endTrace], called by run once the command returned, ends the root span with the exit code and
// flushes and closes the file.
//
// The spans are written as OTLP JSON, one ExportTraceServiceRequest per line, the file format of the
// OpenTelemetry protocol (the Collector's otlpjsonfile receiver reads it), so no exporter dependency
// and no collector endpoint is needed: sbretry is a short command, and a file of what it did to the
// broker is what an operator keeps. Every span is recorded (no sampling); no metric is exported.
func (a *app) startTracing(ctx context.Context, c *common, connStr string) (context.Context, inspect.Observer, error) {
	f, err := os.OpenFile(c.traceFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("--trace-file: %w", err)
	}
	exp := &otlpFileExporter{w: f}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSyncer(exp),
		sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName("sbretry"))),
	)
	opts := &retryotel.Options{TracerProvider: tp, MeterProvider: noop.NewMeterProvider(), Propagator: propagation.TraceContext{}}
	// The namespace is the connection string's Endpoint; only its host and port are read.
	if host, port, err := retryotel.ServerFromConnectionString(connStr); err == nil {
		opts.ServerAddress, opts.ServerPort = host, port
	}
	inst, err := retryotel.New(opts)
	if err != nil {
		_ = tp.Shutdown(ctx)
		_ = f.Close()
		return nil, nil, err
	}
	if tp := a.getenv(envTraceparent); tp != "" {
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": tp, "tracestate": a.getenv(envTracestate)})
	}
	ctx, root := tp.Tracer(tracerName).Start(ctx, "sbretry "+c.command, trace.WithSpanKind(trace.SpanKindInternal))
	a.trace = &commandTrace{path: c.traceFile, file: f, exp: exp, tp: tp, root: root}
	return ctx, inst, nil
}

// tracerName is the instrumentation scope of the command's own span.
const tracerName = "github.com/sbretry/retry/cmd/sbretry"

// endTrace ends the command's span, if --trace-file started one, with process.exit.code and, for a
// failed command, an error status holding its redacted message; then it flushes and closes the file,
// reporting a write error on stderr.
func (a *app) endTrace(code int, err error) {
	t := a.trace
	if t == nil {
		return
	}
	a.trace = nil
	t.root.SetAttributes(semconv.ProcessExitCode(code))
	if code != exitOK && err != nil {
		msg := redact.String(err.Error())
		if len(msg) > statusLimit {
			msg = strings.ToValidUTF8(msg[:statusLimit], "") + "…"
		}
		t.root.SetStatus(codes.Error, msg)
	}
	t.root.End()
	sctx, cancel := context.WithTimeout(context.Background(), traceFlushTimeout)
	defer cancel()
	_ = t.tp.Shutdown(sctx)
	werr := t.exp.error()
	if cerr := t.file.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		fmt.Fprintf(a.stderr, "sbretry: warning: writing --trace-file %s: %v\n", t.path, werr)
	}
}

// statusLimit bounds the error text of the command's span, like retryotel's spans.
const statusLimit = 1024

// traceFlushTimeout bounds the flush of the trace file at the end of a command.
const traceFlushTimeout = 10 * time.Second

// otlpFileExporter writes spans as OTLP JSON lines to w. It is a [sdktrace.SpanExporter] for a
// synchronous span processor: each batch becomes one line.
type otlpFileExporter struct {
	mu  sync.Mutex
	w   io.Writer
	err error // the first write error
}

var _ sdktrace.SpanExporter = (*otlpFileExporter)(nil)

// ExportSpans writes spans as one ExportTraceServiceRequest line.
func (e *otlpFileExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	if len(spans) == 0 {
		return nil
	}
	line, err := json.Marshal(otlpRequestOf(spans))
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err != nil {
		return e.err
	}
	if _, err := e.w.Write(append(line, '\n')); err != nil {
		e.err = err
		return err
	}
	return nil
}

// Shutdown does nothing: the file is closed by the command.
func (e *otlpFileExporter) Shutdown(context.Context) error { return nil }

func (e *otlpFileExporter) error() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.err
}

// The OTLP JSON encoding of an ExportTraceServiceRequest
// (https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding): field names in lowerCamelCase,
// trace and span ids in hex, 64-bit integers as decimal strings, enums as numbers.
type (
	otlpRequest struct {
		ResourceSpans []otlpResourceSpans `json:"resourceSpans"`
	}
	otlpResourceSpans struct {
		Resource   otlpResource     `json:"resource"`
		ScopeSpans []otlpScopeSpans `json:"scopeSpans"`
		SchemaURL  string           `json:"schemaUrl,omitempty"`
	}
	otlpResource struct {
		Attributes []otlpKeyValue `json:"attributes"`
	}
	otlpScopeSpans struct {
		Scope     otlpScope  `json:"scope"`
		Spans     []otlpSpan `json:"spans"`
		SchemaURL string     `json:"schemaUrl,omitempty"`
	}
	otlpScope struct {
		Name    string `json:"name"`
		Version string `json:"version,omitempty"`
	}
	otlpSpan struct {
		TraceID           string         `json:"traceId"`
		SpanID            string         `json:"spanId"`
		TraceState        string         `json:"traceState,omitempty"`
		ParentSpanID      string         `json:"parentSpanId,omitempty"`
		Name              string         `json:"name"`
		Kind              int            `json:"kind"`
		StartTimeUnixNano string         `json:"startTimeUnixNano"`
		EndTimeUnixNano   string         `json:"endTimeUnixNano"`
		Attributes        []otlpKeyValue `json:"attributes,omitempty"`
		Links             []otlpLink     `json:"links,omitempty"`
		Status            otlpStatus     `json:"status"`
	}
	otlpLink struct {
		TraceID    string         `json:"traceId"`
		SpanID     string         `json:"spanId"`
		TraceState string         `json:"traceState,omitempty"`
		Attributes []otlpKeyValue `json:"attributes,omitempty"`
	}
	otlpStatus struct {
		Code    int    `json:"code,omitempty"`
		Message string `json:"message,omitempty"`
	}
	otlpKeyValue struct {
		Key   string       `json:"key"`
		Value otlpAnyValue `json:"value"`
	}
	otlpAnyValue struct {
		StringValue *string         `json:"stringValue,omitempty"`
		BoolValue   *bool           `json:"boolValue,omitempty"`
		IntValue    *string         `json:"intValue,omitempty"`
		DoubleValue *float64        `json:"doubleValue,omitempty"`
		ArrayValue  *otlpArrayValue `json:"arrayValue,omitempty"`
	}
	otlpArrayValue struct {
		Values []otlpAnyValue `json:"values"`
	}
)

// OTLP status codes: the API's codes.Error and codes.Ok are numbered the other way round.
const (
	otlpStatusOK    = 1
	otlpStatusError = 2
)

// otlpRequestOf groups spans by resource and instrumentation scope, in the order first seen.
func otlpRequestOf(spans []sdktrace.ReadOnlySpan) otlpRequest {
	var req otlpRequest
	type scopeKey struct {
		res   int
		scope string
	}
	resIndex := map[attribute.Distinct]int{}
	scopeIndex := map[scopeKey]int{}
	for _, s := range spans {
		res := s.Resource()
		var distinct attribute.Distinct
		if res != nil {
			distinct = res.Set().Equivalent()
		}
		ri, ok := resIndex[distinct]
		if !ok {
			rs := otlpResourceSpans{Resource: otlpResource{Attributes: []otlpKeyValue{}}}
			if res != nil {
				rs.Resource.Attributes = otlpAttributes(res.Attributes())
				rs.SchemaURL = res.SchemaURL()
			}
			ri = len(req.ResourceSpans)
			resIndex[distinct] = ri
			req.ResourceSpans = append(req.ResourceSpans, rs)
		}
		sc := s.InstrumentationScope()
		key := scopeKey{res: ri, scope: sc.Name + "\x00" + sc.Version + "\x00" + sc.SchemaURL}
		si, ok := scopeIndex[key]
		if !ok {
			si = len(req.ResourceSpans[ri].ScopeSpans)
			scopeIndex[key] = si
			req.ResourceSpans[ri].ScopeSpans = append(req.ResourceSpans[ri].ScopeSpans, otlpScopeSpans{
				Scope: otlpScope{Name: sc.Name, Version: sc.Version}, SchemaURL: sc.SchemaURL,
			})
		}
		ss := &req.ResourceSpans[ri].ScopeSpans[si]
		ss.Spans = append(ss.Spans, otlpSpanOf(s))
	}
	return req
}

func otlpSpanOf(s sdktrace.ReadOnlySpan) otlpSpan {
	sc := s.SpanContext()
	out := otlpSpan{
		TraceID:           sc.TraceID().String(),
		SpanID:            sc.SpanID().String(),
		TraceState:        sc.TraceState().String(),
		Name:              s.Name(),
		Kind:              int(s.SpanKind()), // the API numbers span kinds as OTLP does
		StartTimeUnixNano: strconv.FormatInt(s.StartTime().UnixNano(), 10),
		EndTimeUnixNano:   strconv.FormatInt(s.EndTime().UnixNano(), 10),
		Attributes:        otlpAttributes(s.Attributes()),
	}
	if p := s.Parent(); p.SpanID().IsValid() {
		out.ParentSpanID = p.SpanID().String()
	}
	for _, l := range s.Links() {
		out.Links = append(out.Links, otlpLink{
			TraceID: l.SpanContext.TraceID().String(), SpanID: l.SpanContext.SpanID().String(),
			TraceState: l.SpanContext.TraceState().String(), Attributes: otlpAttributes(l.Attributes),
		})
	}
	switch st := s.Status(); st.Code {
	case codes.Error:
		out.Status = otlpStatus{Code: otlpStatusError, Message: st.Description}
	case codes.Ok:
		out.Status = otlpStatus{Code: otlpStatusOK}
	}
	return out
}

func otlpAttributes(kvs []attribute.KeyValue) []otlpKeyValue {
	out := make([]otlpKeyValue, 0, len(kvs))
	for _, kv := range kvs {
		out = append(out, otlpKeyValue{Key: string(kv.Key), Value: otlpValue(kv.Value)})
	}
	return out
}

func otlpValue(v attribute.Value) otlpAnyValue {
	switch v.Type() {
	case attribute.BOOL:
		b := v.AsBool()
		return otlpAnyValue{BoolValue: &b}
	case attribute.INT64:
		s := strconv.FormatInt(v.AsInt64(), 10)
		return otlpAnyValue{IntValue: &s}
	case attribute.FLOAT64:
		f := v.AsFloat64()
		return otlpAnyValue{DoubleValue: &f}
	case attribute.BOOLSLICE:
		return otlpArray(len(v.AsBoolSlice()), func(i int) attribute.Value { return attribute.BoolValue(v.AsBoolSlice()[i]) })
	case attribute.INT64SLICE:
		return otlpArray(len(v.AsInt64Slice()), func(i int) attribute.Value { return attribute.Int64Value(v.AsInt64Slice()[i]) })
	case attribute.FLOAT64SLICE:
		return otlpArray(len(v.AsFloat64Slice()), func(i int) attribute.Value { return attribute.Float64Value(v.AsFloat64Slice()[i]) })
	case attribute.STRINGSLICE:
		return otlpArray(len(v.AsStringSlice()), func(i int) attribute.Value { return attribute.StringValue(v.AsStringSlice()[i]) })
	}
	s := v.Emit()
	return otlpAnyValue{StringValue: &s}
}

func otlpArray(n int, at func(int) attribute.Value) otlpAnyValue {
	arr := &otlpArrayValue{Values: make([]otlpAnyValue, n)}
	for i := range n {
		arr.Values[i] = otlpValue(at(i))
	}
	return otlpAnyValue{ArrayValue: arr}
}
