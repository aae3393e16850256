package retry_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/retrytest"
)

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
// the broker after Run returned (the connection's Close need not abort it), with lock renewal on or off
// (the call does not derive from the settle base: renewals.abandon ends it).
func TestShutdownThatGivesUpEndsTheSettleInFlight(t *testing.T) {
	for _, renewal := range []bool{true, false} {
		t.Run(fmt.Sprintf("renewal=%v", renewal), func(t *testing.T) { testShutdownEndsTheSettleInFlight(t, !renewal) })
	}
}

func testShutdownEndsTheSettleInFlight(t *testing.T, disableRenewal bool) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		sendN(b, 1)
		started := make(chan struct{})
		settler := &slowSettler{delay: 1500 * time.Millisecond}
		connect := connectNoAbort(b, func(r retry.Receiver) retry.Receiver { settler.Receiver = r; return settler })
		c, err := retry.NewConsumer(connect, func(context.Context, *azservicebus.ReceivedMessage) error {
			close(started)
			<-time.After(2500 * time.Millisecond) // ignores ctx; returns after the grace, within the settle timeout
			return nil
		}, &retry.Options{ShutdownGrace: time.Second, SettleTimeout: 2 * time.Second, Logger: discardLogger(), DisableLockRenewal: disableRenewal})
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

// slowRenewals passes lock renewals through after renewFor unless their context ends first, and its
// completes wait for their context to end, recording when.
type slowRenewals struct {
	retry.Receiver
	renewFor time.Duration
	mu       sync.Mutex
	ended    []time.Time
}

func (s *slowRenewals) RenewMessageLock(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.RenewMessageLockOptions) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(s.renewFor):
	}
	return s.Receiver.RenewMessageLock(ctx, m, o)
}

func (s *slowRenewals) CompleteMessage(ctx context.Context, _ *azservicebus.ReceivedMessage, _ *azservicebus.CompleteMessageOptions) error {
	<-ctx.Done()
	s.mu.Lock()
	s.ended = append(s.ended, time.Now())
	s.mu.Unlock()
	return ctx.Err()
}

// A settle in flight whose lock is off the renewal schedule for a renewal call when Run gives up on the
// shutdown is ended then too, by the renewal's return (lockKeeper.renew), not at its own bound.
func TestShutdownThatGivesUpDuringARenewalEndsTheSettleInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		sendN(b, 1)
		started := make(chan struct{})
		settler := &slowRenewals{renewFor: 900 * time.Millisecond} // renewals at 1 s, 2 s, …, each in flight 0.9 s
		connect := connectNoAbort(b, func(r retry.Receiver) retry.Receiver { settler.Receiver = r; return settler })
		c, err := retry.NewConsumer(connect, func(context.Context, *azservicebus.ReceivedMessage) error {
			close(started)
			<-time.After(4 * time.Second) // ignores ctx
			return nil
		}, &retry.Options{ShutdownGrace: time.Second, SettleTimeout: 5 * time.Second, LockRenewInterval: time.Second, Logger: discardLogger()})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		<-started
		start := time.Now()
		<-time.After(500 * time.Millisecond)
		cancel()
		err = <-done
		require.ErrorIs(t, err, retry.ErrShutdownTimeout)
		assert.Equal(t, 6500*time.Millisecond, time.Since(start), "half a second, then grace plus one settle timeout")
		synctest.Wait()
		settler.mu.Lock()
		defer settler.mu.Unlock()
		require.Len(t, settler.ended, 1)
		assert.Equal(t, 6500*time.Millisecond, settler.ended[0].Sub(start), "ended when Run gave up (a renewal was in flight), not at 9 s")
		assert.Empty(t, b.Completed())
	})
}

// connectNoAbort connects through b with the receiver wrap returns, and a Close that aborts nothing, so
// that only the consumer itself can end a call in flight.
func connectNoAbort(b *retrytest.Broker, wrap func(retry.Receiver) retry.Receiver) retry.Connector {
	return func(ctx context.Context) (*retry.Connection, error) {
		conn, err := b.Connector()(ctx)
		if err != nil {
			return nil, err
		}
		conn.Receiver = wrap(conn.Receiver)
		conn.Close = func(context.Context) error { return nil }
		return conn, nil
	}
}

// A shutdown says what it waits for when it begins (how many messages are in hand, until when), and
// a handler cancelled because the grace elapsed sees retry.ErrShutdown as its context's cause, on
// both consumers.
func TestShutdownSaysWhatItWaitsFor(t *testing.T) {
	handler := func(causes chan<- error) retry.Handler {
		return func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return ctx.Err()
		}
	}
	check := func(t *testing.T, logs *bytes.Buffer, causes chan error) {
		t.Helper()
		select {
		case cause := <-causes:
			assert.ErrorIs(t, cause, retry.ErrShutdown)
		default:
			t.Fatal("the handler was not cancelled")
		}
		out := logs.String()
		assert.Contains(t, out, `"msg":"draining: waiting for the messages in hand to finish","in_hand":1,"grace_until":"`)
		assert.Contains(t, out, `"msg":"shutdown grace elapsed; cancelling in-flight handlers","running":1`)
	}
	t.Run("queue", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var logs bytes.Buffer
			causes := make(chan error, 1)
			b := newBroker(t, nil, nil)
			sendN(b, 1)
			c, err := retry.NewConsumer(b.Connector(), handler(causes), &retry.Options{
				ShutdownGrace: 10 * time.Second, Logger: slog.New(slog.NewJSONHandler(&lockedWriter{w: &logs}, nil)),
			})
			require.NoError(t, err)
			stop := runConsumer(t, c)
			waitFor(t, b, func() bool { return b.Stats().Locked == 1 })
			synctest.Wait()
			require.NoError(t, stop())
			check(t, &logs, causes)
		})
	})
	t.Run("session", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var logs bytes.Buffer
			causes := make(chan error, 1)
			b := newSessionBroker(t, nil)
			sendSession(t, b, "s", 1)
			sc := newSessionConsumer(t, b, handler(causes), nil, &retry.Options{
				ShutdownGrace: 10 * time.Second, Logger: slog.New(slog.NewJSONHandler(&lockedWriter{w: &logs}, nil)),
			}, nil)
			stop := runSessionConsumer(t, sc)
			waitFor(t, b, func() bool { return b.Stats().Locked == 1 })
			synctest.Wait()
			require.NoError(t, stop())
			check(t, &logs, causes)
		})
	})
}
