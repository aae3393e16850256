package retry_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
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

// TestConnectionCheckGatesRunning: a connection whose Check fails is a failed connect (closed, counted,
// schedule goes on), so the consumer never reports itself running against an unreachable namespace.
func TestConnectionCheckGatesRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		connect, conns := trackingConnector(b)
		unreachable := errors.New("dial tcp: connection refused")
		checks := 0
		checked := func(ctx context.Context) (*retry.Connection, error) {
			conn, err := connect(ctx)
			if err != nil {
				return nil, err
			}
			conn.Check = func(context.Context) error {
				if checks++; checks <= 2 {
					return unreachable
				}
				return nil
			}
			return conn, nil
		}
		var mu sync.Mutex
		var changes []retry.StateChangeParams
		c, err := retry.NewConsumer(checked, okHandler, &retry.Options{Logger: discardLogger(),
			Hooks: retry.Hooks{OnStateChange: func(p retry.StateChangeParams) {
				mu.Lock()
				changes = append(changes, p)
				mu.Unlock()
			}}})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		synctest.Wait()
		assert.Equal(t, retry.StateReconnecting, c.Health().State, "built but unchecked is not running")
		<-time.After(5 * time.Second)
		synctest.Wait()
		assert.False(t, c.Health().Ready(), "the second check failed too")
		<-time.After(10 * time.Second)
		synctest.Wait()
		assert.True(t, c.Health().Ready())
		require.Len(t, *conns, 3)
		assert.True(t, (*conns)[0].closed.Load(), "a connection that failed its check is closed")
		assert.True(t, (*conns)[1].closed.Load())
		h := c.Health()
		assert.Equal(t, uint64(2), h.ConnectFailures)
		assert.Contains(t, h.LastError, "connection check failed")
		require.NoError(t, stop())

		mu.Lock()
		defer mu.Unlock()
		require.GreaterOrEqual(t, len(changes), 3)
		assert.Equal(t, retry.StateReconnecting, changes[1].To)
		assert.ErrorIs(t, changes[1].Err, unreachable, "the state hook says why")
	})
}

// An endpoint that refuses connections is reported on the first try, with its cause, in the state
// hook, the log and Health.LastError: not after the SDK's retries, as a deadline.
func TestUnreachableEndpointReportedAtOnce(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens there now
	connect, err := retry.NewNamespace("Endpoint=sb://"+addr+";SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0;UseDevelopmentEmulator=true", nil).Queue("orders")
	require.NoError(t, err)
	changes := make(chan retry.StateChangeParams, 16)
	var logs bytes.Buffer
	c, err := retry.NewConsumer(connect, okHandler, &retry.Options{
		Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs}, nil)),
		Hooks:  retry.Hooks{OnStateChange: func(p retry.StateChangeParams) { changes <- p }},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	for p := range changes {
		if p.To != retry.StateReconnecting {
			continue
		}
		require.Error(t, p.Err)
		assert.NotErrorIs(t, p.Err, context.DeadlineExceeded, "the cause, not the SDK's deadline")
		assert.ErrorContains(t, p.Err, "does not accept connections")
		assert.ErrorContains(t, p.Err, "connection refused")
		break
	}
	assert.Contains(t, c.Health().LastError, "connection refused")
	cancel()
	require.NoError(t, <-done)
	assert.Contains(t, logs.String(), "connect failed")
	assert.NotContains(t, logs.String(), "c2VjcmV0", "the key never reaches the log")
}
