package retry_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
)

type ctxKey struct{}

// The hooks an instrumentation package needs: OnStart's context reaches the handler and every later
// hook, OnRetryCopy can add properties to the copy (not rename it), OnSettle reports each broker call,
// and OnProcessed carries the context and durations.
func TestHooksSeeOneDeliveryEndToEnd(t *testing.T) {
	var (
		handlerSaw  any
		copySaw     any
		settles     []string
		processed   retry.ProcessedParams
		copyAttempt int
	)
	hooks := retry.Hooks{
		OnStart: func(p retry.StartParams) context.Context {
			assert.Equal(t, "orders", p.EntityPath)
			return context.WithValue(p.Context, ctxKey{}, "span-1")
		},
		OnRetryCopy: func(p retry.RetryCopyParams) {
			copySaw = p.Context.Value(ctxKey{})
			copyAttempt = p.Attempt
			p.Copy.ApplicationProperties["traceparent"] = "00-abc-def-01"
			bogus := "renamed"
			p.Copy.MessageID = &bogus
		},
		OnSettle: func(p retry.SettleParams) {
			assert.Equal(t, "span-1", p.Context.Value(ctxKey{}))
			settles = append(settles, p.Operation)
		},
		OnProcessed: func(p retry.ProcessedParams) { processed = p },
	}
	f := newFixture(t, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
		handlerSaw = ctx.Value(ctxKey{})
		return errBoom
	}, &retry.Options{Hooks: hooks})
	f.broker.Send(sampleMessage())
	res := f.process()
	require.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
	assert.Equal(t, "span-1", handlerSaw)
	assert.Equal(t, "span-1", copySaw)
	assert.Equal(t, 2, copyAttempt)
	c := f.broker.Scheduled()[0]
	assert.Equal(t, "00-abc-def-01", c.Message.ApplicationProperties["traceparent"])
	assert.Equal(t, chainOf(1).RetryMessageID(2), c.MessageID, "a hook cannot rename the copy")
	assert.Equal(t, []string{"schedule", "complete"}, settles)
	assert.Equal(t, "span-1", processed.Context.Value(ctxKey{}))
	assert.Equal(t, "orders", processed.EntityPath)
	assert.Equal(t, res, processed.Result)
}

func TestHookDurations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var processed retry.ProcessedParams
		b, r, p := bubbleProcessor(t, func(context.Context, *azservicebus.ReceivedMessage) error {
			<-time.After(3 * time.Second)
			return nil
		}, &retry.Options{Hooks: retry.Hooks{OnProcessed: func(pp retry.ProcessedParams) { processed = pp }}})
		b.Send(sampleMessage())
		p.Process(t.Context(), r, receiveNow(t, r))
		assert.Equal(t, 3*time.Second, processed.HandlerDuration)
		assert.Equal(t, 3*time.Second, processed.Duration)
	})
}

func TestChainOrder(t *testing.T) {
	var order []string
	mw := func(name string) retry.Middleware {
		return func(next retry.Handler) retry.Handler {
			return func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
				order = append(order, name)
				return next(ctx, m)
			}
		}
	}
	h := retry.Chain(func(context.Context, *azservicebus.ReceivedMessage) error {
		order = append(order, "handler")
		return nil
	}, mw("a"), nil, mw("b"))
	require.NoError(t, h(t.Context(), &azservicebus.ReceivedMessage{}))
	assert.Equal(t, []string{"a", "b", "handler"}, order)
}

func TestHealthHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		c, err := retry.NewConsumer(b.Connector(), okHandler, &retry.Options{Logger: discardLogger()})
		require.NoError(t, err)
		get := func(ready bool) (int, map[string]any) {
			rec := httptest.NewRecorder()
			healthHandlerFor(c, ready).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
			var body map[string]any
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
			assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
			return rec.Code, body
		}
		code, body := get(true)
		assert.Equal(t, http.StatusServiceUnavailable, code, "not ready before Run")
		assert.Equal(t, "idle", body["state"])
		stop := runConsumer(t, c)
		synctest.Wait()
		code, body = get(true)
		assert.Equal(t, http.StatusOK, code)
		assert.Equal(t, "running", body["state"])
		sendN(b, 1)
		synctest.Wait()
		_, body = get(false)
		assert.Equal(t, float64(1), body["completed"])
		require.NoError(t, stop())
		code, _ = get(false)
		assert.Equal(t, http.StatusServiceUnavailable, code, "a stopped consumer is not live")
	})
}

// From the moment Run's context ends the consumer is draining: not ready (readiness 503) while its
// handlers finish, still live (liveness 200) until Run returns, then stopped.
func TestHealthWhileDraining(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		started, release := make(chan struct{}), make(chan struct{})
		var states []retry.State
		c, err := retry.NewConsumer(b.Connector(), func(context.Context, *azservicebus.ReceivedMessage) error {
			close(started)
			<-release // finishes within the grace period
			return nil
		}, &retry.Options{ShutdownGrace: time.Minute, Logger: discardLogger(), Hooks: retry.Hooks{
			OnStateChange: func(p retry.StateChangeParams) { states = append(states, p.To) },
		}})
		require.NoError(t, err)
		probe := func(ready bool) (int, string) {
			rec := httptest.NewRecorder()
			healthHandlerFor(c, ready).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
			var body struct{ State string }
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
			return rec.Code, body.State
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		sendN(b, 1)
		<-started
		require.True(t, c.Health().Ready())

		cancel()
		synctest.Wait() // Run's context has ended; the handler still runs
		h := c.Health()
		assert.Equal(t, retry.StateDraining, h.State)
		assert.Equal(t, "draining", h.State.String())
		assert.False(t, h.Ready())
		code, state := probe(true)
		assert.Equal(t, http.StatusServiceUnavailable, code, "readiness while draining")
		assert.Equal(t, "draining", state)
		code, _ = probe(false)
		assert.Equal(t, http.StatusOK, code, "liveness while draining")

		close(release)
		require.NoError(t, <-done)
		assert.Equal(t, retry.StateStopped, c.Health().State)
		code, _ = probe(false)
		assert.Equal(t, http.StatusServiceUnavailable, code)
		assert.Len(t, b.Completed(), 1, "the handler in flight finished and was completed")
		assert.Equal(t, []retry.State{retry.StateConnecting, retry.StateRunning, retry.StateDraining, retry.StateStopped}, states)
	})
}

// healthHandlerFor is the readiness handler (ready) or the liveness handler.
func healthHandlerFor(c *retry.Consumer, ready bool) http.Handler {
	if ready {
		return retry.ReadinessHandler(c)
	}
	return retry.LivenessHandler(c)
}
