package retryotel

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

func spanContext(t *testing.T, traceparent string) trace.SpanContext {
	t.Helper()
	sc := trace.SpanContextFromContext(w3c.Extract(context.Background(), propagation.MapCarrier{PropTraceparent: traceparent}))
	require.True(t, sc.IsValid())
	return sc
}

const (
	producerTP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	otherTP    = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
)

func TestExtractPrecedence(t *testing.T) {
	in := &Instrumentation{propagator: propagation.NewCompositeTextMapPropagator()}
	for _, tc := range []struct {
		name  string
		props map[string]any
		want  string // span id of the creation context; empty for none
	}{
		{"none", nil, ""},
		{"traceparent", map[string]any{PropTraceparent: producerTP}, "b7ad6b7169203331"},
		{"traceparent before Diagnostic-Id", map[string]any{PropTraceparent: producerTP, PropDiagnosticID: otherTP}, "b7ad6b7169203331"},
		{"Diagnostic-Id alone", map[string]any{PropDiagnosticID: otherTP}, "00f067aa0ba902b7"},
		{"not a string", map[string]any{PropTraceparent: []byte(producerTP)}, ""},
		{"malformed", map[string]any{PropTraceparent: "00-zz"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := in.extract(tc.props)
			if tc.want == "" {
				assert.False(t, got.creation.IsValid())
				return
			}
			assert.Equal(t, tc.want, got.creation.SpanID().String())
			assert.False(t, got.origin.IsValid())
		})
	}
}

func TestInject(t *testing.T) {
	in := &Instrumentation{propagator: propagation.NewCompositeTextMapPropagator()}
	current := trace.ContextWithRemoteSpanContext(context.Background(), spanContext(t, otherTP))
	origin := spanContext(t, producerTP)

	t.Run("replaces the inherited context and adds the origin", func(t *testing.T) {
		props := map[string]any{PropTraceparent: producerTP, PropTracestate: "vendor=old", PropDiagnosticID: producerTP, "order": "42"}
		in.inject(current, props, origin)
		assert.Equal(t, map[string]any{
			PropTraceparent: otherTP, PropDiagnosticID: otherTP, "order": "42",
			PropOriginTraceparent: producerTP,
		}, props)
	})
	t.Run("keeps an origin the copy already carries", func(t *testing.T) {
		props := map[string]any{PropOriginTraceparent: "00-11111111111111111111111111111111-2222222222222222-01"}
		in.inject(current, props, origin)
		assert.Equal(t, "00-11111111111111111111111111111111-2222222222222222-01", props[PropOriginTraceparent])
	})
	t.Run("leaves the copy alone without a span context", func(t *testing.T) {
		props := map[string]any{PropTraceparent: producerTP}
		in.inject(context.Background(), props, origin)
		assert.Equal(t, map[string]any{PropTraceparent: producerTP}, props)
	})
}

func TestPropertiesCarrierKeys(t *testing.T) {
	c := propertiesCarrier{props: map[string]any{PropOriginTraceparent: "x", PropTraceparent: "y"}, prefix: originPrefix}
	assert.Equal(t, []string{PropTraceparent}, c.Keys())
	assert.Equal(t, "x", c.Get(PropTraceparent))
}
