package main

import (
	"bytes"
	"context"
	"errors"
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
	"github.com/sbretry/retry/inspect"
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

// cli runs the command with the emulator's connection string and the queue; stdin feeds prompts.
func (h *harness) cli(tb testing.TB, stdin string, args ...string) (code int, stdout, stderr string) {
	tb.Helper()
	return h.cliWith(tb, hooks{}, stdin, args...)
}

func (h *harness) cliWith(tb testing.TB, hk hooks, stdin string, args ...string) (code int, stdout, stderr string) {
	tb.Helper()
	var out, errOut bytes.Buffer
	a := &app{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }, now: time.Now, hooks: hk}
	full := append([]string{"--connection-string", h.em.ConnectionString(), "--queue", queueName}, args...)
	code = a.run(testContext(tb), full)
	tb.Logf("sbretry %s -> %d\nstdout:\n%sstderr:\n%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return code, out.String(), errOut.String()
}

// cliNoEntity runs the command with exactly args and no environment.
func cliNoEntity(tb testing.TB, stdin string, args ...string) (code int, stdout, stderr string) {
	tb.Helper()
	var out, errOut bytes.Buffer
	a := &app{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }, now: time.Now}
	code = a.run(testContext(tb), args)
	return code, out.String(), errOut.String()
}

// seed sends one message per id and runs a consumer until each reached its stage: "pending-*" fail once
// and are retried in an hour, "perm-*" fail permanently, "max-*" fail every attempt (MaxAttempts 2, so
// they are dead-lettered after one retry). It returns the consumer's results.
func (h *harness) seed(tb testing.TB, ids ...string) []retry.ProcessedParams {
	tb.Helper()
	msgs := make([]*azservicebus.Message, len(ids))
	for i, id := range ids {
		msgs[i] = message(id)
		msgs[i].ApplicationProperties = map[string]any{"tenant": "acme"}
	}
	h.send(tb, msgs...)
	c := h.startConsumer(tb, func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		env, _ := retry.EnvelopeFromContext(ctx)
		id := env.OriginalMessageID
		switch {
		case strings.HasPrefix(id, "pending-"):
			return errBoom // the backoff: an hour
		case strings.HasPrefix(id, "perm-"):
			return retry.Permanent(errors.New("invalid payload in " + id))
		case strings.HasPrefix(id, "max-"):
			return retry.RetryAfter(10*time.Millisecond, errors.New("timeout calling the ledger"))
		}
		return nil
	}, retry.Options{MaxAttempts: 2, Backoff: retry.Constant{Interval: time.Hour}, MaxConcurrency: 8})
	c.out.waitFor(tb, "every message at its stage", func(ps []retry.ProcessedParams) bool {
		for _, id := range ids {
			want := retry.OutcomeDeadLettered
			if strings.HasPrefix(id, "pending-") {
				want = retry.OutcomeRetryScheduled
			}
			if _, ok := result(ps, id, want); !ok {
				return false
			}
		}
		return true
	})
	c.stop()
	return c.out.snapshot()
}

// activeIDs counts the receivable messages of the queue by MessageID.
func (h *harness) activeIDs(tb testing.TB) map[string]int {
	q, ok := h.em.Broker().Queue(queueName)
	require.True(tb, ok)
	out := map[string]int{}
	for _, m := range q.ActiveMessages() {
		id, _ := m.Properties.MessageID.(string)
		out[id]++
	}
	return out
}

func mustEntity(tb testing.TB, path string) inspect.Entity {
	tb.Helper()
	e, err := inspect.ParseEntity(path)
	require.NoError(tb, err)
	return e
}

func timeMust(tb testing.TB, s string) time.Time {
	tb.Helper()
	v, err := time.Parse(time.RFC3339, s)
	require.NoError(tb, err)
	return v
}

type stringsBuilder = strings.Builder

func countLines(s string) int { return strings.Count(s, "\n") }
