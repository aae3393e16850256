//go:build !live

package e2e

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
	"github.com/sbretry/retry/sessionstate"
)

// sessionEnv starts an emulator with one session-enabled queue and returns its env and a sender.
func sessionEnv(t *testing.T) (*env, *azservicebus.Sender) {
	t.Helper()
	em, err := sbemu.Start(sbemu.Config{Queues: []broker.QueueConfig{{Name: "sessions", RequiresSession: true, LockDuration: 10 * time.Second}}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, em.Close()) })
	e := &env{connStr: em.ConnectionString(), queue: "sessions", em: em}
	sender, err := e.client(t).NewSender(e.queue, nil)
	require.NoError(t, err)
	return e, sender
}

// sessionOrder checks per-session order: next is the index each session may succeed with next.
type sessionOrder struct {
	mu        sync.Mutex
	next      map[string]int
	outOfTurn []string
	succeeded int
	want      int
	done      chan struct{}
}

func newSessionOrder(want int) *sessionOrder {
	return &sessionOrder{next: map[string]int{}, want: want, done: make(chan struct{})}
}

// handler fails the messages fail picks, and records the successes in order.
func (o *sessionOrder) handler(fail func(i, attempt int) error) retry.Handler {
	return func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		sid, _ := retry.SessionIDFromContext(ctx)
		env, _ := envelope.FromContext(ctx)
		i, _ := strconv.Atoi(string(m.Body))
		o.mu.Lock()
		defer o.mu.Unlock()
		if i != o.next[sid] {
			o.outOfTurn = append(o.outOfTurn, fmt.Sprintf("%s ran while %d was next", m.MessageID, o.next[sid]))
		}
		if err := fail(i, env.Attempt); err != nil {
			return err
		}
		o.next[sid] = i + 1
		o.succeeded++
		if o.succeeded == o.want {
			close(o.done)
		}
		return nil
	}
}

func sendSessions(t *testing.T, sender *azservicebus.Sender, sessions, perSession int) {
	t.Helper()
	for i := range perSession {
		for s := range sessions {
			sid := fmt.Sprintf("s%02d", s)
			id := fmt.Sprintf("%s-%02d", sid, i)
			require.NoError(t, sender.SendMessage(t.Context(), &azservicebus.Message{MessageID: &id, SessionID: &sid, Body: []byte(strconv.Itoa(i))}, nil))
		}
	}
}

// readSessionState accepts session sid and returns its decoded record.
func readSessionState(t *testing.T, e *env, sid string) sessionstate.State {
	t.Helper()
	r, err := e.client(t).AcceptSessionForQueue(t.Context(), e.queue, sid, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close(context.WithoutCancel(t.Context()))) }()
	raw, err := r.GetSessionState(t.Context(), nil)
	require.NoError(t, err)
	st, err := sessionstate.Decode(raw)
	require.NoError(t, err)
	return st
}

// Durable holds through the real SDK on the emulator: every retry is deferred in its session with the
// record in the session state and a wake-up scheduled; the consumer is stopped and replaced halfway,
// and each session's successes still come in order, with nothing lost and nothing left blocked.
func TestSessionDurableHoldsThroughTheSDK(t *testing.T) {
	parallel(t)
	const (
		sessions   = 10
		perSession = 10
		delay      = 300 * time.Millisecond
	)
	e, sender := sessionEnv(t)
	sendSessions(t, sender, sessions, perSession)
	order := newSessionOrder(sessions * perSession)
	handler := order.handler(func(i, attempt int) error {
		if i%4 == 1 && attempt < 3 {
			return errBoom
		}
		return nil
	})
	connect, err := retry.NewNamespace(e.connStr, &retry.ConnectOptions{Client: &azservicebus.ClientOptions{RetryOptions: fastRetries}}).SessionQueue(e.queue)
	require.NoError(t, err)
	newConsumer := func() *retry.SessionConsumer {
		sc, err := retry.NewSessionConsumer(connect, handler, &retry.Options{
			Backoff: backoff.Constant{Interval: delay}, SettleTimeout: 5 * time.Second, Logger: quietLogger(),
		}, &retry.SessionOptions{MaxConcurrentSessions: 3, SessionIdleTimeout: 500 * time.Millisecond, MaxHold: time.Nanosecond, DurableHolds: true})
		require.NoError(t, err)
		return sc
	}
	run := func(sc *retry.SessionConsumer) (stop func()) {
		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error, 1)
		go func() { errc <- sc.Run(ctx) }()
		return func() {
			cancel()
			require.NoError(t, <-errc)
		}
	}
	first := newConsumer()
	stop := run(first)
	deadline := time.After(testTimeout)
	for first.Health().Deferred < 5 {
		select {
		case <-deadline:
			t.Fatal("no durable hold in time")
		case <-time.After(20 * time.Millisecond):
		}
	}
	stop()
	second := newConsumer()
	stop = run(second)
	select {
	case <-order.done:
	case <-deadline:
		order.mu.Lock()
		t.Fatalf("the sessions were not drained in time: %d of %d", order.succeeded, order.want)
	}
	stop()

	order.mu.Lock()
	defer order.mu.Unlock()
	assert.Empty(t, order.outOfTurn, "no message runs before its predecessor succeeded")
	for s := range sessions {
		assert.Equal(t, perSession, order.next[fmt.Sprintf("s%02d", s)])
	}
	assert.Positive(t, first.Health().Deferred)
	assert.Positive(t, second.Health().Deferred)
	assert.Zero(t, first.Health().DeadLettered+second.Health().DeadLettered)
	for s := range sessions {
		st := readSessionState(t, e, fmt.Sprintf("s%02d", s))
		assert.False(t, st.Blocked(), "session s%02d left blocked: %+v", s, st)
	}
}

// BlockAfterDeadLetter through the SDK: a permanent failure dead-letters the message and blocks its
// session, whose later messages are deferred; another session goes on. The operator's release (as
// sbretry applies it: the wake-up sent, then the record written, under the session's lock) lets the
// blocked session go on, in order.
func TestSessionBlockedAfterDeadLetterThroughTheSDK(t *testing.T) {
	parallel(t)
	e, sender := sessionEnv(t)
	sendSessions(t, sender, 2, 4)
	order := newSessionOrder(2*4 - 1)
	handler := order.handler(func(i, _ int) error { return nil })
	failOnce := func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		if m.MessageID == "s00-00" {
			order.mu.Lock()
			order.next["s00"] = 1 // dead-lettered: s00-01 is next
			order.mu.Unlock()
			return retry.Permanent(errors.New("malformed"))
		}
		return handler(ctx, m)
	}
	connect, err := retry.NewNamespace(e.connStr, &retry.ConnectOptions{Client: &azservicebus.ClientOptions{RetryOptions: fastRetries}}).SessionQueue(e.queue)
	require.NoError(t, err)
	sc, err := retry.NewSessionConsumer(connect, failOnce, &retry.Options{SettleTimeout: 5 * time.Second, Logger: quietLogger()},
		&retry.SessionOptions{MaxConcurrentSessions: 2, SessionIdleTimeout: 300 * time.Millisecond, BlockAfterDeadLetter: true})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- sc.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-errc)
	}()
	deadline := time.After(testTimeout)
	for sc.Health().Deferred < 3 || !sessionDone(order, "s01", 4) {
		select {
		case <-deadline:
			t.Fatal("the blocked session's followers were not deferred in time")
		case <-time.After(20 * time.Millisecond):
		}
	}
	order.mu.Lock()
	assert.Equal(t, 1, order.next["s00"], "nothing of the blocked session ran after its dead-letter")
	order.mu.Unlock()
	assert.Equal(t, uint64(1), sc.Health().DeadLettered)

	// The release, as the operator tools apply it.
	client := e.client(t)
	var r *azservicebus.SessionReceiver
	for r == nil {
		got, err := client.AcceptSessionForQueue(t.Context(), e.queue, "s00", nil)
		if err == nil {
			r = got
			break
		}
		select {
		case <-deadline:
			t.Fatalf("the blocked session stayed locked: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	raw, err := r.GetSessionState(t.Context(), nil)
	require.NoError(t, err)
	st, err := sessionstate.Decode(raw)
	require.NoError(t, err)
	require.NotNil(t, st.Hold)
	assert.Equal(t, "RetryPermanentFailure", st.Hold.DeadLetterReason)
	assert.Len(t, st.Followers, 3)
	plan, err := sessionstate.PlanRelease("s00", st, time.Now())
	require.NoError(t, err)
	require.NoError(t, sender.SendMessage(t.Context(), plan.Wake, nil))
	after, err := sessionstate.Marshal(plan.After)
	require.NoError(t, err)
	require.NoError(t, r.SetSessionState(t.Context(), after, nil))
	require.NoError(t, r.Close(t.Context()))

	select {
	case <-order.done:
	case <-deadline:
		t.Fatal("the released session did not go on")
	}
	order.mu.Lock()
	defer order.mu.Unlock()
	assert.Empty(t, order.outOfTurn, "after the dead-letter, the session's messages run in order")
	assert.Equal(t, 4, order.next["s00"])
}

// sessionDone reports whether session sid has had n successes.
func sessionDone(o *sessionOrder, sid string, n int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.next[sid] == n
}

// A consumer whose session lock was lost while its handler ran must not write its record over one
// written meanwhile. The SDK takes a session whose lock was lost again on the next call, silently
// (GetRecoveryKindForSession in azservicebus internal/errors.go: "a lock lost on a session _is_
// retryable"), so without a check the consumer's state write succeeds and replaces what the session's
// next holder wrote. Here that holder writes a state of the application's own; the consumer reads the
// state again before its write, finds it changed, writes nothing and releases the session, and the
// message, left unsettled, runs again under the state as it is now.
func TestSessionStateWrittenMeanwhileIsNotOverwritten(t *testing.T) {
	parallel(t)
	e, sender := sessionEnv(t)
	sid := "s"
	for i := 1; i <= 2; i++ {
		id := fmt.Sprintf("s-%d", i)
		require.NoError(t, sender.SendMessage(t.Context(), &azservicebus.Message{MessageID: &id, SessionID: &sid, Body: []byte("x")}, nil))
	}
	var (
		mu        sync.Mutex
		successes []string
		started   = make(chan struct{})
		intruded  = make(chan struct{})
		done      = make(chan struct{})
	)
	handler := func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		env, _ := envelope.FromContext(ctx)
		if m.MessageID == "s-1" && env.Attempt == 1 && m.DeliveryCount == 1 {
			close(started)
			<-intruded
			return errBoom // a durable hold: the consumer writes its record now
		}
		mu.Lock()
		defer mu.Unlock()
		successes = append(successes, m.MessageID)
		if len(successes) == 2 {
			close(done)
		}
		return nil
	}
	connect, err := retry.NewNamespace(e.connStr, &retry.ConnectOptions{Client: &azservicebus.ClientOptions{RetryOptions: fastRetries}}).SessionQueue(e.queue)
	require.NoError(t, err)
	sc, err := retry.NewSessionConsumer(connect, handler, &retry.Options{
		Backoff: backoff.Constant{Interval: time.Hour}, SettleTimeout: 5 * time.Second, Logger: quietLogger(),
	}, &retry.SessionOptions{MaxConcurrentSessions: 1, MaxHold: time.Nanosecond, DurableHolds: true})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	runErr := make(chan error, 1)
	go func() { runErr <- sc.Run(ctx) }()

	<-started
	e.em.Broker().ExpireAllLocks()
	// The session's next holder: it writes a state of its own and lets the session go.
	other, err := e.client(t).AcceptSessionForQueue(t.Context(), e.queue, sid, nil)
	require.NoError(t, err)
	theirs := []byte(`{"cart":42}`)
	require.NoError(t, other.SetSessionState(t.Context(), theirs, nil))
	require.NoError(t, other.Close(t.Context()))
	close(intruded)

	deadline := time.After(testTimeout)
	for waiting := true; waiting; {
		select {
		case <-done:
			waiting = false
		case <-deadline:
			t.Fatal("the session's messages were not handled in time")
		case <-time.After(20 * time.Millisecond):
			require.Zero(t, sc.Health().Deferred, "the consumer held the message under its own record, written over the state written meanwhile")
		}
	}
	cancel()
	require.NoError(t, <-runErr)
	mu.Lock()
	assert.Equal(t, []string{"s-1", "s-2"}, successes, "in order, the first again since its hold was not written")
	mu.Unlock()
	r, err := e.client(t).AcceptSessionForQueue(t.Context(), e.queue, sid, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close(context.WithoutCancel(t.Context()))) }()
	raw, err := r.GetSessionState(t.Context(), nil)
	require.NoError(t, err)
	assert.Equal(t, string(theirs), string(raw), "the state written meanwhile is kept")
	assert.Zero(t, sc.Health().Deferred, "nothing was held under a record that is not the session's")
}
