// Package sbtest is the test harness shared by the packages whose tests drive the emulator through the
// real SDK: a collector of a consumer's results that tests wait on (e2e, inspect, cmd/sbretry), and for
// inspect and cmd/sbretry an emulator in one of two layouts (one queue, or the README's subscription
// with its retry queue), a client on it, a sender that batches, a retry.Consumer on the entity, and a
// seed that brings messages to known stages (pending, dead-lettered at the first or the last attempt).
//
// It is for tests only; it fails the test it is given rather than returning errors.
package sbtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// Timeout bounds every wait of a test.
const Timeout = 30 * time.Second

// Queue is the name of the harness's queue.
const Queue = "orders"

// The subscription layout of [NewSubscription], as the README sets it up: the topic Topic, its
// subscription Subscription, and RetryQueue, the queue the subscription's consumer schedules its retry
// copies on and receives them from.
const (
	Topic        = "events"
	Subscription = "billing"
	RetryQueue   = "billing-retry"
)

// SubscriptionPath is the entity path of the layout's subscription.
const SubscriptionPath = Topic + "/Subscriptions/" + Subscription

// FastRetries makes the SDK give up quickly on loopback.
var FastRetries = azservicebus.RetryOptions{MaxRetries: 2, RetryDelay: 20 * time.Millisecond, MaxRetryDelay: 200 * time.Millisecond}

// IgnoreSDKLeak is the goleak option for a known leak of the SDK. In azservicebus v1.11.0, when a
// dropped connection makes several calls recover links at once, each negotiates a claim and starts a
// token-renewal goroutine, but only the last one's cancel function is kept, so the others run on after
// the client is closed (internal/amqpLinks.go initWithoutLocking). It is the SDK's leak, not ours; see
// the note in TROUBLESHOOTING.md.
func IgnoreSDKLeak() goleak.Option {
	return goleak.IgnoreTopFunction("github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/internal.(*Namespace).startNegotiateClaimRenewer.func3")
}

// Harness is one emulator and a client on it, in one of two layouts: one queue ([Queue], from [New]),
// or a subscription with its retry queue ([NewSubscription]); duplicate detection is on everywhere. Both
// are closed when the test ends.
type Harness struct {
	Em     *sbemu.Emulator
	Client *azservicebus.Client
	// Entity is what the consumer receives from: [Queue], or [SubscriptionPath].
	Entity string
	// SendTo is where [Harness.Send] sends: the queue, or the topic.
	SendTo string
	// RetryQueue is the subscription's retry queue; empty in the queue layout.
	RetryQueue string
}

// New starts the one-queue harness of tb.
func New(tb testing.TB) *Harness {
	tb.Helper()
	h := start(tb, sbemu.Config{Queues: []broker.QueueConfig{{
		Name:                     Queue,
		DuplicateDetectionWindow: 10 * time.Minute,
	}}})
	h.Entity, h.SendTo = Queue, Queue
	return h
}

// NewSubscription starts the subscription layout of tb: the topic [Topic] with the subscription
// [Subscription], and the queue [RetryQueue].
func NewSubscription(tb testing.TB) *Harness {
	tb.Helper()
	dedup := 10 * time.Minute
	h := start(tb, sbemu.Config{
		Topics: []broker.TopicConfig{{Name: Topic, DuplicateDetectionWindow: dedup, Subscriptions: []broker.SubscriptionConfig{{Name: Subscription}}}},
		Queues: []broker.QueueConfig{{Name: RetryQueue, DuplicateDetectionWindow: dedup}},
	})
	h.Entity, h.SendTo, h.RetryQueue = SubscriptionPath, Topic, RetryQueue
	return h
}

func start(tb testing.TB, cfg sbemu.Config) *Harness {
	tb.Helper()
	em, err := sbemu.Start(cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, em.Close()) })
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), &azservicebus.ClientOptions{RetryOptions: FastRetries})
	require.NoError(tb, err)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), Timeout)
		defer cancel()
		_ = client.Close(ctx)
	})
	return &Harness{Em: em, Client: client}
}

// Send sends msgs to [Harness.SendTo], in as many batches as their size needs.
func (h *Harness) Send(tb testing.TB, msgs ...*azservicebus.Message) {
	tb.Helper()
	h.SendToEntity(tb, h.SendTo, msgs...)
}

// SendToEntity sends msgs to the queue or topic named entity, in as many batches as their size needs.
func (h *Harness) SendToEntity(tb testing.TB, entity string, msgs ...*azservicebus.Message) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	s, err := h.Client.NewSender(entity, nil)
	require.NoError(tb, err)
	defer func() { _ = s.Close(ctx) }()
	for len(msgs) > 0 {
		batch, err := s.NewMessageBatch(ctx, nil)
		require.NoError(tb, err)
		n := 0
		for _, m := range msgs {
			if err := batch.AddMessage(m, nil); err != nil {
				require.ErrorIs(tb, err, azservicebus.ErrMessageTooLarge)
				break
			}
			n++
		}
		require.Positive(tb, n, "a message does not fit in a batch of its own")
		require.NoError(tb, s.SendMessageBatch(ctx, batch, nil))
		msgs = msgs[n:]
	}
}

// Stats is the message counts of [Harness.Entity] in the emulator.
func (h *Harness) Stats(tb testing.TB) broker.Stats {
	tb.Helper()
	if h.RetryQueue == "" {
		return h.QueueStats(tb, Queue)
	}
	q, ok := h.Em.Broker().Subscription(Topic, Subscription)
	require.True(tb, ok)
	return q.Stats()
}

// QueueStats is the message counts of the queue name in the emulator.
func (h *Harness) QueueStats(tb testing.TB, name string) broker.Stats {
	tb.Helper()
	q, ok := h.Em.Broker().Queue(name)
	require.True(tb, ok)
	return q.Stats()
}

// Message is a message with MessageID id and a small JSON body naming it.
func Message(id string) *azservicebus.Message {
	return &azservicebus.Message{MessageID: &id, Body: []byte(`{"id":"` + id + `"}`)}
}

// Outcomes collects a consumer's results (its OnProcessed hook) and wakes waiters on every one.
type Outcomes struct {
	mu      sync.Mutex
	results []retry.ProcessedParams
	changed chan struct{}
}

// NewOutcomes returns an empty collection.
func NewOutcomes() *Outcomes { return &Outcomes{changed: make(chan struct{}, 1)} }

// Hook records p; it is a consumer's OnProcessed hook.
func (o *Outcomes) Hook(p retry.ProcessedParams) {
	o.mu.Lock()
	o.results = append(o.results, p)
	o.mu.Unlock()
	select {
	case o.changed <- struct{}{}:
	default:
	}
}

// Snapshot returns a copy of the results so far, in the order they were recorded.
func (o *Outcomes) Snapshot() []retry.ProcessedParams {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]retry.ProcessedParams(nil), o.results...)
}

// WaitFor blocks until cond holds over the results, failing tb after [Timeout].
func (o *Outcomes) WaitFor(tb testing.TB, what string, cond func([]retry.ProcessedParams) bool) {
	tb.Helper()
	deadline := time.NewTimer(Timeout)
	defer deadline.Stop()
	for !cond(o.Snapshot()) {
		select {
		case <-o.changed:
		case <-deadline.C:
			tb.Fatalf("timed out waiting for %s; results: %v", what, Summarize(o.Snapshot()))
		}
	}
}

// Summarize names each result as MessageID#attempt:outcome, for failure messages and logs.
func Summarize(ps []retry.ProcessedParams) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		id := "?"
		if p.Message != nil {
			id = p.Message.MessageID
		}
		out[i] = fmt.Sprintf("%s#%d:%s", id, p.Result.Attempt, p.Result.Outcome)
	}
	return out
}

// Result returns the last result with outcome for the message whose original MessageID is id.
func Result(ps []retry.ProcessedParams, id string, outcome retry.Outcome) (retry.Result, bool) {
	for i := len(ps) - 1; i >= 0; i-- {
		if ps[i].Envelope.OriginalMessageID == id && ps[i].Result.Outcome == outcome {
			return ps[i].Result, true
		}
	}
	return retry.Result{}, false
}

// CountOutcome counts the results with outcome.
func CountOutcome(ps []retry.ProcessedParams, outcome retry.Outcome) int {
	n := 0
	for _, p := range ps {
		if p.Result.Outcome == outcome {
			n++
		}
	}
	return n
}

// Consumer is a retry.Consumer running on the harness's queue. Stop ends it and waits for Run to
// return; it is called again, harmlessly, when the test ends.
type Consumer struct {
	Out  *Outcomes
	Stop func()
}

// StartConsumer runs a consumer of [Harness.Entity] with handler and opts, whose OnProcessed hook and Logger
// it replaces (the logs are discarded) and whose SettleTimeout defaults to 5 s.
func (h *Harness) StartConsumer(tb testing.TB, handler retry.Handler, opts retry.Options) *Consumer {
	tb.Helper()
	copts := &retry.ConnectOptions{Client: &azservicebus.ClientOptions{RetryOptions: FastRetries}}
	var connect retry.Connector
	var err error
	if h.RetryQueue == "" {
		connect, err = retry.NewNamespace(h.Em.ConnectionString(), copts).Queue(Queue)
	} else {
		connect, err = retry.NewNamespace(h.Em.ConnectionString(), copts).Subscription(Topic, Subscription, h.RetryQueue)
	}
	require.NoError(tb, err)
	out := NewOutcomes()
	opts.Hooks.OnProcessed = out.Hook
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if opts.SettleTimeout == 0 {
		opts.SettleTimeout = 5 * time.Second
	}
	c, err := retry.NewConsumer(connect, handler, &opts)
	require.NoError(tb, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	stop := sync.OnceFunc(func() {
		cancel()
		timeout := time.NewTimer(Timeout)
		defer timeout.Stop()
		select {
		case err := <-done:
			assert.NoError(tb, err)
		case <-timeout.C:
			tb.Error("consumer did not stop")
		}
	})
	tb.Cleanup(stop)
	return &Consumer{Out: out, Stop: stop}
}

// Context returns a context that ends after [Timeout] or when the test ends.
func Context(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	tb.Cleanup(cancel)
	return ctx
}

// ErrDownstream is the error of the "pending-*" messages of [Harness.Seed].
var ErrDownstream = errors.New("downstream unavailable")

// Seed sends one message per id (with the application property tenant=acme, and the CorrelationID
// "corr-" + id) and runs a consumer until each reached its stage: "pending-*" fail once with
// [ErrDownstream] and are retried in an hour, "perm-*" fail permanently at their first attempt, "max-*"
// fail every attempt (MaxAttempts 2, so they are dead-lettered after one retry: in the subscription
// layout, from the retry queue). It returns the consumer's results.
func (h *Harness) Seed(tb testing.TB, ids ...string) []retry.ProcessedParams {
	tb.Helper()
	msgs := make([]*azservicebus.Message, len(ids))
	for i, id := range ids {
		msgs[i] = Message(id)
		msgs[i].ApplicationProperties = map[string]any{"tenant": "acme"}
		corr := "corr-" + id
		msgs[i].CorrelationID = &corr
	}
	h.Send(tb, msgs...)
	c := h.StartConsumer(tb, func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		env, _ := envelope.FromContext(ctx)
		id := env.OriginalMessageID
		switch {
		case strings.HasPrefix(id, "pending-"):
			return ErrDownstream // the backoff: an hour
		case strings.HasPrefix(id, "perm-"):
			return retry.Permanent(errors.New("invalid payload in " + id))
		case strings.HasPrefix(id, "max-"):
			return retry.RetryAfter(10*time.Millisecond, errors.New("timeout calling the ledger"))
		}
		return nil
	}, retry.Options{MaxAttempts: 2, Backoff: backoff.Constant{Interval: time.Hour}, MaxConcurrency: 8})
	c.Out.WaitFor(tb, "every message at its stage", func(ps []retry.ProcessedParams) bool {
		for _, id := range ids {
			want := retry.OutcomeDeadLettered
			if strings.HasPrefix(id, "pending-") {
				want = retry.OutcomeRetryScheduled
			}
			if _, ok := Result(ps, id, want); !ok {
				return false
			}
		}
		return true
	})
	c.Stop()
	return c.Out.Snapshot()
}
