package retry_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	"github.com/sbretry/retry/retrytest"
)

// runConsumer starts c.Run in the bubble and returns a stop function that cancels it and waits.
func runConsumer(t *testing.T, c *retry.Consumer) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return func() error {
		cancel()
		return <-done
	}
}

// newBroker is retrytest.New for a test's fixed options: an error fails the test.
func newBroker(t testing.TB, clk retry.Clock, opts *retrytest.BrokerOptions) *retrytest.Broker {
	t.Helper()
	b, err := retrytest.New(clk, opts)
	require.NoError(t, err)
	return b
}

func sendN(b *retrytest.Broker, n int) {
	for i := range n {
		b.Send(&azservicebus.Message{MessageID: strPtr(fmt.Sprintf("m-%d", i)), Body: []byte("x")})
	}
}

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

func TestHugeConcurrencyReceivesWithinTheSDKLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		sendN(b, 3)
		c, err := retry.NewConsumer(b.Connector(), okHandler, &retry.Options{MaxConcurrency: 6000, Logger: discardLogger()})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		synctest.Wait()
		require.NoError(t, stop())
		assert.Len(t, b.Completed(), 3)
		assert.Zero(t, c.Health().ReceiveFailures, "a batch above 5000 would be refused on every call")
	})
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

// event is one connector or receive call, with the bubble time it happened at.
type event struct {
	what string
	at   time.Duration
}

// recorder wraps a broker's connector to log connects and receives in order.
type recorder struct {
	mu     sync.Mutex
	start  time.Time
	events []event
}

func (r *recorder) add(what string) {
	r.mu.Lock()
	r.events = append(r.events, event{what, time.Since(r.start)})
	r.mu.Unlock()
}

func (r *recorder) snapshot() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]event(nil), r.events...)
}

func (r *recorder) connector(b *retrytest.Broker) retry.Connector {
	inner := b.Connector()
	return func(ctx context.Context) (*retry.Connection, error) {
		conn, err := inner(ctx)
		if err != nil {
			r.add("connect-failed")
			return nil, err
		}
		r.add("connect")
		conn.Receiver = &recordingReceiver{Receiver: conn.Receiver, r: r}
		return conn, nil
	}
}

type recordingReceiver struct {
	retry.Receiver
	r *recorder
}

func (rr *recordingReceiver) ReceiveMessages(ctx context.Context, n int, o *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	msgs, err := rr.Receiver.ReceiveMessages(ctx, n, o)
	switch {
	case err != nil && ctx.Err() == nil:
		rr.r.add("receive-failed")
	case err == nil:
		rr.r.add("receive")
	}
	return msgs, err
}

func TestReconnectThenWatchdog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		rec := &recorder{start: time.Now()}
		var states []retry.State
		var smu sync.Mutex
		c, err := retry.NewConsumer(rec.connector(b), okHandler, &retry.Options{Logger: discardLogger(),
			Hooks: retry.Hooks{OnStateChange: func(p retry.StateChangeParams) {
				smu.Lock()
				states = append(states, p.To)
				smu.Unlock()
			}}})
		require.NoError(t, err)

		stop := runConsumer(t, c)
		synctest.Wait() // connected and waiting for messages
		assert.Equal(t, retry.StateRunning, c.Health().State)
		// The receive fails; then 5 connects fail: 3 reconnect tries and 2 watchdog ticks.
		b.Fail(retrytest.OpConnect, 5, errors.New("namespace unreachable"))
		b.Fail(retrytest.OpReceive, 1, retrytest.ErrConnectionLost)
		<-time.After(150*time.Second + time.Millisecond)
		synctest.Wait()
		assert.Equal(t, retry.StateWatchdog, c.Health().State)
		b.Send(&azservicebus.Message{MessageID: strPtr("after"), Body: []byte("x")})
		<-time.After(60 * time.Second)
		synctest.Wait()
		require.Len(t, b.Completed(), 1)
		assert.Equal(t, retry.StateRunning, c.Health().State)

		want := []event{
			{"connect", 0},
			{"receive-failed", 0},
			{"connect-failed", 5 * time.Second},
			{"connect-failed", 15 * time.Second},
			{"connect-failed", 30 * time.Second},
			{"connect-failed", 90 * time.Second}, // the watchdog: every 60 s
			{"connect-failed", 150 * time.Second},
			{"connect", 210 * time.Second},
			{"receive", 210 * time.Second}, // the connector ran before receiving resumed
		}
		assert.Equal(t, want, rec.snapshot())
		require.NoError(t, stop())
		h := c.Health()
		assert.Equal(t, uint64(5), h.ConnectFailures)
		assert.Equal(t, uint64(1), h.ReceiveFailures)
		assert.Equal(t, uint64(2), h.Connects)
		assert.Contains(t, h.LastError, "namespace unreachable")
		smu.Lock()
		assert.Equal(t, []retry.State{retry.StateConnecting, retry.StateRunning, retry.StateReconnecting, retry.StateWatchdog, retry.StateRunning, retry.StateDraining, retry.StateStopped}, states)
		smu.Unlock()
	})
}

func TestWatchdogIsSingleAndResetsAfterSuccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		rec := &recorder{start: time.Now()}
		c, err := retry.NewConsumer(rec.connector(b), okHandler, &retry.Options{Logger: discardLogger()})
		require.NoError(t, err)
		// Receive fails; 3 reconnect tries fail; the watchdog's first try connects but the receive
		// fails again: that second failure must not start a second watchdog nor restart the 5 s tries.
		stop := runConsumer(t, c)
		synctest.Wait()
		b.Fail(retrytest.OpConnect, 3, nil)
		b.Fail(retrytest.OpReceive, 2, retrytest.ErrConnectionLost)
		<-time.After(300 * time.Second)
		synctest.Wait()
		want := []event{
			{"connect", 0},
			{"receive-failed", 0},
			{"connect-failed", 5 * time.Second},
			{"connect-failed", 15 * time.Second},
			{"connect-failed", 30 * time.Second},
			{"connect", 90 * time.Second},
			{"receive-failed", 90 * time.Second},
			{"connect", 150 * time.Second}, // one watchdog tick later, not 5 s later
		}
		got := rec.snapshot()
		assert.Equal(t, want, got, "no further connects once receiving works")

		// After a success the schedule starts over at 5 s.
		b.Send(&azservicebus.Message{MessageID: strPtr("wake"), Body: []byte("x")})
		synctest.Wait()
		b.Fail(retrytest.OpReceive, 1, retrytest.ErrConnectionLost)
		<-time.After(5 * time.Second)
		synctest.Wait()
		got = rec.snapshot()
		assert.Equal(t, []event{{"receive", 300 * time.Second}, {"receive-failed", 300 * time.Second}, {"connect", 305 * time.Second}}, got[len(want):])
		require.NoError(t, stop())
	})
}

func TestCancelDuringWatchdogStopsPromptly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		b.Fail(retrytest.OpConnect, 1000, nil)
		c, err := retry.NewConsumer(b.Connector(), okHandler, &retry.Options{Logger: discardLogger()})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		<-time.After(100 * time.Second)
		synctest.Wait()
		assert.Equal(t, retry.StateWatchdog, c.Health().State)
		before := time.Now()
		require.NoError(t, stop())
		assert.Zero(t, time.Since(before), "no waiting for the next watchdog tick")
		assert.Equal(t, retry.StateStopped, c.Health().State)
	})
}

func TestBrokenConnectionIsClosedNotReused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		connect, conns := trackingConnector(b)
		c, err := retry.NewConsumer(connect, okHandler, &retry.Options{Logger: discardLogger()})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		synctest.Wait()
		b.Fail(retrytest.OpReceive, 1, retrytest.ErrConnectionLost)
		<-time.After(6 * time.Second)
		synctest.Wait()
		require.Len(t, *conns, 2, "a fresh connection after the failure")
		assert.True(t, (*conns)[0].closed.Load(), "the broken one is closed")
		assert.False(t, (*conns)[1].closed.Load())
		require.NoError(t, stop())
		assert.True(t, (*conns)[1].closed.Load(), "Run closes the live one when it returns")
	})
}

// trackingConnector wraps b's connector so the test can see every connection it built and whether
// each was closed. The slice is only touched by the consumer's loop and, after synctest.Wait, the test.
func trackingConnector(b *retrytest.Broker) (retry.Connector, *[]*closeTracker) {
	var conns []*closeTracker
	inner := b.Connector()
	return func(ctx context.Context) (*retry.Connection, error) {
		conn, err := inner(ctx)
		if err != nil {
			return nil, err
		}
		tr := &closeTracker{inner: conn.Close}
		conn.Close = tr.close
		conns = append(conns, tr)
		return conn, nil
	}, &conns
}

type closeTracker struct {
	inner  func(context.Context) error
	closed atomic.Bool
}

func (c *closeTracker) close(ctx context.Context) error {
	c.closed.Store(true)
	return c.inner(ctx)
}

func TestShutdownDrainsInFlightHandlers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		sendN(b, 2)
		started := make(chan struct{}, 2)
		c, err := retry.NewConsumer(b.Connector(), func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
			started <- struct{}{}
			if m.MessageID == "m-0" {
				<-time.After(3 * time.Second) // finishes inside the grace period, ignoring ctx
				return nil
			}
			<-ctx.Done() // waits for cancellation after the grace period
			return ctx.Err()
		}, &retry.Options{MaxConcurrency: 2, ShutdownGrace: 10 * time.Second, Logger: discardLogger()})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		<-started
		<-started
		before := time.Now()
		require.NoError(t, stop())
		assert.Equal(t, 10*time.Second, time.Since(before), "Run waited for the grace period, no longer")
		require.Len(t, b.Completed(), 1, "the handler that succeeded was completed")
		assert.Equal(t, "m-0", b.Completed()[0].MessageID)
		assert.Empty(t, b.Scheduled(), "the cancelled handler's failure is not retried")
		assert.Empty(t, b.DeadLettered())
		assert.Equal(t, 1, b.Stats().Locked, "left locked for the broker to redeliver")
		assert.Equal(t, uint64(1), c.Health().LeftForRedelivery)
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
			env, _ := retry.EnvelopeFromContext(ctx)
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
		assert.ErrorIs(t, cause, context.Canceled, "the shutdown's cause")
		assert.Len(t, b.Completed(), 4)
		assert.Equal(t, 1, b.Stats().Locked, "the handler cancelled by the shutdown left its message for redelivery")
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

func TestConnectErrorsAreRedacted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf lockedWriter
		buf.w = new(bytes.Buffer)
		calls := 0
		connect := func(context.Context) (*retry.Connection, error) {
			calls++
			return nil, errors.New("bad connection string Endpoint=sb://x/;SharedAccessKeyName=k;SharedAccessKey=hunter2")
		}
		c, err := retry.NewConsumer(connect, okHandler, &retry.Options{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		synctest.Wait()
		require.NoError(t, stop())
		assert.Equal(t, 1, calls)
		assert.NotContains(t, c.Health().LastError, "hunter2")
		assert.Contains(t, c.Health().LastError, "REDACTED")
		assert.NotContains(t, buf.w.String(), "hunter2")
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
		{"bad backoff", b.Connector(), okHandler, &retry.Options{Backoff: retry.Exponential{Factor: 0.1}}},
		{"batch above the SDK limit", b.Connector(), okHandler, &retry.Options{ReceiveBatchSize: retry.MaxReceiveBatchSize + 1}},
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

func TestInFlightHandlerSettlesOnItsOwnConnectionAfterReconnect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		connect, conns := trackingConnector(b)
		started := make(chan struct{})
		c, err := retry.NewConsumer(connect, func(context.Context, *azservicebus.ReceivedMessage) error {
			close(started)
			<-time.After(10 * time.Second)
			return nil
		}, &retry.Options{MaxConcurrency: 2, Logger: discardLogger()})
		require.NoError(t, err)
		b.Send(&azservicebus.Message{MessageID: strPtr("slow"), Body: []byte("x")})
		stop := runConsumer(t, c)
		<-started
		synctest.Wait()
		b.Fail(retrytest.OpReceive, 1, retrytest.ErrConnectionLost) // the connection breaks mid-flight
		<-time.After(6 * time.Second)
		synctest.Wait()
		require.Len(t, *conns, 2, "reconnected while the handler still runs")
		assert.False(t, (*conns)[0].closed.Load(), "the old connection stays open for its in-flight handler")
		<-time.After(5 * time.Second)
		synctest.Wait()
		require.Len(t, b.Completed(), 1, "settled on the connection it was received on")
		assert.True(t, (*conns)[0].closed.Load(), "closed once its handler finished")
		require.NoError(t, stop())
	})
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

// With prefetching (the default), a message is received ahead of a free handler slot and waits for one
// with its lock renewed, so it is not redelivered however long the running handler takes; with
// Prefetch -1 it stays in the queue until a slot is free.
func TestPrefetchedMessagesWaitWithTheirLocksKept(t *testing.T) {
	for name, prefetch := range map[string]int{"prefetch on": 0, "prefetch off": -1} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t, nil, nil)
				sendN(b, 2)
				release := make(chan struct{})
				var mu sync.Mutex
				var deliveries []uint32
				c, err := retry.NewConsumer(b.Connector(), func(_ context.Context, m *azservicebus.ReceivedMessage) error {
					mu.Lock()
					deliveries = append(deliveries, m.DeliveryCount)
					first := len(deliveries) == 1
					mu.Unlock()
					if first {
						<-release
					}
					return nil
				}, &retry.Options{MaxConcurrency: 1, Prefetch: prefetch, Logger: discardLogger()})
				require.NoError(t, err)
				stop := runConsumer(t, c)
				<-time.After(3 * retrytest.DefaultLockDuration) // the first handler runs long; renewals keep it
				synctest.Wait()
				st := b.Stats()
				if prefetch < 0 {
					assert.Equal(t, 1, st.Active, "the second message stays in the queue")
				} else {
					assert.Equal(t, 0, st.Active, "the second message was received ahead")
					assert.Equal(t, 2, c.Health().InFlight)
				}
				close(release)
				require.NoError(t, b.WaitUntil(t.Context(), func() bool { return len(b.Completed()) == 2 }))
				require.NoError(t, stop())
				mu.Lock()
				defer mu.Unlock()
				assert.Equal(t, []uint32{1, 1}, deliveries, "neither was redelivered")
			})
		})
	}
}

// When Run stops, a message received ahead that has not started is not started any more: handlers in
// flight get the grace period, new ones do not. It is left for redelivery.
func TestShutdownStartsNoMessageReceivedAhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		sendN(b, 2)
		var started []string
		var mu sync.Mutex
		c, err := retry.NewConsumer(b.Connector(), func(_ context.Context, m *azservicebus.ReceivedMessage) error {
			mu.Lock()
			started = append(started, m.MessageID)
			mu.Unlock()
			<-time.After(20 * time.Second) // ignores ctx, within the grace
			return nil
		}, &retry.Options{MaxConcurrency: 1, Logger: discardLogger()})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		<-time.After(time.Second)
		synctest.Wait()
		require.Equal(t, 0, b.Stats().Active, "the second message was received ahead")
		start := time.Now()
		cancel()
		require.NoError(t, <-done)
		assert.Equal(t, 19*time.Second, time.Since(start), "Run waits for the handler in flight only")
		mu.Lock()
		assert.Equal(t, []string{"m-0"}, started, "the message received ahead is not started")
		mu.Unlock()
		assert.Len(t, b.Completed(), 1)
		<-time.After(retrytest.DefaultLockDuration)
		assert.Equal(t, 1, b.Stats().Active, "it comes back for redelivery")
	})
}

// hangingDeadLetters never answers a dead-letter until its context ends.
type hangingDeadLetters struct{ retry.Receiver }

func (hangingDeadLetters) DeadLetterMessage(ctx context.Context, _ *azservicebus.ReceivedMessage, _ *azservicebus.DeadLetterOptions) error {
	<-ctx.Done()
	return ctx.Err()
}

// Messages received ahead that never need a handler (here: invalid envelopes, whose dead-letters hang)
// trade their prefetch place for a settling slot, so what the consumer holds stays bounded by
// MaxConcurrency, Prefetch and the settle allowance, however many such messages the queue holds.
func TestMessagesReceivedAheadStayBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit = 2
		b := newBroker(t, nil, &retrytest.BrokerOptions{WrapReceiver: func(r retry.Receiver) retry.Receiver { return hangingDeadLetters{r} }})
		for i := range 300 {
			b.Send(&azservicebus.Message{MessageID: strPtr(fmt.Sprintf("bad-%d", i)), Body: []byte("x"),
				ApplicationProperties: map[string]any{retry.PropAttempt: "not a number"}})
		}
		c, err := retry.NewConsumer(b.Connector(), okHandler, &retry.Options{MaxConcurrency: limit, Logger: discardLogger()})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		<-time.After(5 * time.Second) // well within the settle timeout: every dead-letter still hangs
		synctest.Wait()
		inFlight := c.Health().InFlight
		t.Logf("held: %d", inFlight)
		assert.LessOrEqual(t, inFlight, limit+limit+(limit+64), "handler slots, prefetch places, settles")
		require.NoError(t, stop())
	})
}

// askingReceiver records how many messages each receive call asks for.
type askingReceiver struct {
	retry.Receiver
	asked chan int
}

func (r *askingReceiver) ReceiveMessages(ctx context.Context, n int, o *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	select {
	case r.asked <- n:
	default:
	}
	return r.Receiver.ReceiveMessages(ctx, n, o)
}

// By default a receive asks for every free handler slot and prefetch place at once (ReceiveBatchSize
// twice MaxConcurrency, Prefetch MaxConcurrency), except for a single handler, which asks for one (a
// receive that asks for more than is there waits for the rest); the options bound it.
func TestDefaultReceiveAsksForEverySlotAndPlace(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts retry.Options
		want int
	}{
		{"defaults", retry.Options{MaxConcurrency: 4}, 8},
		{"one handler", retry.Options{}, 1},
		{"no prefetching", retry.Options{MaxConcurrency: 4, Prefetch: -1}, 4},
		{"more prefetching", retry.Options{MaxConcurrency: 4, Prefetch: 6}, 8},
		{"more prefetching, larger batch", retry.Options{MaxConcurrency: 4, Prefetch: 6, ReceiveBatchSize: 20}, 10},
		{"smaller batch", retry.Options{MaxConcurrency: 4, ReceiveBatchSize: 3}, 3},
		{"no renewal, no prefetching", retry.Options{MaxConcurrency: 4, DisableLockRenewal: true}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				asked := make(chan int, 1)
				b := newBroker(t, nil, &retrytest.BrokerOptions{WrapReceiver: func(r retry.Receiver) retry.Receiver {
					return &askingReceiver{Receiver: r, asked: asked}
				}})
				opts := tc.opts
				opts.Logger = discardLogger()
				c, err := retry.NewConsumer(b.Connector(), okHandler, &opts)
				require.NoError(t, err)
				stop := runConsumer(t, c)
				assert.Equal(t, tc.want, <-asked, "the first receive, with every slot and place free")
				require.NoError(t, stop())
			})
		})
	}
}
