package retry_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
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

// An OnStart hook's context (a span, say) is the one the consumer's handler derives from: its values
// reach the handler, and the shutdown still cancels it.
func TestOnStartContextReachesTheConsumersHandler(t *testing.T) {
	type hookKey struct{}
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		sendN(b, 3)
		var seen []any
		last := make(chan struct{})
		c, err := retry.NewConsumer(b.Connector(), func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
			seen = append(seen, ctx.Value(hookKey{}))
			if m.MessageID != "m-2" {
				return nil
			}
			close(last)
			<-ctx.Done()
			return ctx.Err()
		}, &retry.Options{MaxConcurrency: 1, Logger: discardLogger(), Hooks: retry.Hooks{
			OnStart: func(p retry.StartParams) context.Context {
				return context.WithValue(p.Context, hookKey{}, "span-"+p.Message.MessageID)
			},
		}})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		<-last
		require.NoError(t, stop())
		assert.Equal(t, []any{"span-m-0", "span-m-1", "span-m-2"}, seen)
		assert.Len(t, b.Completed(), 2)
	})
}

// A deadline that OnStart sets is each attempt's own: an immediate retry (queue) or a retry held in
// place (session) gets a fresh context from OnStart, never the expired one of an earlier attempt, and
// OnStart says which rerun it is.
func TestOnStartDeadlinePerAttempt(t *testing.T) {
	type start struct {
		rerun, attempt int
	}
	perAttempt := func(starts *[]start) retry.Hooks {
		return retry.Hooks{OnStart: func(p retry.StartParams) context.Context {
			*starts = append(*starts, start{p.Rerun, p.Envelope.Attempt})
			ctx, cancel := context.WithTimeout(p.Context, time.Second)
			_ = cancel // released when the timeout fires; the test's bubble checks nothing leaks
			return ctx
		}}
	}
	handler := func(errs *[]error, calls *int) retry.Handler {
		return func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
			*calls++
			*errs = append(*errs, ctx.Err())
			if *calls < 3 {
				return errBoom
			}
			return nil
		}
	}
	t.Run("queue: immediate retries", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var errs []error
			var starts []start
			calls := 0
			// ImmediateDelay is longer than the deadline: an attempt that reused the first one's
			// context would start with it expired.
			b, r, p := bubbleProcessor(t, handler(&errs, &calls),
				&retry.Options{ImmediateRetries: 2, ImmediateDelay: 5 * time.Second, Hooks: perAttempt(&starts)})
			b.Send(sampleMessage())
			res := p.Process(t.Context(), r, receiveNow(t, r))
			assert.Equal(t, retry.OutcomeCompleted, res.Outcome)
			assert.Equal(t, []error{nil, nil, nil}, errs, "every attempt starts with a live context")
			assert.Equal(t, []start{{0, 1}, {1, 2}, {2, 3}}, starts)
		})
	})
	t.Run("session: retries held in place", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var errs []error
			var starts []start
			calls := 0
			b := newSessionBroker(t, nil)
			sendSession(t, b, "s", 1)
			sc := newSessionConsumer(t, b, handler(&errs, &calls), nil,
				&retry.Options{Backoff: backoff.Constant{Interval: 5 * time.Second}, Hooks: perAttempt(&starts)}, nil)
			stop := runSessionConsumer(t, sc)
			waitFor(t, b, func() bool { return len(b.Completed()) == 1 })
			require.NoError(t, stop())
			assert.Equal(t, []error{nil, nil, nil}, errs, "every attempt starts with a live context")
			assert.Equal(t, []start{{0, 1}, {1, 2}, {2, 3}}, starts)
		})
	})
}
