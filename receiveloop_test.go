package retry_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/retrytest"
)

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
				ApplicationProperties: map[string]any{envelope.PropAttempt: "not a number"}})
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
		assert.LessOrEqual(t, time.Since(back), 60*time.Second, "recovered within one watchdog interval")
		lc.b.Send(&azservicebus.Message{MessageID: strPtr("after")})
		synctest.Wait()
		assert.Equal(t, 1, lc.b.Stats().Succeeded)
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

// A consumer receives from several sources of one connection (a subscription and its retry queue) with
// one handler, one concurrency limit and one health: a failure on the subscription is scheduled to the
// retry queue, received from there, and keeps the subscription as its chain's source.
func TestConsumerReceivesFromEverySourceOfAConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, &retrytest.BrokerOptions{EntityPath: retry.SubscriptionPath("orders", "billing"), RetryQueue: "billing-retry", DuplicateDetection: true})
		var mu sync.Mutex
		var seen []envelope.Envelope
		var running, peak atomic.Int32
		c, err := retry.NewConsumer(b.Connector(), func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
			n := running.Add(1)
			defer running.Add(-1)
			if n > peak.Load() {
				peak.Store(n)
			}
			env, _ := envelope.FromContext(ctx)
			mu.Lock()
			seen = append(seen, env)
			mu.Unlock()
			<-time.After(time.Second)
			if env.Attempt == 1 {
				return errBoom
			}
			return nil
		}, &retry.Options{MaxConcurrency: 2, Logger: discardLogger()})
		require.NoError(t, err)
		sendN(b, 4)
		stop := runConsumer(t, c)
		<-time.After(time.Minute)
		synctest.Wait()
		st := b.Stats()
		assert.Equal(t, 4, st.Retried, "every first attempt failed and was completed after its copy")
		assert.Equal(t, 4, st.Scheduled, "the copies went to the retry queue")
		assert.Equal(t, 4, st.Succeeded, "every copy came back from the retry queue")
		assert.Equal(t, int32(2), peak.Load(), "one concurrency limit over both sources")
		mu.Lock()
		require.Len(t, seen, 8)
		for _, env := range seen {
			assert.Equal(t, "orders/Subscriptions/billing", env.Source, "the chain belongs to the subscription")
		}
		mu.Unlock()
		assert.True(t, c.Health().Ready())
		require.NoError(t, stop())
	})
}

// When one source breaks, the whole connection is rebuilt, every source with it.
func TestBrokenSourceRebuildsTheConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sub := newBroker(t, nil, nil)
		retryQueue := newBroker(t, nil, nil)
		var connects atomic.Int32
		connect := func(context.Context) (*retry.Connection, error) {
			connects.Add(1)
			return &retry.Connection{
				Receiver: sub.Receiver(), Sender: retryQueue.Sender(),
				Sources: []retry.Source{{Receiver: retryQueue.Receiver(), EntityPath: "retry"}},
			}, nil
		}
		c, err := retry.NewConsumer(connect, okHandler, &retry.Options{Logger: discardLogger()})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		synctest.Wait()
		retryQueue.Fail(retrytest.OpReceive, 1, retrytest.ErrConnectionLost)
		<-time.After(time.Second) // the sources take turns on the one slot; the retry queue's turn comes
		synctest.Wait()
		assert.Equal(t, retry.StateReconnecting, c.Health().State)
		<-time.After(5 * time.Second)
		synctest.Wait()
		assert.Equal(t, int32(2), connects.Load())
		assert.True(t, c.Health().Ready())
		sendN(sub, 1)
		<-time.After(time.Second) // the quiet retry queue yields its slot within the share window
		synctest.Wait()
		assert.Equal(t, 1, sub.Stats().Succeeded)
		require.NoError(t, stop())
	})
}

// With one slot and two quiet sources, the sources take turns; a hung broker is still noticed by the
// idle probe, whose window counts across those turns.
func TestSharedSourcesStillProbeAQuietConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sub := newBroker(t, nil, nil)
		retryQueue := newBroker(t, nil, nil)
		var hung atomic.Bool
		var pings atomic.Int32
		connect := func(context.Context) (*retry.Connection, error) {
			return &retry.Connection{
				Receiver: sub.Receiver(), Sender: retryQueue.Sender(),
				Sources: []retry.Source{{Receiver: retryQueue.Receiver(), EntityPath: "retry"}},
				Ping: func(ctx context.Context) error {
					pings.Add(1)
					if hung.Load() {
						<-ctx.Done()
						return ctx.Err()
					}
					return nil
				},
			}, nil
		}
		c, err := retry.NewConsumer(connect, okHandler, &retry.Options{Logger: discardLogger()})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		<-time.After(30 * time.Second)
		synctest.Wait()
		assert.True(t, c.Health().Ready())
		assert.GreaterOrEqual(t, pings.Load(), int32(4), "probed while both sources are quiet")
		hung.Store(true)
		hungAt := time.Now()
		for c.Health().Ready() {
			<-time.After(100 * time.Millisecond)
		}
		assert.LessOrEqual(t, time.Since(hungAt), 15*time.Second, "not ready within 15 s of the broker hanging")
		require.NoError(t, stop())
	})
}

// On a connection with several sources, a receive on a quiet source holds handler slots while it
// waits. A few messages another source received ahead of a free slot (its loop still has prefetch
// places, so it does not wait) must not wait for that receive's idle window to end: the quiet receive
// gives its slots back, as it does to a receive loop waiting for one. They waited 3 s before.
func TestMessagesReceivedAheadDoNotWaitForAQuietSource(t *testing.T) {
	for _, opts := range []retry.Options{
		{MaxConcurrency: 8, Prefetch: 16},
		{MaxConcurrency: 8},
	} {
		t.Run(fmt.Sprintf("prefetch %d", opts.Prefetch), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t, nil, &retrytest.BrokerOptions{EntityPath: retry.SubscriptionPath("orders", "billing"), RetryQueue: "billing-retry"})
				var handled atomic.Int32
				opts.Logger = discardLogger()
				c, err := retry.NewConsumer(b.Connector(), func(context.Context, *azservicebus.ReceivedMessage) error {
					<-time.After(10 * time.Millisecond)
					handled.Add(1)
					return nil
				}, &opts)
				require.NoError(t, err)
				stop := runConsumer(t, c)
				for burst := range 3 {
					// Quiet for longer than the idle window: both receive loops start their receives
					// again meanwhile, and the quiet source's takes the free handler slots.
					<-time.After(7 * time.Second)
					start := time.Now()
					sendN(b, 5)
					for handled.Load() < int32(5*(burst+1)) {
						<-time.After(time.Millisecond)
					}
					assert.Less(t, time.Since(start), 500*time.Millisecond, "burst %d waited for the quiet source", burst)
				}
				require.NoError(t, stop())
			})
		})
	}
}

// greedyReceiver returns twice as many messages as it is asked for, as a misbehaving receiver may.
type greedyReceiver struct{ retry.Receiver }

func (r greedyReceiver) ReceiveMessages(ctx context.Context, n int, o *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	return r.Receiver.ReceiveMessages(ctx, 2*n, o)
}

// A receiver that returns more messages than asked for never makes the consumer exceed MaxConcurrency:
// the extra message waits for a handler slot, and a shutdown that comes meanwhile is not held up by
// that wait (the message is left for redelivery).
func TestMessagesBeyondTheAskWaitForASlotButNotForever(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, &retrytest.BrokerOptions{WrapReceiver: func(r retry.Receiver) retry.Receiver {
			return greedyReceiver{r}
		}})
		sendN(b, 2)
		var running, most atomic.Int32
		c, err := retry.NewConsumer(b.Connector(), func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
			n := running.Add(1)
			defer running.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			<-ctx.Done() // returns only once the shutdown cancels it
			return ctx.Err()
		}, &retry.Options{MaxConcurrency: 1, Prefetch: -1, ShutdownGrace: time.Second, Logger: discardLogger()})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		synctest.Wait() // one handler runs; the second message waits for its slot
		assert.Equal(t, int32(1), running.Load())
		err = stop()
		require.NoError(t, err, "Run returns: the wait for a slot ends with the shutdown")
		assert.Equal(t, int32(1), most.Load(), "never more than MaxConcurrency handlers")
	})
}
