//go:build !live

package e2e

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// topicEnv is an emulator with the topic "orders", subscriptions a and b (each with its retry queue)
// consumed with this library, and c, a plain consumer of someone else's.
type topicEnv struct {
	em      *sbemu.Emulator
	connStr string
}

func newTopicEnv(t *testing.T, subs []broker.SubscriptionConfig, queues ...broker.QueueConfig) *topicEnv {
	t.Helper()
	em := sbemu.StartT(t, sbemu.Config{
		Topics: []broker.TopicConfig{{Name: "orders", DuplicateDetectionWindow: 10 * time.Minute, Subscriptions: subs}},
		Queues: queues,
	})
	return &topicEnv{em: em, connStr: em.ConnectionString()}
}

func retryQueueConfig(name string) broker.QueueConfig {
	return broker.QueueConfig{Name: name, DuplicateDetectionWindow: 10 * time.Minute}
}

func (te *topicEnv) client(t *testing.T) *azservicebus.Client {
	t.Helper()
	c, err := azservicebus.NewClientFromConnectionString(te.connStr, &azservicebus.ClientOptions{RetryOptions: fastRetries})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func (te *topicEnv) publish(t *testing.T, msgs ...*azservicebus.Message) {
	t.Helper()
	s, err := te.client(t).NewSender("orders", nil)
	require.NoError(t, err)
	for _, m := range msgs {
		require.NoError(t, s.SendMessage(t.Context(), m, nil))
	}
}

// attempts records, per message id, the attempts a consumer saw.
type attempts struct {
	mu   sync.Mutex
	seen map[string][]int
}

func (a *attempts) add(id string, n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.seen == nil {
		a.seen = map[string][]int{}
	}
	a.seen[id] = append(a.seen[id], n)
}

func (a *attempts) get() map[string][]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string][]int{}
	for k, v := range a.seen {
		out[k] = append([]int(nil), v...)
	}
	return out
}

// startSubscriber runs a retry.Consumer on one subscription with its retry queue. The handler fails the
// first fails attempts of every message.
func startSubscriber(t *testing.T, te *topicEnv, sub, retryQueue string, fails int, seen *attempts, opts *retry.Options) *retry.Consumer {
	t.Helper()
	connect, err := retry.NewNamespace(te.connStr, &retry.ConnectOptions{
		Client: &azservicebus.ClientOptions{RetryOptions: fastRetries},
	}).Subscription("orders", sub, retryQueue)
	require.NoError(t, err)
	if opts == nil {
		opts = &retry.Options{}
	}
	opts.Backoff = backoff.Fibonacci{Base: 100 * time.Millisecond, Cap: time.Second}
	opts.SettleTimeout = 5 * time.Second
	opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn + 100}))
	c, err := retry.NewConsumer(connect, func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		env, _ := envelope.FromContext(ctx)
		seen.add(env.OriginalMessageID, env.Attempt)
		if env.Attempt <= fails {
			return errBoom
		}
		return nil
	}, opts)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	return c
}

// drainPlain receives everything subscription c holds until it stays empty for quiet.
func drainPlain(t *testing.T, te *topicEnv, sub string, quiet time.Duration) []*azservicebus.ReceivedMessage {
	t.Helper()
	r, err := te.client(t).NewReceiverForSubscription("orders", sub, nil)
	require.NoError(t, err)
	var got []*azservicebus.ReceivedMessage
	for {
		ctx, cancel := context.WithTimeout(t.Context(), quiet)
		msgs, err := r.ReceiveMessages(ctx, 10, nil)
		cancel()
		if err != nil || len(msgs) == 0 {
			return got
		}
		for _, m := range msgs {
			require.NoError(t, r.CompleteMessage(t.Context(), m, nil))
		}
		got = append(got, msgs...)
	}
}

// entityEmpty reports whether nothing is left in q: no message available, locked, scheduled or dead.
func entityEmpty(q *broker.Queue) bool {
	st := q.Stats()
	return st.Active == 0 && st.Locked == 0 && st.Scheduled == 0 && st.DeadLettered == 0
}

// The scenario: a topic with three subscriptions, two consumed with this library (different
// handlers) and one plain consumer with the default TrueFilter. A message fails once on a, twice on b:
// a sees attempts 1, 2; b sees 1, 2, 3; c sees exactly one delivery; nothing is left anywhere.
func TestTopicRetriesReachOnlyTheFailingSubscription(t *testing.T) {
	parallel(t)
	te := newTopicEnv(t,
		[]broker.SubscriptionConfig{{Name: "a"}, {Name: "b"}, {Name: "c"}},
		retryQueueConfig("orders-a-retry"), retryQueueConfig("orders-b-retry"))
	var seenA, seenB attempts
	startSubscriber(t, te, "a", "orders-a-retry", 1, &seenA, nil)
	startSubscriber(t, te, "b", "orders-b-retry", 2, &seenB, nil)
	te.publish(t, sbtest.Message("order-1"))

	require.Eventually(t, func() bool {
		return len(seenA.get()["order-1"]) == 2 && len(seenB.get()["order-1"]) == 3
	}, testTimeout, 10*time.Millisecond)
	c := drainPlain(t, te, "c", time.Second)
	require.Len(t, c, 1, "the plain subscriber got the message once, and no retry copy")
	assert.Equal(t, "order-1", c[0].MessageID)
	assert.NotContains(t, c[0].ApplicationProperties, envelope.PropAttempt)

	b := te.em.Broker()
	require.Eventually(t, func() bool {
		for _, name := range []string{"orders-a-retry", "orders-b-retry"} {
			q, _ := b.Queue(name)
			if !entityEmpty(q) {
				return false
			}
		}
		for _, s := range []string{"a", "b", "c"} {
			q, _ := b.Subscription("orders", s)
			if !entityEmpty(q) {
				return false
			}
		}
		return true
	}, testTimeout, 10*time.Millisecond, "nothing left anywhere")
	assert.Equal(t, map[string][]int{"order-1": {1, 2}}, seenA.get())
	assert.Equal(t, map[string][]int{"order-1": {1, 2, 3}}, seenB.get())
	t.Logf("a saw %v, b saw %v, c saw %d delivery", seenA.get(), seenB.get(), len(c))
}

// TestSubscriptionReceiversKeepPeekLock: as for a queue (TestReceiverOptionsKeepPeekLock), a
// subscription connection passes ConnectOptions.Receiver on but receives in PeekLock, on the
// subscription and on its retry queue: attempt 1 comes from the subscription and attempt 2 from the
// retry queue, and each is completed after its copy is scheduled.
func TestSubscriptionReceiversKeepPeekLock(t *testing.T) {
	parallel(t)
	te := newTopicEnv(t, []broker.SubscriptionConfig{{Name: "a"}}, retryQueueConfig("orders-a-retry"))
	connect, err := retry.NewNamespace(te.connStr, &retry.ConnectOptions{
		Client:   &azservicebus.ClientOptions{RetryOptions: fastRetries},
		Receiver: &azservicebus.ReceiverOptions{ReceiveMode: azservicebus.ReceiveModeReceiveAndDelete},
	}).Subscription("orders", "a", "orders-a-retry")
	require.NoError(t, err)
	out := sbtest.NewOutcomes()
	runConsumer(t, connect, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
		if env, _ := envelope.FromContext(ctx); env.Attempt < 3 {
			return errBoom
		}
		return nil
	}, &retry.Options{Backoff: backoff.Constant{Interval: 50 * time.Millisecond}, SettleTimeout: 5 * time.Second, Hooks: retry.Hooks{OnProcessed: out.Hook}})
	te.publish(t, sbtest.Message("mode-2"))
	out.WaitFor(t, "attempt 3 completed", func(ps []retry.ProcessedParams) bool {
		return count(ps, "mode-2", retry.OutcomeCompleted) == 1
	})
	ps := out.Snapshot()
	require.Len(t, ps, 3, "%v", sbtest.Summarize(ps))
	for i, p := range ps[:2] {
		assert.Equal(t, i+1, p.Result.Attempt)
		assert.Equal(t, retry.OutcomeRetryScheduled, p.Result.Outcome)
		assert.NoError(t, p.Result.SettleErr, "attempt %d was completed after its copy was scheduled", i+1)
	}
	b := te.em.Broker()
	sub, _ := b.Subscription("orders", "a")
	rq, _ := b.Queue("orders-a-retry")
	require.Eventually(t, func() bool { return entityEmpty(sub) && entityEmpty(rq) }, testTimeout, 10*time.Millisecond)
}

// The zero-code layout: a subscription forwards to a queue, and a queue consumer retries on that queue.
// The other subscription never sees a copy.
func TestSubscriptionForwardingToAQueue(t *testing.T) {
	parallel(t)
	te := newTopicEnv(t,
		[]broker.SubscriptionConfig{{Name: "a", ForwardTo: "orders-a"}, {Name: "c"}},
		retryQueueConfig("orders-a"))
	var seen attempts
	connect, err := retry.NewNamespace(te.connStr, &retry.ConnectOptions{Client: &azservicebus.ClientOptions{RetryOptions: fastRetries}}).Queue("orders-a")
	require.NoError(t, err)
	c, err := retry.NewConsumer(connect, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
		env, _ := envelope.FromContext(ctx)
		seen.add(env.OriginalMessageID, env.Attempt)
		if env.Attempt == 1 {
			return errBoom
		}
		return nil
	}, &retry.Options{Backoff: backoff.Fibonacci{Base: 100 * time.Millisecond, Cap: time.Second}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() { cancel(); assert.NoError(t, <-done) })

	te.publish(t, sbtest.Message("order-2"))
	require.Eventually(t, func() bool { return len(seen.get()["order-2"]) == 2 }, testTimeout, 10*time.Millisecond)
	assert.Len(t, drainPlain(t, te, "c", time.Second), 1)
	q, _ := te.em.Broker().Queue("orders-a")
	require.Eventually(t, func() bool { return entityEmpty(q) }, testTimeout, 10*time.Millisecond)
	assert.Equal(t, []int{1, 2}, seen.get()["order-2"])
}

// Subscriptions with a correlation filter and a SQL filter still get their retries: the copies go to
// the retry queue, which no filter stands in front of.
func TestFilteredSubscriptionsGetTheirRetries(t *testing.T) {
	parallel(t)
	te := newTopicEnv(t,
		[]broker.SubscriptionConfig{
			{Name: "eu", Rules: []broker.RuleConfig{{Name: "eu", CorrelationFilter: &broker.CorrelationFilter{Subject: "eu"}}}},
			{Name: "big", Rules: []broker.RuleConfig{{Name: "big", SQLFilter: "amount > 100"}}},
		},
		retryQueueConfig("eu-retry"), retryQueueConfig("big-retry"))
	var eu, big attempts
	startSubscriber(t, te, "eu", "eu-retry", 1, &eu, nil)
	startSubscriber(t, te, "big", "big-retry", 1, &big, nil)
	subject := "eu"
	te.publish(t,
		&azservicebus.Message{MessageID: strPtr("m-eu-small"), Subject: &subject, ApplicationProperties: map[string]any{"amount": int64(5)}},
		&azservicebus.Message{MessageID: strPtr("m-us-big"), ApplicationProperties: map[string]any{"amount": int64(500)}},
	)
	require.Eventually(t, func() bool {
		return len(eu.get()["m-eu-small"]) == 2 && len(big.get()["m-us-big"]) == 2
	}, testTimeout, 10*time.Millisecond)
	assert.Equal(t, map[string][]int{"m-eu-small": {1, 2}}, eu.get())
	assert.Equal(t, map[string][]int{"m-us-big": {1, 2}}, big.get())
}

// After MaxAttempts the message is dead-lettered in the retry queue's dead-letter queue (its last
// attempt came from there) with our reason, and the inspector finds it by its original id.
func TestSubscriptionDeadLetterFoundByTheInspector(t *testing.T) {
	parallel(t)
	te := newTopicEnv(t, []broker.SubscriptionConfig{{Name: "a"}}, retryQueueConfig("orders-a-retry"))
	var seen attempts
	out := sbtest.NewOutcomes()
	startSubscriber(t, te, "a", "orders-a-retry", 100, &seen, &retry.Options{MaxAttempts: 3, Hooks: retry.Hooks{OnProcessed: out.Hook}})
	te.publish(t, sbtest.Message("poison-7"))
	out.WaitFor(t, "the dead letter", func(ps []retry.ProcessedParams) bool {
		for _, p := range ps {
			if p.Result.Outcome == retry.OutcomeDeadLettered {
				return true
			}
		}
		return false
	})
	q, _ := te.em.Broker().Queue("orders-a-retry")
	require.Eventually(t, func() bool { return q.Stats().DeadLettered == 1 }, testTimeout, 10*time.Millisecond)

	in, err := inspect.New(te.client(t), retry.SubscriptionPath("orders", "a"), &inspect.Options{RetryQueue: "orders-a-retry"})
	require.NoError(t, err)
	st, err := in.Status(t.Context(), "poison-7")
	require.NoError(t, err)
	require.Len(t, st.DeadLetters, 1, "%+v", st)
	assert.Equal(t, "RetryMaxAttemptsExceeded", st.DeadLetters[0].Reason)
	assert.Equal(t, 3, st.DeadLetters[0].Attempt)
	assert.Equal(t, []int{1, 2, 3}, seen.get()["poison-7"])
}

// A dropped connection between schedule and complete on a subscription: no fork (one copy per attempt)
// and no loss (the chain completes).
func TestSubscriptionDropBetweenScheduleAndComplete(t *testing.T) {
	parallel(t)
	te := newTopicEnv(t, []broker.SubscriptionConfig{{Name: "a"}}, retryQueueConfig("orders-a-retry"))
	var seen attempts
	dropped := make(chan struct{})
	var once sync.Once
	startSubscriber(t, te, "a", "orders-a-retry", 1, &seen, &retry.Options{Hooks: retry.Hooks{OnSettle: func(p retry.SettleParams) {
		if p.Operation == retry.SettleSchedule && p.Err == nil {
			once.Do(func() { te.em.DropConnections(); close(dropped) }) // the complete that follows is lost
		}
	}}})
	te.publish(t, sbtest.Message("order-9"))
	<-dropped
	require.Eventually(t, func() bool { return len(seen.get()["order-9"]) >= 2 }, testTimeout, 10*time.Millisecond)
	b := te.em.Broker()
	sub, _ := b.Subscription("orders", "a")
	rq, _ := b.Queue("orders-a-retry")
	require.Eventually(t, func() bool { return entityEmpty(sub) && entityEmpty(rq) }, testTimeout, 10*time.Millisecond)
	got := seen.get()["order-9"]
	assert.Equal(t, 1, countAttempt(got, 2), "attempt 2 ran once: one successor, no fork (%v)", got)
	assert.Equal(t, 1, countAttempt(got, 1), "the redelivered attempt 1 was completed without running again (%v)", got)
}

// countAttempt counts the runs of attempt n in attempts.
func countAttempt(attempts []int, n int) int {
	c := 0
	for _, a := range attempts {
		if a == n {
			c++
		}
	}
	return c
}

// Start-up checks name what is wrong before a message is touched: a missing retry queue, and a key that
// cannot send to it.
func TestSubscriptionStartupChecks(t *testing.T) {
	parallel(t)
	te := newTopicEnv(t, []broker.SubscriptionConfig{{Name: "a"}}, retryQueueConfig("orders-a-retry"))
	run := func(retryQueue string) error {
		connect, err := retry.NewNamespace(te.connStr, &retry.ConnectOptions{
			Client: &azservicebus.ClientOptions{RetryOptions: fastRetries},
		}).Subscription("orders", "a", retryQueue)
		require.NoError(t, err)
		c, err := retry.NewConsumer(connect, okHandler, &retry.Options{Logger: slog.New(slog.DiscardHandler), SettleTimeout: 5 * time.Second})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
		defer cancel()
		return c.Run(ctx)
	}
	err := run("no-such-retry-queue")
	require.ErrorIs(t, err, retry.ErrEntityNotFound)
	assert.ErrorContains(t, err, "retry queue")

	te.em.RejectNextManagement(1, "com.microsoft:schedule-message", 401)
	assert.ErrorIs(t, run("orders-a-retry"), retry.ErrUnauthorized)

	_, err = retry.NewNamespace(te.connStr, nil).Subscription("orders", "a", "")
	assert.ErrorIs(t, err, retry.ErrInvalidOptions, "a subscription needs a retry queue")
	_, err = retry.NewNamespace(te.connStr, nil).Subscription("orders", "a", "orders")
	assert.ErrorIs(t, err, retry.ErrInvalidOptions, "the retry queue must not be the topic")
}
