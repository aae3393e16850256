package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/sbretry/retry/internal/sbtest"
)

// fileSpan is a span of the trace file, decoded generically so that the test checks the OTLP JSON
// encoding rather than this package's types.
type fileSpan struct {
	TraceID      string `json:"traceId"`
	SpanID       string `json:"spanId"`
	ParentSpanID string `json:"parentSpanId"`
	Name         string `json:"name"`
	Kind         int    `json:"kind"`
	Start        string `json:"startTimeUnixNano"`
	End          string `json:"endTimeUnixNano"`
	Attributes   []struct {
		Key   string         `json:"key"`
		Value map[string]any `json:"value"`
	} `json:"attributes"`
	Links []struct {
		TraceID string `json:"traceId"`
		SpanID  string `json:"spanId"`
	} `json:"links"`
	Status struct {
		Code int `json:"code"`
	} `json:"status"`
}

// attr returns the value of key as OTLP JSON encodes it ({"stringValue": ...}, {"intValue": "5"}).
func (s fileSpan) attr(key string) map[string]any {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value
		}
	}
	return nil
}

// readTraceFile decodes every line of path as an ExportTraceServiceRequest and returns its spans and
// the resources' service names.
func readTraceFile(t *testing.T, path string) (spans []fileSpan, services []string) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var req struct {
			ResourceSpans []struct {
				Resource struct {
					Attributes []struct {
						Key   string         `json:"key"`
						Value map[string]any `json:"value"`
					} `json:"attributes"`
				} `json:"resource"`
				ScopeSpans []struct {
					Scope struct {
						Name string `json:"name"`
					} `json:"scope"`
					Spans []fileSpan `json:"spans"`
				} `json:"scopeSpans"`
			} `json:"resourceSpans"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &req), sc.Text())
		for _, rs := range req.ResourceSpans {
			for _, kv := range rs.Resource.Attributes {
				if kv.Key == "service.name" {
					services = append(services, kv.Value["stringValue"].(string))
				}
			}
			for _, ss := range rs.ScopeSpans {
				require.NotEmpty(t, ss.Scope.Name)
				spans = append(spans, ss.Spans...)
			}
		}
	}
	require.NoError(t, sc.Err())
	return spans, services
}

// cliEnv runs the command like harness.cli, with env as its environment.
func (h *harness) cliEnv(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	a := &app{stdin: strings.NewReader(""), stdout: &out, stderr: &errOut, getenv: func(k string) string { return env[k] }, now: time.Now}
	full := append(append([]string{"--connection-string", h.Em.ConnectionString()}, h.entityFlags()...), args...)
	code = a.run(sbtest.Context(t), full)
	t.Logf("sbretry %s -> %d\nstdout:\n%sstderr:\n%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return code, out.String(), errOut.String()
}

// A redrive with --trace-file appends its spans as OTLP JSON: the command's span, continuing the
// TRACEPARENT of the environment, with every broker call under it, named and attributed by the
// conventions; no body and no key reach the file, which only its owner can read.
func TestTraceFileRecordsARedrive(t *testing.T) {
	t.Parallel()
	h := newSubscriptionHarness(t)
	h.seed(t, "perm-1")
	path := filepath.Join(t.TempDir(), "sbretry.otlp.jsonl")
	const parentTrace, parentSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	env := map[string]string{envTraceparent: "00-" + parentTrace + "-" + parentSpan + "-01"}
	code, _, errOut := h.cliEnv(t, env, "dlq", "redrive", "--all", "--redrive-to", sbtest.RetryQueue, "--trace-file", path)
	require.Equal(t, exitOK, code, errOut)

	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.NotContains(t, string(raw), `{\"id\":\"perm-1\"}`, "no body")
	assert.NotContains(t, string(raw), "SharedAccessKey", "no connection string")

	spans, services := readTraceFile(t, path)
	assert.Contains(t, services, "sbretry")
	byName := map[string][]fileSpan{}
	for _, s := range spans {
		byName[s.Name] = append(byName[s.Name], s)
		assert.Equal(t, parentTrace, s.TraceID, "%s: one trace, the environment's", s.Name)
		assert.Len(t, s.SpanID, 16)
		assert.NotEmpty(t, s.Start)
		assert.NotEmpty(t, s.End)
	}
	require.Len(t, byName["sbretry dlq redrive"], 1)
	root := byName["sbretry dlq redrive"][0]
	assert.Equal(t, parentSpan, root.ParentSpanID)
	assert.Equal(t, 1, root.Kind, "INTERNAL")
	assert.Equal(t, "0", root.attr("process.exit.code")["intValue"])
	assert.Zero(t, root.Status.Code)
	for _, name := range []string{"peek events", "peek billing-retry", "receive events", "send billing-retry", "complete events"} {
		got := byName[name]
		require.NotEmpty(t, got, "no span %q among %v", name, slices.Collect(maps.Keys(byName)))
		for _, s := range got {
			assert.Equal(t, root.SpanID, s.ParentSpanID, "%s is a child of the command's span", name)
			assert.Equal(t, 3, s.Kind, "%s: CLIENT", name)
			assert.Equal(t, "servicebus", s.attr("messaging.system")["stringValue"], name)
			assert.Equal(t, "127.0.0.1", s.attr("server.address")["stringValue"], name)
			assert.NotNil(t, s.attr("server.port")["intValue"], "%s: an int as OTLP JSON writes it", name)
			assert.Zero(t, s.Status.Code, "%s: unset", name)
		}
	}
	send := byName["send billing-retry"][0]
	assert.Equal(t, "send", send.attr("messaging.operation.type")["stringValue"])
	assert.Equal(t, "billing-retry", send.attr("messaging.destination.name")["stringValue"])
	assert.True(t, strings.HasPrefix(send.attr("messaging.message.id")["stringValue"].(string), "sbretry-resubmit-"))
	receive := byName["receive events"][0]
	assert.Equal(t, "dead_letter", receive.attr("sbretry.sub_queue")["stringValue"])
	assert.Equal(t, "billing", receive.attr("messaging.destination.subscription.name")["stringValue"])
	assert.Equal(t, "1", receive.attr("messaging.batch.message_count")["intValue"])

	// A second command appends: the file then holds both commands' spans.
	code, _, errOut = h.cliEnv(t, nil, "pending", "--trace-file", path)
	require.Equal(t, exitOK, code, errOut)
	spans, _ = readTraceFile(t, path)
	var pending []fileSpan
	for _, s := range spans {
		if s.Name == "sbretry pending" {
			pending = append(pending, s)
		}
	}
	require.Len(t, pending, 1)
	assert.Empty(t, pending[0].ParentSpanID, "no TRACEPARENT: a trace of its own")
	assert.NotEqual(t, parentTrace, pending[0].TraceID)
}

// A failed call is an error span with its error.type; a trace file that cannot be opened fails the
// command before anything is done; serve refuses the flag.
func TestTraceFileErrors(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	code, _, errOut := h.cli(t, "", "dlq", "redrive", "--all", "--redrive-to", "missing-queue", "--trace-file", path)
	require.Equal(t, exitOK, code, "nothing to redrive: "+errOut)
	h.seed(t, "perm-1")
	code, _, _ = h.cli(t, "", "dlq", "redrive", "--all", "--redrive-to", "missing-queue", "--trace-file", path)
	require.Equal(t, exitError, code)
	spans, _ := readTraceFile(t, path)
	var send *fileSpan
	for i, s := range spans {
		if s.Name == "send missing-queue" {
			send = &spans[i]
		}
	}
	require.NotNil(t, send)
	assert.Equal(t, 2, send.Status.Code, "ERROR in OTLP's numbering")
	assert.Equal(t, "notfound", send.attr("error.type")["stringValue"])
	var roots []fileSpan
	for _, s := range spans {
		if s.Name == "sbretry dlq redrive" {
			roots = append(roots, s)
		}
	}
	require.Len(t, roots, 2, "the command that found nothing, and the one that failed")
	assert.Equal(t, "0", roots[0].attr("process.exit.code")["intValue"])
	assert.Zero(t, roots[0].Status.Code)
	assert.Equal(t, "1", roots[1].attr("process.exit.code")["intValue"])
	assert.Equal(t, 2, roots[1].Status.Code)
	assert.Equal(t, roots[1].SpanID, send.ParentSpanID)

	code, _, errOut = h.cli(t, "", "pending", "--trace-file", filepath.Join(t.TempDir(), "no", "such", "dir", "f"))
	assert.Equal(t, exitError, code)
	assert.Contains(t, errOut, "--trace-file")

	code, _, errOut = h.cli(t, "", "serve", "--trace-file", path)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "not serve")
}

// Attribute values are written as OTLP JSON's AnyValue: 64-bit integers as decimal strings, slices as
// arrays of values.
func TestOTLPValues(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		v    attribute.Value
		want string
	}{
		{"string", attribute.StringValue("orders"), `{"stringValue":"orders"}`},
		{"bool", attribute.BoolValue(true), `{"boolValue":true}`},
		{"int", attribute.Int64Value(1 << 62), `{"intValue":"4611686018427387904"}`},
		{"double", attribute.Float64Value(0.25), `{"doubleValue":0.25}`},
		{"strings", attribute.StringSliceValue([]string{"a", "b"}), `{"arrayValue":{"values":[{"stringValue":"a"},{"stringValue":"b"}]}}`},
		{"ints", attribute.Int64SliceValue([]int64{1}), `{"arrayValue":{"values":[{"intValue":"1"}]}}`},
		{"bools", attribute.BoolSliceValue([]bool{false}), `{"arrayValue":{"values":[{"boolValue":false}]}}`},
		{"doubles", attribute.Float64SliceValue([]float64{1.5}), `{"arrayValue":{"values":[{"doubleValue":1.5}]}}`},
		{"empty slice", attribute.StringSliceValue(nil), `{"arrayValue":{"values":[]}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := json.Marshal(otlpValue(tc.v))
			require.NoError(t, err)
			assert.JSONEq(t, tc.want, string(got))
		})
	}
}
