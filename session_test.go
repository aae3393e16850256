package retry_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
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

// sessionCall is one handler call of a session consumer test.
type sessionCall struct {
	Session, ID string
	Attempt     int
	At          time.Duration // since the test began, on the bubble's clock
}

// sessionRecorder records handler calls and successes per session, and every OnProcessed result.
type sessionRecorder struct {
	start     time.Time
	mu        sync.Mutex
	calls     []sessionCall
	successes map[string][]string
	processed []retry.ProcessedParams
}

func newSessionRecorder() *sessionRecorder {
	return &sessionRecorder{start: time.Now(), successes: map[string][]string{}}
}

// handler wraps fail (which decides each call's error) and records the call and its success.
func (rec *sessionRecorder) handler(fail func(ctx context.Context, c sessionCall) error) retry.Handler {
	return func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		sid, _ := retry.SessionIDFromContext(ctx)
		env, _ := envelope.FromContext(ctx)
		c := sessionCall{Session: sid, ID: m.MessageID, Attempt: env.Attempt, At: time.Since(rec.start)}
		rec.mu.Lock()
		rec.calls = append(rec.calls, c)
		rec.mu.Unlock()
		err := fail(ctx, c)
		if err == nil {
			rec.mu.Lock()
			rec.successes[sid] = append(rec.successes[sid], m.MessageID)
			rec.mu.Unlock()
		}
		return err
	}
}

func (rec *sessionRecorder) onProcessed(p retry.ProcessedParams) {
	rec.mu.Lock()
	rec.processed = append(rec.processed, p)
	rec.mu.Unlock()
}

func (rec *sessionRecorder) callsOf(session string) []sessionCall {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var out []sessionCall
	for _, c := range rec.calls {
		if c.Session == session {
			out = append(out, c)
		}
	}
	return out
}

func (rec *sessionRecorder) successesOf(session string) []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]string(nil), rec.successes[session]...)
}

// newSessionBroker is a session-enabled retrytest queue on the bubble's clock.
func newSessionBroker(t *testing.T, opts *retrytest.BrokerOptions) *retrytest.Broker {
	t.Helper()
	if opts == nil {
		opts = &retrytest.BrokerOptions{}
	}
	opts.RequiresSession = true
	return newBroker(t, nil, opts)
}

// sendSession sends n messages "<session>-<i>" (i from 1) to session.
func sendSession(t *testing.T, b *retrytest.Broker, session string, n int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		_, err := b.Send(&azservicebus.Message{MessageID: strPtr(fmt.Sprintf("%s-%d", session, i)), SessionID: strPtr(session), Body: []byte("x")})
		require.NoError(t, err)
	}
}

// newSessionConsumer builds a session consumer on b with the recorder's OnProcessed and a discarded
// log unless opts say otherwise.
func newSessionConsumer(t *testing.T, b *retrytest.Broker, h retry.Handler, rec *sessionRecorder, opts *retry.Options, sopts *retry.SessionOptions) *retry.SessionConsumer {
	t.Helper()
	if opts == nil {
		opts = &retry.Options{}
	}
	if opts.Logger == nil {
		opts.Logger = discardLogger()
	}
	if rec != nil && opts.Hooks.OnProcessed == nil {
		opts.Hooks.OnProcessed = rec.onProcessed
	}
	sc, err := retry.NewSessionConsumer(b.SessionConnector(), h, opts, sopts)
	require.NoError(t, err)
	return sc
}

// runSessionConsumer starts sc.Run and returns a function that cancels it and returns Run's error.
func runSessionConsumer(t *testing.T, sc *retry.SessionConsumer) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- sc.Run(ctx) }()
	return func() error {
		cancel()
		return <-done
	}
}

// waitFor waits until cond holds on b, for at most an hour of the bubble's time, so that a consumer that
// never gets there fails the test instead of running its fake clock for ever.
func waitFor(t *testing.T, b *retrytest.Broker, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
	defer cancel()
	require.NoError(t, b.WaitUntil(ctx, cond))
}

func ids(session string, n ...int) []string {
	out := make([]string, len(n))
	for i, k := range n {
		out[i] = fmt.Sprintf("%s-%d", session, k)
	}
	return out
}

// A running handler keeps ShutdownGrace, and its success is still completed.
func TestSessionShutdownLetsHandlerFinish(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 2)
		started := make(chan struct{})
		var states []retry.State
		var mu sync.Mutex
		h := func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
			if m.MessageID == "s-1" {
				close(started)
				time.Sleep(5 * time.Second)
				return ctx.Err()
			}
			return nil
		}
		sc := newSessionConsumer(t, b, h, nil, &retry.Options{ShutdownGrace: 10 * time.Second, Hooks: retry.Hooks{
			OnStateChange: func(p retry.StateChangeParams) {
				mu.Lock()
				states = append(states, p.To)
				mu.Unlock()
			}}}, nil)
		stop := runSessionConsumer(t, sc)
		<-started
		require.NoError(t, stop())
		require.Len(t, b.Completed(), 1)
		assert.Equal(t, "s-1", b.Completed()[0].MessageID)
		assert.Equal(t, 1, b.Stats().Active, "s-2 was not started")
		assert.Equal(t, []retry.State{retry.StateConnecting, retry.StateRunning, retry.StateDraining, retry.StateStopped}, states)
	})
}

func TestNewSessionConsumerInvalidOptions(t *testing.T) {
	connect := func(context.Context) (*retry.SessionConnection, error) { return nil, errors.New("unused") }
	cases := []struct {
		name    string
		connect retry.SessionConnector
		handler retry.Handler
		opts    *retry.Options
		sopts   *retry.SessionOptions
		field   string
	}{
		{name: "nil connector", handler: okHandler, field: "connect"},
		{name: "nil handler", connect: connect, field: "handler"},
		{name: "MaxConcurrency", connect: connect, handler: okHandler, opts: &retry.Options{MaxConcurrency: 4}, field: "MaxConcurrency"},
		{name: "ReceiveBatchSize", connect: connect, handler: okHandler, opts: &retry.Options{ReceiveBatchSize: 4}, field: "ReceiveBatchSize"},
		{name: "Prefetch", connect: connect, handler: okHandler, opts: &retry.Options{Prefetch: -1}, field: "Prefetch"},
		{name: "DisableLockRenewal", connect: connect, handler: okHandler, opts: &retry.Options{DisableLockRenewal: true}, field: "DisableLockRenewal"},
		{name: "negative MaxAttempts", connect: connect, handler: okHandler, opts: &retry.Options{MaxAttempts: -1}, field: "MaxAttempts"},
		{name: "negative sessions", connect: connect, handler: okHandler, sopts: &retry.SessionOptions{MaxConcurrentSessions: -1}, field: "MaxConcurrentSessions"},
		{name: "negative idle", connect: connect, handler: okHandler, sopts: &retry.SessionOptions{SessionIdleTimeout: -1}, field: "SessionIdleTimeout"},
		{name: "negative hold", connect: connect, handler: okHandler, sopts: &retry.SessionOptions{MaxHold: -time.Second}, field: "MaxHold"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sc, err := retry.NewSessionConsumer(tc.connect, tc.handler, tc.opts, tc.sopts)
			assert.Nil(t, sc)
			require.ErrorIs(t, err, retry.ErrInvalidOptions)
			var oe *retry.OptionError
			require.ErrorAs(t, err, &oe)
			assert.Equal(t, tc.field, oe.Field)
		})
	}
	t.Run("defaults", func(t *testing.T) {
		sc, err := retry.NewSessionConsumer(connect, okHandler, nil, nil)
		require.NoError(t, err)
		assert.Equal(t, retry.StateIdle, sc.Health().State)
	})
	t.Run("zero value", func(t *testing.T) {
		var sc retry.SessionConsumer
		assert.ErrorIs(t, sc.Run(t.Context()), retry.ErrNotConfigured)
	})
}

// A handler that outlives ShutdownGrace and one SettleTimeout makes Run return a ShutdownError naming
// it, without settling its message.
func TestSessionShutdownTimesOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 1)
		started, release := make(chan struct{}), make(chan struct{})
		h := func(context.Context, *azservicebus.ReceivedMessage) error {
			close(started)
			<-release // ignores its context
			return nil
		}
		sc := newSessionConsumer(t, b, h, nil, &retry.Options{ShutdownGrace: time.Second, SettleTimeout: 2 * time.Second}, nil)
		stop := runSessionConsumer(t, sc)
		<-started
		begin := time.Now()
		err := stop()
		assert.Equal(t, 3*time.Second, time.Since(begin), "the grace, then one settle timeout")
		var se *retry.ShutdownError
		require.ErrorAs(t, err, &se)
		assert.Equal(t, 1, se.Running)
		assert.ErrorIs(t, err, retry.ErrShutdownTimeout)
		close(release)
		synctest.Wait()
		assert.Empty(t, b.Completed(), "nothing is settled after Run gave up")
	})
}

// A session consumer on a session-enabled queue: each session's messages in order, a failure retried
// in place after its backoff while the rest of its session waits. (Compile-only: it needs a namespace.)
func ExampleNewSessionConsumer() {
	connect, err := retry.NewNamespace("Endpoint=sb://myns.servicebus.windows.net/;SharedAccessKeyName=listen;SharedAccessKey=...", nil).SessionQueue("orders")
	if err != nil {
		panic(err)
	}
	handler := func(ctx context.Context, msg *azservicebus.ReceivedMessage) error {
		session, _ := retry.SessionIDFromContext(ctx)
		env, _ := envelope.FromContext(ctx)
		fmt.Println("order", session, "message", msg.MessageID, "attempt", env.Attempt)
		return nil
	}
	c, err := retry.NewSessionConsumer(connect, handler,
		&retry.Options{MaxAttempts: 5, Backoff: backoff.Exponential{Base: time.Second, Cap: 30 * time.Second}},
		&retry.SessionOptions{MaxConcurrentSessions: 16, MaxHold: 2 * time.Minute})
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	if err := c.Run(ctx); err != nil {
		panic(err)
	}
}

// The hooks see a session message as they see a queue message: OnStart's context becomes the
// handler's (the session id still in it), OnSettle reports each settle, OnProcessed the final result.
func TestSessionHooks(t *testing.T) {
	type startKey struct{}
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 1)
		var mu sync.Mutex
		var seen []any
		var ops []string
		var processed []retry.ProcessedParams
		h := func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
			sid, _ := retry.SessionIDFromContext(ctx)
			mu.Lock()
			seen = append(seen, ctx.Value(startKey{}), sid)
			mu.Unlock()
			return nil
		}
		sc := newSessionConsumer(t, b, h, nil, &retry.Options{Hooks: retry.Hooks{
			OnStart: func(p retry.StartParams) context.Context {
				return context.WithValue(p.Context, startKey{}, "from OnStart")
			},
			OnSettle: func(p retry.SettleParams) {
				mu.Lock()
				ops = append(ops, p.Operation)
				mu.Unlock()
			},
			OnProcessed: func(p retry.ProcessedParams) {
				mu.Lock()
				processed = append(processed, p)
				mu.Unlock()
			},
		}}, nil)
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 1 })
		require.NoError(t, stop())
		assert.Equal(t, []any{"from OnStart", "s"}, seen)
		assert.Equal(t, []string{retry.SettleComplete}, ops)
		require.Len(t, processed, 1)
		assert.Equal(t, "from OnStart", processed[0].Context.Value(startKey{}))
		assert.Equal(t, retry.OutcomeCompleted, processed[0].Result.Outcome)
		assert.Equal(t, 1, processed[0].Result.Attempt)
	})
}

// A broken connection is rebuilt at once, not after the handlers still running on it return: one slow
// handler must not stall the other sessions.
func TestSessionReconnectDoesNotWaitForASlowHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, &retrytest.BrokerOptions{LockDuration: time.Minute})
		sendSession(t, b, "a", 1)
		started := make(chan struct{})
		h := func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
			if m.MessageID == "a-1" {
				close(started)
				select { // a slow handler (in the bubble)
				case <-time.After(10 * time.Minute):
				case <-ctx.Done():
				}
			}
			return nil
		}
		sc := newSessionConsumer(t, b, h, nil, &retry.Options{ReconnectDelays: []time.Duration{time.Second}},
			&retry.SessionOptions{MaxConcurrentSessions: 2, SessionIdleTimeout: time.Second})
		stop := runSessionConsumer(t, sc)
		<-started
		b.Fail(retrytest.OpAccept, 1, &azservicebus.Error{Code: azservicebus.CodeConnectionLost})
		sendSession(t, b, "b", 1)
		time.Sleep(time.Minute)
		synctest.Wait()
		hl := sc.Health()
		done := 0
		for _, m := range b.Completed() {
			if m.MessageID == "b-1" {
				done++
			}
		}
		assert.Equal(t, 1, done, "session b should be served within a minute of the break (queue consumer retires the old connection in the background)")
		assert.Equal(t, retry.StateRunning, hl.State, "running again on the new connection")
		assert.Equal(t, uint64(2), hl.Connects)
		require.NoError(t, stop())
	})
}

// Accepts that end on our own deadline, with no answer from the broker (a dead or black-holed
// connection), break the connection, and the consumer is never Ready on it.
func TestSessionDeadConnectionIsRebuilt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		connects := 0
		conn := func(ctx context.Context) (*retry.SessionConnection, error) {
			connects++
			return &retry.SessionConnection{AcceptNext: func(ctx context.Context) (retry.SessionReceiver, error) {
				<-ctx.Done() // the network swallows the attach
				return nil, ctx.Err()
			}}, nil
		}
		sc, err := retry.NewSessionConsumer(conn, okHandler, &retry.Options{Logger: discardLogger()}, &retry.SessionOptions{MaxConcurrentSessions: 1})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- sc.Run(ctx) }()
		time.Sleep(time.Hour)
		synctest.Wait()
		h := sc.Health()
		cancel()
		require.NoError(t, <-done)
		assert.Greater(t, connects, 1, "an hour of accepts that never got an answer should rebuild the connection")
		assert.False(t, h.Ready(), "an hour without any answer from the broker should not be Ready")
	})
}

// An accept that answers CodeTimeout at once is not asked again at once: a worker waits acceptFloor.
func TestSessionImmediateAcceptTimeoutsDoNotSpin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		calls := 0
		start := time.Now()
		var elapsed time.Duration
		conn := func(context.Context) (*retry.SessionConnection, error) {
			return &retry.SessionConnection{AcceptNext: func(context.Context) (retry.SessionReceiver, error) {
				calls++
				if calls == 10000 {
					elapsed = time.Since(start)
					cancel()
				}
				return nil, &azservicebus.Error{Code: azservicebus.CodeTimeout}
			}}, nil
		}
		sc, err := retry.NewSessionConsumer(conn, okHandler, &retry.Options{Logger: discardLogger()}, &retry.SessionOptions{MaxConcurrentSessions: 1})
		require.NoError(t, err)
		require.NoError(t, sc.Run(ctx))
		assert.Greater(t, elapsed, time.Second, "10,000 accepts in %v of clock time", elapsed)
	})
}
