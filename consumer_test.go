package retry_test

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/retrytest"
)

func TestConsumerConcurrencyBound(t *testing.T) {
	for _, limit := range []int{1, 3, 8} {
		t.Run(fmt.Sprintf("max %d", limit), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const total = 40
				var running, peak atomic.Int32
				var mu sync.Mutex
				seen := map[string]int{}
				b := newBroker(t, nil, nil)
				sendN(b, total)
				c, err := retry.NewConsumer(b.Connector(), func(context.Context, *azservicebus.ReceivedMessage) error {
					n := running.Add(1)
					for {
						p := peak.Load()
						if n <= p || peak.CompareAndSwap(p, n) {
							break
						}
					}
					<-time.After(time.Second)
					running.Add(-1)
					return nil
				}, &retry.Options{MaxConcurrency: limit, ReceiveBatchSize: 5, Logger: discardLogger(),
					Hooks: retry.Hooks{OnProcessed: func(p retry.ProcessedParams) {
						mu.Lock()
						seen[p.Message.MessageID]++
						mu.Unlock()
					}}})
				require.NoError(t, err)
				stop := runConsumer(t, c)
				require.NoError(t, b.WaitUntil(t.Context(), func() bool { return len(b.Completed()) == total }))
				require.NoError(t, stop())
				assert.Equal(t, int32(limit), peak.Load(), "never more than MaxConcurrency, and uses all of it")
				assert.Len(t, seen, total)
				for id, n := range seen {
					assert.Equal(t, 1, n, id)
				}
				h := c.Health()
				assert.Equal(t, uint64(total), h.Completed)
				assert.Equal(t, retry.StateStopped, h.State)
				assert.Equal(t, 0, h.InFlight)
			})
		})
	}
}

func TestConsumerRetriesThenDeadLetters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, &retrytest.BrokerOptions{DuplicateDetection: true})
		b.Send(&azservicebus.Message{MessageID: strPtr("poison"), Body: []byte("x")})
		var attempts []time.Duration
		start := time.Now()
		c, err := retry.NewConsumer(b.Connector(), func(context.Context, *azservicebus.ReceivedMessage) error {
			attempts = append(attempts, time.Since(start))
			return errBoom
		}, &retry.Options{MaxAttempts: 4, Logger: discardLogger()})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		require.NoError(t, b.WaitUntil(t.Context(), func() bool { return len(b.DeadLettered()) == 1 }))
		require.NoError(t, stop())
		// Attempts at 0, +10 s, +10 s, +20 s (Fibonacci{}).
		assert.Equal(t, []time.Duration{0, 10 * time.Second, 20 * time.Second, 40 * time.Second}, attempts)
		h := c.Health()
		assert.Equal(t, uint64(3), h.RetriesScheduled)
		assert.Equal(t, uint64(1), h.DeadLettered)
	})
}

// The handler's context derives from the worker's values without registering with the worker's
// context: Run's values and the envelope must still reach it, and the shutdown's cancellation too, for
// every handler a worker runs (not only the first).
func TestHandlerContextCarriesRunValuesAndShutdown(t *testing.T) {
	type runKey struct{}
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		sendN(b, 5)
		var seen []any
		var attempts []int
		var cause error
		last := make(chan struct{})
		c, err := retry.NewConsumer(b.Connector(), func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
			seen = append(seen, ctx.Value(runKey{}))
			env, _ := envelope.FromContext(ctx)
			attempts = append(attempts, env.Attempt)
			if m.MessageID != "m-4" {
				return nil
			}
			close(last)
			<-ctx.Done()
			cause = context.Cause(ctx)
			return cause
		}, &retry.Options{MaxConcurrency: 1, Logger: discardLogger()})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.WithValue(t.Context(), runKey{}, "run-value"))
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		<-last
		cancel()
		require.NoError(t, <-done)
		assert.Equal(t, []any{"run-value", "run-value", "run-value", "run-value", "run-value"}, seen)
		assert.Equal(t, []int{1, 1, 1, 1, 1}, attempts)
		assert.ErrorIs(t, cause, retry.ErrShutdown, "the shutdown's cause")
		assert.ErrorIs(t, cause, context.Canceled, "a cancellation still")
		assert.Len(t, b.Completed(), 4)
		assert.Equal(t, 1, b.Stats().Locked, "the handler cancelled by the shutdown left its message for redelivery")
	})
}

func TestRunTwiceAndRunAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		c, err := retry.NewConsumer(b.Connector(), okHandler, &retry.Options{Logger: discardLogger()})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		synctest.Wait()
		assert.ErrorIs(t, c.Run(t.Context()), retry.ErrAlreadyRunning)
		require.NoError(t, stop())
		stop = runConsumer(t, c)
		synctest.Wait()
		assert.Equal(t, retry.StateRunning, c.Health().State)
		require.NoError(t, stop())
	})
}

func TestNewConsumerRejectsBadInput(t *testing.T) {
	b := newBroker(t, nil, nil)
	cases := []struct {
		name    string
		connect retry.Connector
		handler retry.Handler
		opts    *retry.Options
	}{
		{"nil connector", nil, okHandler, nil},
		{"nil handler", b.Connector(), nil, nil},
		{"negative concurrency", b.Connector(), okHandler, &retry.Options{MaxConcurrency: -1}},
		{"negative attempts", b.Connector(), okHandler, &retry.Options{MaxAttempts: -1}},
		{"negative settle timeout", b.Connector(), okHandler, &retry.Options{SettleTimeout: -time.Second}},
		{"negative reconnect delay", b.Connector(), okHandler, &retry.Options{ReconnectDelays: []time.Duration{time.Second, -1}}},
		{"negative watchdog", b.Connector(), okHandler, &retry.Options{WatchdogInterval: -1}},
		{"negative budget", b.Connector(), okHandler, &retry.Options{RetryBudget: -1}},
		{"bad backoff", b.Connector(), okHandler, &retry.Options{Backoff: backoff.Exponential{Factor: 0.1}}},
		{"batch above the SDK limit", b.Connector(), okHandler, &retry.Options{ReceiveBatchSize: 5001}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := retry.NewConsumer(tc.connect, tc.handler, tc.opts)
			assert.Nil(t, c)
			assert.ErrorIs(t, err, retry.ErrInvalidOptions)
		})
	}
	c, err := retry.NewConsumer(b.Connector(), okHandler, nil)
	require.NoError(t, err)
	assert.Equal(t, retry.StateIdle, c.Health().State)
	_, err = retry.NewConsumer(b.Connector(), okHandler, &retry.Options{MaxConcurrency: 20000})
	assert.NoError(t, err, "a large MaxConcurrency is fine: receives are capped at the SDK limit")
}

// libraryGoroutines counts the goroutines running the library's code (other tests' timers may come and
// go in the same process).
func libraryGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "github.com/sbretry/retry.(") {
			count++
		}
	}
	return count
}

// The consumer runs at most one goroutine per message in flight plus a constant: each message runs in
// a goroutine of its own, and a lock waits for its renewal on a runtime timer, not in a goroutine.
func TestGoroutinesStayWithinInFlightPlusAConstant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit, total, constant = 8, 40, 6
		release := make(chan struct{})
		var running atomic.Int32
		b := newBroker(t, nil, nil)
		sendN(b, total)
		c, err := retry.NewConsumer(b.Connector(), func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
			running.Add(1)
			defer running.Add(-1)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		}, &retry.Options{MaxConcurrency: limit, Logger: discardLogger()})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		synctest.Wait()
		require.Equal(t, int32(limit), running.Load())
		<-time.After(3 * time.Minute) // long enough for every lock to be renewed several times
		synctest.Wait()
		inFlight := c.Health().InFlight
		t.Logf("in flight %d, running %d, library goroutines %d", inFlight, running.Load(), libraryGoroutines())
		assert.LessOrEqual(t, libraryGoroutines(), inFlight+constant,
			"goroutines with %d messages in flight", inFlight)

		close(release)
		require.NoError(t, b.WaitUntil(t.Context(), func() bool { return len(b.Completed()) == total }))
		synctest.Wait()
		// Idle workers are kept up to the slots of both kinds: MaxConcurrency plus the 64 settles the
		// consumer lets run beyond it.
		t.Logf("after the drain: library goroutines %d", libraryGoroutines())
		assert.LessOrEqual(t, libraryGoroutines(), limit+64+constant, "idle workers are bounded")
		require.NoError(t, stop())
		synctest.Wait()
		assert.Zero(t, libraryGoroutines(), "Run leaves nothing behind")
	})
}

// Messages run on long-lived workers: draining a queue starts a handful of goroutines, not one per
// message.
func TestWorkersAreReused(t *testing.T) {
	const total = 3000
	b := newBroker(t, nil, nil)
	sendN(b, total)
	c, err := retry.NewConsumer(b.Connector(), okHandler, &retry.Options{MaxConcurrency: 4, Logger: discardLogger()})
	require.NoError(t, err)
	sample := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(sample)
	before := sample[0].Value.Uint64()
	stop := runConsumer(t, c)
	require.NoError(t, b.WaitUntil(t.Context(), func() bool { return len(b.Completed()) == total }))
	require.NoError(t, stop())
	metrics.Read(sample)
	created := sample[0].Value.Uint64() - before
	t.Logf("%d goroutines created for %d messages", created, total)
	// Other tests' timers firing meanwhile start goroutines too; one per message would be 3,000.
	assert.Less(t, created, uint64(total/10), "goroutines created while draining (one per message would be %d)", total)
}

func TestZeroValueConsumerAndProcessor(t *testing.T) {
	var c retry.Consumer
	assert.ErrorIs(t, c.Run(t.Context()), retry.ErrNotConfigured)
	var nilConsumer *retry.Consumer
	assert.ErrorIs(t, nilConsumer.Run(t.Context()), retry.ErrNotConfigured)
	assert.Equal(t, retry.State(0), nilConsumer.Health().State)
	var p retry.Processor
	res := p.Process(t.Context(), nopSettler{}, &azservicebus.ReceivedMessage{})
	assert.ErrorIs(t, res.SettleErr, retry.ErrNotConfigured)
}
