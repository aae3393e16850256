//go:build !live

package e2e

import (
	"context"
	"fmt"
	"slices"
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
)

// Per-session order through the real SDK on the emulator: 20 sessions of 20 messages, four held at
// once; every fifth message of each session fails twice and is retried in place. Each session's
// successes must be in sequence, no message may run before its predecessor succeeded, and the retries
// in place come late by no more than the logged p99 (actual call minus planned: failure + delay).
func TestSessionOrderAcrossTransientFailures(t *testing.T) {
	parallel(t)
	const (
		sessions   = 20
		perSession = 20
		delay      = 50 * time.Millisecond
	)
	em, err := sbemu.Start(sbemu.Config{Queues: []broker.QueueConfig{{Name: "sessions", RequiresSession: true, LockDuration: 10 * time.Second}}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, em.Close()) })
	e := &env{connStr: em.ConnectionString(), queue: "sessions", em: em}

	sender, err := e.client(t).NewSender(e.queue, nil)
	require.NoError(t, err)
	for i := range perSession {
		for s := range sessions {
			sid := fmt.Sprintf("s%02d", s)
			id := fmt.Sprintf("%s-%02d", sid, i)
			require.NoError(t, sender.SendMessage(t.Context(), &azservicebus.Message{MessageID: &id, SessionID: &sid, Body: []byte(strconv.Itoa(i))}, nil))
		}
	}

	var (
		mu        sync.Mutex
		next      = map[string]int{} // per session, the index of the next message allowed to succeed
		failedAt  = map[string]time.Time{}
		lateness  []time.Duration
		outOfTurn []string
		done      = make(chan struct{})
		succeeded int
	)
	handler := func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		sid, _ := retry.SessionIDFromContext(ctx)
		env, _ := envelope.FromContext(ctx)
		i, _ := strconv.Atoi(string(m.Body))
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if at, ok := failedAt[m.MessageID]; ok {
			lateness = append(lateness, now.Sub(at)-delay)
			delete(failedAt, m.MessageID)
		}
		if i != next[sid] {
			outOfTurn = append(outOfTurn, fmt.Sprintf("%s ran while %d was next", m.MessageID, next[sid]))
		}
		if i%5 == 2 && env.Attempt < 3 {
			failedAt[m.MessageID] = time.Now()
			return errBoom
		}
		next[sid] = i + 1
		succeeded++
		if succeeded == sessions*perSession {
			close(done)
		}
		return nil
	}
	connect, err := retry.NewNamespace(e.connStr, &retry.ConnectOptions{
		Client: &azservicebus.ClientOptions{RetryOptions: fastRetries},
	}).SessionQueue(e.queue)
	require.NoError(t, err)
	var processed sync.Map
	sc, err := retry.NewSessionConsumer(connect, handler, &retry.Options{
		Backoff: backoff.Constant{Interval: delay}, SettleTimeout: 5 * time.Second, Logger: quietLogger(),
		Hooks: retry.Hooks{OnProcessed: func(p retry.ProcessedParams) {
			n, _ := processed.LoadOrStore(p.Message.MessageID, new(int))
			*n.(*int)++
		}},
	}, &retry.SessionOptions{MaxConcurrentSessions: 4, SessionIdleTimeout: 500 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	runErr := make(chan error, 1)
	start := time.Now()
	go func() { runErr <- sc.Run(ctx) }()
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatal("the sessions were not drained in time")
	}
	elapsed := time.Since(start)
	cancel()
	require.NoError(t, <-runErr)

	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, outOfTurn, "no message runs before its predecessor succeeded")
	for s := range sessions {
		assert.Equal(t, perSession, next[fmt.Sprintf("s%02d", s)])
	}
	h := sc.Health()
	assert.Equal(t, uint64(sessions*perSession), h.Completed)
	assert.Zero(t, h.DeadLettered)
	assert.Zero(t, h.LeftForRedelivery)
	require.Len(t, lateness, sessions*(perSession/5)*2, "two retries in place of every fifth message")
	slices.Sort(lateness)
	p50, p99, worst := lateness[len(lateness)/2], lateness[len(lateness)*99/100], lateness[len(lateness)-1]
	t.Logf("hold-in-place lateness over %d retries (delay %v): p50 %v, p99 %v, max %v; %d messages in %v",
		len(lateness), delay, p50, p99, worst, sessions*perSession, elapsed.Round(time.Millisecond))
	for _, l := range lateness {
		require.GreaterOrEqual(t, l, time.Duration(0), "never early")
	}
	n := 0
	processed.Range(func(_, v any) bool {
		assert.Equal(t, 1, *v.(*int), "OnProcessed once per message")
		n++
		return true
	})
	assert.Equal(t, sessions*perSession, n)
}

// A session lock lost through the SDK (the emulator expires it and detaches the link). The SDK's
// recovery re-locks the session for the same receiver on the next renewal, which then succeeds, so the
// consumer cannot tell before it settles: the complete of the message received under the old lock
// fails (bounded by SettleTimeout), the message is left unsettled, the session released, and its
// messages come back in order. The first's success was decided in this process, so its redelivery is
// completed without running the handler again (flights.go); nothing runs out of order.
func TestSessionLockLostThroughTheSDK(t *testing.T) {
	parallel(t)
	em, err := sbemu.Start(sbemu.Config{Queues: []broker.QueueConfig{{Name: "sessions", RequiresSession: true, LockDuration: 4 * time.Second}}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, em.Close()) })
	e := &env{connStr: em.ConnectionString(), queue: "sessions", em: em}
	sender, err := e.client(t).NewSender(e.queue, nil)
	require.NoError(t, err)
	sid := "s"
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("s-%d", i)
		require.NoError(t, sender.SendMessage(t.Context(), &azservicebus.Message{MessageID: &id, SessionID: &sid, Body: []byte("x")}, nil))
	}

	var (
		mu        sync.Mutex
		successes []string
		counts    []uint32
		results   []retry.Result
		started   = make(chan struct{})
		expired   = make(chan struct{})
		done      = make(chan struct{})
	)
	handler := func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		mu.Lock()
		first := len(successes) == 0
		mu.Unlock()
		if first {
			close(started)
			<-expired
		}
		mu.Lock()
		defer mu.Unlock()
		successes = append(successes, m.MessageID)
		counts = append(counts, m.DeliveryCount)
		if m.MessageID == "s-3" {
			close(done)
		}
		return nil
	}
	connect, err := retry.NewNamespace(e.connStr, &retry.ConnectOptions{
		Client: &azservicebus.ClientOptions{RetryOptions: fastRetries},
	}).SessionQueue(e.queue)
	require.NoError(t, err)
	sc, err := retry.NewSessionConsumer(connect, handler, &retry.Options{
		SettleTimeout: 3 * time.Second, Logger: quietLogger(),
		Hooks: retry.Hooks{OnProcessed: func(p retry.ProcessedParams) {
			mu.Lock()
			results = append(results, p.Result)
			mu.Unlock()
		}},
	}, &retry.SessionOptions{MaxConcurrentSessions: 1})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	runErr := make(chan error, 1)
	go func() { runErr <- sc.Run(ctx) }()
	<-started
	lostAt := time.Now()
	em.Broker().ExpireAllLocks()
	close(expired)
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatal("the session was not handled again in time")
	}
	t.Logf("lock lost to the session handled again: %v", time.Since(lostAt).Round(time.Millisecond))
	cancel()
	require.NoError(t, <-runErr)
	mu.Lock()
	defer mu.Unlock()
	// s-1's complete failed with the lock; its redelivery is completed as decided, without running the
	// handler again (flights.go), and before s-2.
	assert.Equal(t, []string{"s-1", "s-2", "s-3"}, successes, "in order, each handler once")
	assert.Equal(t, []uint32{1, 1, 1}, counts)
	require.Len(t, results, 4)
	assert.Equal(t, retry.OutcomeLeftForRedelivery, results[0].Outcome)
	assert.Error(t, results[0].SettleErr)
	assert.True(t, results[1].Inherited, "the redelivery of s-1 applied the decided success")
	assert.Equal(t, retry.OutcomeCompleted, results[1].Outcome)
	assert.Equal(t, uint64(3), sc.Health().Completed)
	assert.Equal(t, uint64(1), sc.Health().LeftForRedelivery)
}

// A session-enabled subscription through Namespace.SessionSubscription: per-session order with
// retries in place, the entity path naming the subscription.
func TestSessionSubscriptionOrder(t *testing.T) {
	parallel(t)
	const sessions, perSession = 3, 6
	em, err := sbemu.Start(sbemu.Config{Topics: []broker.TopicConfig{{Name: "events",
		Subscriptions: []broker.SubscriptionConfig{{Name: "billing", RequiresSession: true}}}}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, em.Close()) })
	e := &env{connStr: em.ConnectionString(), queue: "events", em: em}
	sender, err := e.client(t).NewSender("events", nil)
	require.NoError(t, err)
	for i := range perSession {
		for s := range sessions {
			sid := fmt.Sprintf("s%d", s)
			id := fmt.Sprintf("%s-%d", sid, i)
			require.NoError(t, sender.SendMessage(t.Context(), &azservicebus.Message{MessageID: &id, SessionID: &sid, Body: []byte(strconv.Itoa(i))}, nil))
		}
	}
	var (
		mu       sync.Mutex
		got      = map[string][]int{}
		entities = map[string]bool{}
		done     = make(chan struct{})
		total    int
	)
	handler := func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		sid, _ := retry.SessionIDFromContext(ctx)
		env, _ := envelope.FromContext(ctx)
		i, _ := strconv.Atoi(string(m.Body))
		if i == 1 && env.Attempt == 1 {
			return errBoom
		}
		mu.Lock()
		defer mu.Unlock()
		got[sid] = append(got[sid], i)
		if total++; total == sessions*perSession {
			close(done)
		}
		return nil
	}
	connect, err := retry.NewNamespace(e.connStr, &retry.ConnectOptions{
		Client: &azservicebus.ClientOptions{RetryOptions: fastRetries},
	}).SessionSubscription("events", "billing")
	require.NoError(t, err)
	sc, err := retry.NewSessionConsumer(connect, handler, &retry.Options{
		Backoff: backoff.Constant{Interval: 20 * time.Millisecond}, SettleTimeout: 5 * time.Second, Logger: quietLogger(),
		Hooks: retry.Hooks{OnProcessed: func(p retry.ProcessedParams) {
			mu.Lock()
			entities[p.EntityPath] = true
			mu.Unlock()
		}},
	}, &retry.SessionOptions{MaxConcurrentSessions: 2, SessionIdleTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	runErr := make(chan error, 1)
	go func() { runErr <- sc.Run(ctx) }()
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatal("the subscription's sessions were not drained in time")
	}
	cancel()
	require.NoError(t, <-runErr)
	mu.Lock()
	defer mu.Unlock()
	for s := range sessions {
		assert.Equal(t, []int{0, 1, 2, 3, 4, 5}, got[fmt.Sprintf("s%d", s)])
	}
	assert.Equal(t, map[string]bool{"events/Subscriptions/billing": true}, entities)
}

// Many sessions, few held at once: 1,000 sessions of one message each through 8 workers, each session
// released one SessionIdleTimeout after its message.
func TestSessionManySessions(t *testing.T) {
	parallel(t)
	const sessions = 1000
	em, err := sbemu.Start(sbemu.Config{Queues: []broker.QueueConfig{{Name: "sessions", RequiresSession: true}}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, em.Close()) })
	e := &env{connStr: em.ConnectionString(), queue: "sessions", em: em}
	sender, err := e.client(t).NewSender(e.queue, nil)
	require.NoError(t, err)
	for s := 0; s < sessions; s += 100 {
		batch, err := sender.NewMessageBatch(t.Context(), nil)
		require.NoError(t, err)
		for i := s; i < s+100; i++ {
			sid := fmt.Sprintf("s%04d", i)
			require.NoError(t, batch.AddMessage(&azservicebus.Message{MessageID: &sid, SessionID: &sid, Body: []byte("x")}, nil))
		}
		require.NoError(t, sender.SendMessageBatch(t.Context(), batch, nil))
	}
	var (
		mu   sync.Mutex
		seen = map[string]int{}
		done = make(chan struct{})
	)
	handler := func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		sid, _ := retry.SessionIDFromContext(ctx)
		mu.Lock()
		defer mu.Unlock()
		if seen[sid]++; len(seen) == sessions && seen[sid] == 1 {
			close(done)
		}
		return nil
	}
	connect, err := retry.NewNamespace(e.connStr, &retry.ConnectOptions{
		Client: &azservicebus.ClientOptions{RetryOptions: fastRetries},
	}).SessionQueue(e.queue)
	require.NoError(t, err)
	sc, err := retry.NewSessionConsumer(connect, handler, &retry.Options{SettleTimeout: 5 * time.Second, Logger: quietLogger()},
		&retry.SessionOptions{MaxConcurrentSessions: 8, SessionIdleTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	runErr := make(chan error, 1)
	start := time.Now()
	go func() { runErr <- sc.Run(ctx) }()
	// It takes about 8 s on an idle 2-core machine, and more than 60 s on one loaded by other suites (808
	// of the 1,000 were done at 60 s once). The bound catches a stall, not a slow machine.
	select {
	case <-done:
	case <-time.After(5 * testTimeout):
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		t.Fatalf("only %d of %d sessions handled in time", n, sessions)
	}
	t.Logf("%d sessions through 8 workers (idle timeout 50ms) in %v", sessions, time.Since(start).Round(time.Millisecond))
	cancel()
	require.NoError(t, <-runErr)
	mu.Lock()
	defer mu.Unlock()
	for sid, n := range seen {
		assert.Equal(t, 1, n, sid)
	}
	assert.Equal(t, uint64(sessions), sc.Health().Completed)
}

// Through the SDK, a session consumer on a queue that is not session-enabled ends Run at once with an
// error that says so, rather than reconnecting for ever.
func TestSessionConsumerOnPlainQueueRefused(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{})
	connect, err := retry.NewNamespace(e.connStr, &retry.ConnectOptions{
		Client: &azservicebus.ClientOptions{RetryOptions: fastRetries},
	}).SessionQueue(e.queue)
	require.NoError(t, err)
	sc, err := retry.NewSessionConsumer(connect, func(context.Context, *azservicebus.ReceivedMessage) error { return nil },
		&retry.Options{Logger: quietLogger()}, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	err = sc.Run(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "session-enabled")
	assert.NoError(t, ctx.Err(), "refused at once, not at the test's deadline")
}
