package inspect

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// azservicebus v1.11.0 leaks a token-renewal goroutine when several calls recover links at once
		// (internal/amqpLinks.go initWithoutLocking); see e2e/e2e_test.go and the README's note.
		goleak.IgnoreTopFunction("github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/internal.(*Namespace).startNegotiateClaimRenewer.func3"),
	)
}

// testTimeout bounds every wait of a test.
const testTimeout = 30 * time.Second

const queueName = "orders"

var errBoom = errors.New("downstream unavailable")

// fastRetries makes the SDK give up quickly on loopback.
var fastRetries = azservicebus.RetryOptions{MaxRetries: 2, RetryDelay: 20 * time.Millisecond, MaxRetryDelay: 200 * time.Millisecond}

// harness is one emulator with one queue (duplicate detection on) and a client on it.
type harness struct {
	em     *sbemu.Emulator
	client *azservicebus.Client
}

func newHarness(tb testing.TB) *harness {
	tb.Helper()
	em, err := sbemu.Start(sbemu.Config{Queues: []broker.QueueConfig{{
		Name:                     queueName,
		DuplicateDetectionWindow: 10 * time.Minute,
	}}})
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, em.Close()) })
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), &azservicebus.ClientOptions{RetryOptions: fastRetries})
	require.NoError(tb, err)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		_ = client.Close(ctx)
	})
	return &harness{em: em, client: client}
}

func (h *harness) inspector(tb testing.TB, opts *Options) *Inspector {
	tb.Helper()
	in, err := New(h.client, queueName, opts)
	require.NoError(tb, err)
	return in
}

// send sends msgs to the queue in batches.
func (h *harness) send(tb testing.TB, msgs ...*azservicebus.Message) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	s, err := h.client.NewSender(queueName, nil)
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
		require.Positive(tb, n)
		require.NoError(tb, s.SendMessageBatch(ctx, batch, nil))
		msgs = msgs[n:]
	}
}

// stats is the queue's message counts in the emulator.
func (h *harness) stats(tb testing.TB) broker.Stats {
	q, ok := h.em.Broker().Queue(queueName)
	require.True(tb, ok)
	return q.Stats()
}

func message(id string) *azservicebus.Message {
	return &azservicebus.Message{MessageID: &id, Body: []byte(`{"id":"` + id + `"}`)}
}

// outcomes collects a consumer's results and wakes waiters on every one.
type outcomes struct {
	mu      sync.Mutex
	results []retry.ProcessedParams
	changed chan struct{}
}

func newOutcomes() *outcomes { return &outcomes{changed: make(chan struct{}, 1)} }

func (o *outcomes) hook(p retry.ProcessedParams) {
	o.mu.Lock()
	o.results = append(o.results, p)
	o.mu.Unlock()
	select {
	case o.changed <- struct{}{}:
	default:
	}
}

func (o *outcomes) snapshot() []retry.ProcessedParams {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]retry.ProcessedParams(nil), o.results...)
}

// waitFor blocks until cond holds over the results, failing after testTimeout.
func (o *outcomes) waitFor(tb testing.TB, what string, cond func([]retry.ProcessedParams) bool) {
	tb.Helper()
	deadline := time.NewTimer(testTimeout)
	defer deadline.Stop()
	for !cond(o.snapshot()) {
		select {
		case <-o.changed:
		case <-deadline.C:
			tb.Fatalf("timed out waiting for %s (%d results)", what, len(o.snapshot()))
		}
	}
}

// result returns the last result for the message whose original MessageID is id.
func result(ps []retry.ProcessedParams, id string, outcome retry.Outcome) (retry.Result, bool) {
	for i := len(ps) - 1; i >= 0; i-- {
		if ps[i].Envelope.OriginalMessageID == id && ps[i].Result.Outcome == outcome {
			return ps[i].Result, true
		}
	}
	return retry.Result{}, false
}

func countOutcome(ps []retry.ProcessedParams, outcome retry.Outcome) int {
	n := 0
	for _, p := range ps {
		if p.Result.Outcome == outcome {
			n++
		}
	}
	return n
}

// consumer runs a retry.Consumer on the queue; stop ends it and waits for Run to return.
type consumer struct {
	out  *outcomes
	stop func()
}

func (h *harness) startConsumer(tb testing.TB, handler retry.Handler, opts retry.Options) *consumer {
	tb.Helper()
	connect, err := retry.QueueConnectionString(h.em.ConnectionString(), queueName, &retry.ConnectOptions{
		Client: &azservicebus.ClientOptions{RetryOptions: fastRetries},
	})
	require.NoError(tb, err)
	out := newOutcomes()
	opts.Hooks.OnProcessed = out.hook
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if opts.SettleTimeout == 0 {
		opts.SettleTimeout = 5 * time.Second
	}
	c, err := retry.NewConsumer(connect, handler, &opts)
	require.NoError(tb, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				assert.NoError(tb, err)
			case <-time.After(testTimeout):
				tb.Error("consumer did not stop")
			}
		})
	}
	tb.Cleanup(stop)
	return &consumer{out: out, stop: stop}
}

func testContext(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	tb.Cleanup(cancel)
	return ctx
}
