package retry_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
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

func TestDefaultReconnectDelaysCannotBeChangedByCallers(t *testing.T) {
	d := retry.DefaultReconnectDelays()
	d[0] = time.Hour
	assert.Equal(t, 5*time.Second, retry.DefaultReconnectDelays()[0])
}

// A handler that ignores its context must not make Run hang: after ShutdownGrace plus one
// SettleTimeout, Run closes the connection and says how many handlers were left; nothing is settled
// after that, and the message comes back when its lock expires.
func TestShutdownIsBoundedWhenAHandlerIgnoresItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		sendN(b, 1)
		release := make(chan struct{})
		started := make(chan struct{})
		c, err := retry.NewConsumer(b.Connector(), func(context.Context, *azservicebus.ReceivedMessage) error {
			close(started)
			<-release // ignores ctx
			return nil
		}, &retry.Options{ShutdownGrace: time.Second, SettleTimeout: 2 * time.Second, Logger: discardLogger()})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- c.Run(ctx) }()
		<-started
		cancel()
		err = <-done
		assert.Equal(t, 3*time.Second, time.Since(start), "grace plus one settle timeout")
		var se *retry.ShutdownError
		require.ErrorAs(t, err, &se)
		assert.Equal(t, 1, se.Running)
		assert.ErrorIs(t, err, retry.ErrShutdownTimeout)
		close(release) // the handler finally returns: it must not settle anything
		synctest.Wait()
		assert.Empty(t, b.Completed())
		<-time.After(retrytest.DefaultLockDuration)
		assert.Equal(t, 1, b.Stats().Active, "the broker redelivers it")
	})
}

// fakeLink wraps a retrytest connection: its receives can be made to return (nil, nil) at once, as the
// SDK does after it hit a link or connection error, and its Ping can fail or hang.
type fakeLink struct {
	retry.Receiver
	swallow atomic.Bool // receives return (nil, nil) at once
}

func (f *fakeLink) ReceiveMessages(ctx context.Context, n int, o *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if f.swallow.Load() {
		return nil, nil
	}
	return f.Receiver.ReceiveMessages(ctx, n, o)
}

// linkConnector builds fakeLink connections on b with ping as their probe, and counts connects.
type linkConnector struct {
	b        *retrytest.Broker
	ping     func(ctx context.Context) error
	swallow  atomic.Bool
	connects atomic.Int32
	pings    atomic.Int32
}

func (lc *linkConnector) connect(ctx context.Context) (*retry.Connection, error) {
	conn, err := lc.b.Connector()(ctx)
	if err != nil {
		return nil, err
	}
	lc.connects.Add(1)
	link := &fakeLink{Receiver: conn.Receiver}
	link.swallow.Store(lc.swallow.Load())
	conn.Receiver = link
	conn.Ping = func(ctx context.Context) error {
		lc.pings.Add(1)
		return lc.ping(ctx)
	}
	return conn, nil
}

// The SDK hides a dropped link from ReceiveMessages: it returns no messages and no error. Before, that
// also reset the failure count, so a consumer whose namespace was gone stayed "running" and looped.
// Now each such return is followed by a probe; a failing probe breaks the connection, and the
// reconnects follow the documented schedule: 5 s, 10 s, 15 s, then every 60 s.
func TestSwallowedLinkErrorsAreProbedAndFollowTheSchedule(t *testing.T) {
	for name, ping := range map[string]func(context.Context) error{
		// The namespace is gone: the probe fails.
		"probe fails": func(context.Context) error { return errors.New("connection refused") },
		// The link keeps dropping although the management link answers: a flapping connection.
		"probe succeeds, link flaps": func(context.Context) error { return nil },
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				lc := &linkConnector{b: newBroker(t, nil, nil), ping: ping}
				lc.swallow.Store(true)
				c, err := retry.NewConsumer(lc.connect, okHandler, &retry.Options{Logger: discardLogger()})
				require.NoError(t, err)
				stop := runConsumer(t, c)
				synctest.Wait()
				assert.False(t, c.Health().Ready(), "never ready on a connection whose link keeps failing")
				<-time.After(3 * time.Minute)
				synctest.Wait()
				h := c.Health()
				assert.Equal(t, retry.StateWatchdog, h.State)
				assert.NotEmpty(t, h.LastError)
				// Connects at 0, 5, 15, 30, then the watchdog at 90 and 150 s.
				assert.Equal(t, int32(6), lc.connects.Load(), "no tight loop")
				require.NoError(t, stop())
			})
		})
	}
}

// A quiet healthy connection is probed every few seconds and stays ready; a probe that hangs (a broker
// that stopped answering) makes the consumer not ready within 15 s, and it recovers when the broker
// answers again.
func TestIdleProbeDetectsAHungBroker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hung atomic.Bool
		lc := &linkConnector{b: newBroker(t, nil, nil), ping: func(ctx context.Context) error {
			if hung.Load() {
				<-ctx.Done()
				return ctx.Err()
			}
			return nil
		}}
		c, err := retry.NewConsumer(lc.connect, okHandler, &retry.Options{Logger: discardLogger()})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		<-time.After(time.Minute)
		synctest.Wait()
		assert.True(t, c.Health().Ready(), "quiet but healthy")
		assert.GreaterOrEqual(t, lc.pings.Load(), int32(10), "probed while idle")
		assert.Equal(t, int32(1), lc.connects.Load())

		hung.Store(true)
		died := time.Now()
		for c.Health().Ready() {
			<-time.After(100 * time.Millisecond)
		}
		assert.LessOrEqual(t, time.Since(died), 15*time.Second, "not ready within 15 s of the broker hanging")
		assert.Contains(t, c.Health().LastError, "probe")

		hung.Store(false)
		back := time.Now()
		for !c.Health().Ready() {
			<-time.After(100 * time.Millisecond)
		}
		assert.LessOrEqual(t, time.Since(back), retry.DefaultWatchdogInterval, "recovered within one watchdog interval")
		lc.b.Send(&azservicebus.Message{MessageID: strPtr("after")})
		synctest.Wait()
		assert.Equal(t, 1, lc.b.Stats().Succeeded)
		require.NoError(t, stop())
	})
}

// hangingCompletes makes CompleteMessage hang until its context ends for the messages named in it, as
// the SDK does when it retries the settle of a lock that died with its connection.
type hangingCompletes struct {
	retry.Receiver
	hang map[string]bool
	mu   sync.Mutex
}

func (h *hangingCompletes) CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.CompleteMessageOptions) error {
	h.mu.Lock()
	hang := h.hang[m.MessageID]
	delete(h.hang, m.MessageID)
	h.mu.Unlock()
	if hang {
		<-ctx.Done()
		return ctx.Err()
	}
	return h.Receiver.CompleteMessage(ctx, m, o)
}

// A settle stuck on a dead lock must not hold a handler slot: before, every slot waited out its settle
// (up to SettleTimeout, 30 s) and no message was received. Now the next messages are handled at once,
// and the stuck message's redelivery completes without running the handler again.
func TestStuckSettleDoesNotFreezeTheConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hc := &hangingCompletes{hang: map[string]bool{"m-0": true}}
		b := newBroker(t, nil, &retrytest.BrokerOptions{LockDuration: 10 * time.Second, WrapReceiver: func(r retry.Receiver) retry.Receiver {
			hc.Receiver = r
			return hc
		}})
		var mu sync.Mutex
		calls := map[string]int{}
		var results []retry.Result
		c, err := retry.NewConsumer(b.Connector(), func(_ context.Context, m *azservicebus.ReceivedMessage) error {
			mu.Lock()
			calls[m.MessageID]++
			mu.Unlock()
			return nil
		}, &retry.Options{Logger: discardLogger(), Hooks: retry.Hooks{OnProcessed: func(p retry.ProcessedParams) {
			mu.Lock()
			results = append(results, p.Result)
			mu.Unlock()
		}}})
		require.NoError(t, err)
		sendN(b, 3)
		start := time.Now()
		stop := runConsumer(t, c)
		synctest.Wait()
		assert.Equal(t, 2, b.Stats().Succeeded, "m-1 and m-2 were handled while m-0's settle hung")
		assert.Zero(t, time.Since(start))

		// The broker loses m-0's lock (as when it died with a connection) and redelivers it.
		b.ExpireLocks()
		synctest.Wait()
		assert.Equal(t, 3, b.Stats().Succeeded)
		mu.Lock()
		assert.Equal(t, map[string]int{"m-0": 1, "m-1": 1, "m-2": 1}, calls, "finished work is not redone")
		inherited := 0
		for _, r := range results {
			if r.Inherited {
				inherited++
			}
		}
		assert.Equal(t, 1, inherited)
		mu.Unlock()
		require.NoError(t, stop())
	})
}

// No message runs in two handlers of one consumer at once: a redelivery that arrives while the first
// handler still runs (its lock was lost) waits for it, then applies its outcome.
func TestNoMessageRunsInTwoHandlersAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		var running, peak, calls atomic.Int32
		expired := make(chan struct{})
		c, err := retry.NewConsumer(b.Connector(), func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
			n := running.Add(1)
			defer running.Add(-1)
			if n > peak.Load() {
				peak.Store(n)
			}
			if calls.Add(1) == 1 {
				b.ExpireLocks() // the broker loses the lock and redelivers while this handler works
				close(expired)
				<-time.After(20 * time.Second) // finishes its work, ignoring ctx
			}
			return nil
		}, &retry.Options{MaxConcurrency: 4, Logger: discardLogger()})
		require.NoError(t, err)
		sendN(b, 1)
		stop := runConsumer(t, c)
		<-expired
		synctest.Wait()
		<-time.After(30 * time.Second)
		synctest.Wait()
		assert.Equal(t, int32(1), peak.Load(), "never two handlers for one message")
		assert.Equal(t, int32(1), calls.Load(), "the redelivery inherits the finished work")
		assert.Equal(t, 1, b.Stats().Succeeded)
		require.NoError(t, stop())
	})
}

// While every handler slot is busy with a long handler, nothing is received; the connection is still
// probed on the idle schedule, so an outage makes the consumer not ready within 15 s.
func TestOutageNoticedWhileAllSlotsAreBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var dead atomic.Bool
		lc := &linkConnector{b: newBroker(t, nil, nil), ping: func(context.Context) error {
			if dead.Load() {
				return errors.New("connection refused")
			}
			return nil
		}}
		c, err := retry.NewConsumer(lc.connect, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
			select {
			case <-time.After(40 * time.Second):
			case <-ctx.Done():
			}
			return nil
		}, &retry.Options{Logger: discardLogger()})
		require.NoError(t, err)
		sendN(lc.b, 1)
		stop := runConsumer(t, c)
		<-time.After(time.Second) // the one slot is busy with the 40 s handler
		dead.Store(true)
		died := time.Now()
		for c.Health().Ready() && time.Since(died) < 30*time.Second {
			<-time.After(100 * time.Millisecond)
		}
		assert.LessOrEqual(t, time.Since(died), 15*time.Second, "not ready within 15 s although the slot is busy")
		require.NoError(t, stop())
	})
}

// slowSettler passes completes through after a delay unless their context ends first, and records when
// each reached the broker.
type slowSettler struct {
	retry.Receiver
	delay   time.Duration
	mu      sync.Mutex
	reached []time.Time
	ended   []error
}

func (s *slowSettler) CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.CompleteMessageOptions) error {
	select {
	case <-ctx.Done():
		s.mu.Lock()
		s.ended = append(s.ended, ctx.Err())
		s.mu.Unlock()
		return ctx.Err()
	case <-time.After(s.delay):
	}
	s.mu.Lock()
	s.reached = append(s.reached, time.Now())
	s.mu.Unlock()
	return s.Receiver.CompleteMessage(ctx, m, o)
}

// A settle call already in flight when Run gives up on the shutdown is ended then, not left to reach
// the broker after Run returned (the connection's Close need not abort it).
func TestShutdownThatGivesUpEndsTheSettleInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		sendN(b, 1)
		started := make(chan struct{})
		settler := &slowSettler{delay: 1500 * time.Millisecond}
		connect := func(ctx context.Context) (*retry.Connection, error) {
			conn, err := b.Connector()(ctx)
			if err != nil {
				return nil, err
			}
			settler.Receiver = conn.Receiver
			conn.Receiver = settler
			conn.Close = func(context.Context) error { return nil } // a Close that aborts nothing
			return conn, nil
		}
		c, err := retry.NewConsumer(connect, func(context.Context, *azservicebus.ReceivedMessage) error {
			close(started)
			<-time.After(2500 * time.Millisecond) // ignores ctx; returns after the grace, within the settle timeout
			return nil
		}, &retry.Options{ShutdownGrace: time.Second, SettleTimeout: 2 * time.Second, Logger: discardLogger()})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		<-started
		start := time.Now()
		cancel()
		err = <-done
		assert.Equal(t, 3*time.Second, time.Since(start), "grace plus one settle timeout")
		require.ErrorIs(t, err, retry.ErrShutdownTimeout)
		<-time.After(time.Minute)
		synctest.Wait()
		settler.mu.Lock()
		defer settler.mu.Unlock()
		assert.Empty(t, settler.reached, "nothing reaches the broker after Run returned")
		require.Len(t, settler.ended, 1, "the complete in flight was ended")
		assert.ErrorIs(t, settler.ended[0], context.Canceled)
		assert.Empty(t, b.Completed())
	})
}

// timedCompletes never answers a complete until its context ends, and records how long it waited.
type timedCompletes struct {
	retry.Receiver
	mu     sync.Mutex
	waited []time.Duration
	errs   []error
}

func (h *timedCompletes) CompleteMessage(ctx context.Context, _ *azservicebus.ReceivedMessage, _ *azservicebus.CompleteMessageOptions) error {
	start := time.Now()
	<-ctx.Done()
	h.mu.Lock()
	h.waited = append(h.waited, time.Since(start))
	h.errs = append(h.errs, ctx.Err())
	h.mu.Unlock()
	return ctx.Err()
}

// The consumer's settle calls end at the settle timeout (one timer serves all of them), several at
// once included, and the messages are left for redelivery.
func TestConsumerSettleCallsAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hang := &timedCompletes{}
		b := newBroker(t, nil, &retrytest.BrokerOptions{WrapReceiver: func(r retry.Receiver) retry.Receiver {
			hang.Receiver = r
			return hang
		}})
		sendN(b, 3)
		var left atomic.Int32
		c, err := retry.NewConsumer(b.Connector(), okHandler, &retry.Options{
			SettleTimeout: 20 * time.Second, DisableLockRenewal: true, Logger: discardLogger(),
			Hooks: retry.Hooks{OnProcessed: func(p retry.ProcessedParams) {
				if p.Result.Outcome == retry.OutcomeLeftForRedelivery {
					left.Add(1)
				}
			}},
		})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		<-time.After(25 * time.Second)
		synctest.Wait()
		hang.mu.Lock()
		require.Len(t, hang.waited, 3)
		for i, w := range hang.waited {
			assert.Equal(t, 20*time.Second, w, "call %d", i)
			assert.ErrorIs(t, hang.errs[i], context.DeadlineExceeded)
		}
		hang.mu.Unlock()
		assert.Equal(t, int32(3), left.Load())
		require.NoError(t, stop())
	})
}

// A connection that delivers a message every 3 s is never idle for the 5 s window, so it is never
// probed; once the messages stop, the probe comes 5 s after the last one (the window's timer is not
// moved per message, so this checks that it re-arms for what is left).
func TestIdleWindowRestartsWithEachMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lc := &linkConnector{b: newBroker(t, nil, nil), ping: func(context.Context) error { return nil }}
		var probedAt atomic.Int64
		start := time.Now()
		ping := lc.ping
		lc.ping = func(ctx context.Context) error {
			probedAt.CompareAndSwap(0, int64(time.Since(start)))
			return ping(ctx)
		}
		c, err := retry.NewConsumer(lc.connect, okHandler, &retry.Options{Logger: discardLogger()})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		for i := range 10 {
			<-time.After(3 * time.Second)
			lc.b.Send(&azservicebus.Message{MessageID: strPtr(fmt.Sprintf("tick-%d", i))})
			synctest.Wait()
		}
		assert.Zero(t, lc.pings.Load(), "never idle for the window while messages keep coming")
		<-time.After(6 * time.Second)
		synctest.Wait()
		require.Equal(t, int32(1), lc.pings.Load(), "probed once the messages stopped")
		assert.Equal(t, 35*time.Second, time.Duration(probedAt.Load()), "5 s after the last message")
		require.NoError(t, stop())
	})
}

// A connection whose settings cannot be read is reported, not skipped in silence: one warning in
// Health naming the entity and the error, and a warning in the log.
func TestUnreadableSettingsAreAWarning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		var logs bytes.Buffer
		connect := func(ctx context.Context) (*retry.Connection, error) {
			conn, err := b.Connector()(ctx)
			if conn != nil {
				conn.EntityPath = "orders"
				conn.Settings = func(context.Context, time.Duration) ([]string, error) {
					return nil, errors.New("administration API at https://ns.example/ unreachable")
				}
			}
			return conn, err
		}
		c, err := retry.NewConsumer(connect, okHandler, &retry.Options{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		synctest.Wait()
		ws := c.Health().Warnings
		require.NoError(t, stop())
		require.Len(t, ws, 1)
		assert.True(t, strings.HasPrefix(ws[0], "orders: settings not checked"), ws[0])
		assert.Contains(t, ws[0], "https://ns.example/")
		assert.Contains(t, logs.String(), "level=WARN")
		assert.Contains(t, logs.String(), "entity=orders")
		assert.Contains(t, logs.String(), "https://ns.example/")
	})
}
