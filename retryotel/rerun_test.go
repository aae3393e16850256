package retryotel_test

import (
	"context"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbretry/retry"
)

// The reruns of one delivery (immediate retries) stay in its one process span: OnStart runs again for
// each, so that a user's per-attempt deadline is fresh, but the instrumentation starts no second span,
// and the user's hook still sees the process span in its context.
func TestImmediateRetriesShareTheProcessSpan(t *testing.T) {
	var inHook []trace.SpanContext
	calls := 0
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error {
		calls++
		if calls < 3 {
			return errBoomOtel
		}
		return nil
	}, &fixtureOptions{
		retry: retry.Options{ImmediateRetries: 2}, // no ImmediateDelay: the fixture's clock is a mock
		next: retry.Hooks{OnStart: func(p retry.StartParams) context.Context {
			inHook = append(inHook, trace.SpanContextFromContext(p.Context))
			return nil
		}},
	})
	_, err := f.broker.Send(&azservicebus.Message{MessageID: strPtr("m-1"), Body: []byte("x")})
	require.NoError(t, err)
	res := f.process()
	require.Equal(t, retry.OutcomeCompleted, res.Outcome)
	require.Equal(t, 3, calls)
	var process []trace.SpanContext
	for _, s := range f.spans.Ended() {
		if s.SpanKind() == trace.SpanKindConsumer {
			process = append(process, s.SpanContext())
		}
	}
	require.Len(t, process, 1, "one process span for the delivery")
	assert.Empty(t, f.spans.Started()[len(f.spans.Ended()):], "no span left open")
	require.Len(t, inHook, 3, "OnStart ran for each attempt")
	for i, sc := range inHook {
		assert.True(t, sameSpan(process[0], sc), "attempt %d's OnStart sees the delivery's process span", i+1)
	}
}

var errBoomOtel = errorString("downstream unavailable")

type errorString string

func (e errorString) Error() string { return string(e) }
