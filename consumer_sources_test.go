package retry_test

import (
	"context"
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
	"github.com/sbretry/retry/retrytest"
)

// A consumer receives from several sources of one connection (a subscription and its retry queue) with
// one handler, one concurrency limit and one health: a failure on the subscription is scheduled to the
// retry queue, received from there, and keeps the subscription as its chain's source.
func TestConsumerReceivesFromEverySourceOfAConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, &retrytest.BrokerOptions{EntityPath: retry.SubscriptionPath("orders", "billing"), RetryQueue: "billing-retry", DuplicateDetection: true})
		var mu sync.Mutex
		var seen []retry.Envelope
		var running, peak atomic.Int32
		c, err := retry.NewConsumer(b.Connector(), func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
			n := running.Add(1)
			defer running.Add(-1)
			if n > peak.Load() {
				peak.Store(n)
			}
			env, _ := retry.EnvelopeFromContext(ctx)
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
