package e2e

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/sbemu"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, sbtest.IgnoreSDKLeak())
}

// testTimeout bounds every test's waiting.
const testTimeout = sbtest.Timeout

var errBoom = errors.New("downstream unavailable")

// env is where a test runs: the emulator (em set) or a live namespace (em nil).
type env struct {
	connStr string
	queue   string
	em      *sbemu.Emulator
}

// queueSettings are the emulator queue's settings; zero means the broker default.
type queueSettings struct {
	lockDuration     time.Duration
	maxDeliveryCount int
	// keepLocksOnDisconnect makes the emulator keep a dropped connection's locks until they expire
	// (renewals keep working), the other behaviour reported for the real service.
	keepLocksOnDisconnect bool
}

// fastRetries makes the SDK give up quickly, so recovery is the consumer's job and tests stay short.
var fastRetries = sbtest.FastRetries

func (e *env) client(t *testing.T) *azservicebus.Client {
	t.Helper()
	c, err := azservicebus.NewClientFromConnectionString(e.connStr, &azservicebus.ClientOptions{RetryOptions: fastRetries})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c
}

func (e *env) connector() retry.Connector {
	connect, err := retry.NewNamespace(e.connStr, &retry.ConnectOptions{
		Client: &azservicebus.ClientOptions{RetryOptions: fastRetries},
	}).Queue(e.queue)
	if err != nil {
		panic(err) // the emulator's connection string is always valid
	}
	return connect
}

// send sends messages with the given ids through the SDK.
func (e *env) send(t *testing.T, msgs ...*azservicebus.Message) {
	t.Helper()
	s, err := e.client(t).NewSender(e.queue, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	for _, m := range msgs {
		require.NoError(t, s.SendMessage(ctx, m, nil))
	}
	require.NoError(t, s.Close(ctx))
}

// receiveDeadLetter takes the one message in the dead-letter queue with the SDK, completing it so a
// live queue is left clean.
func (e *env) receiveDeadLetter(t *testing.T) *azservicebus.ReceivedMessage {
	t.Helper()
	dlq, err := e.client(t).NewReceiverForQueue(e.queue, &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	msgs, err := dlq.ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.NoError(t, dlq.CompleteMessage(ctx, msgs[0], nil))
	return msgs[0]
}

func count(ps []retry.ProcessedParams, id string, outcome retry.Outcome) int {
	n := 0
	for _, p := range ps {
		if p.Envelope.Key == id && p.Result.Outcome == outcome {
			n++
		}
	}
	return n
}

// startConsumer runs a consumer on e until the test ends and returns it, with a quick backoff and
// settle timeout unless opts says otherwise.
func startConsumer(t *testing.T, e *env, handler retry.Handler, opts *retry.Options) *retry.Consumer {
	t.Helper()
	if opts.Backoff == nil {
		opts.Backoff = backoff.Fibonacci{Base: 200 * time.Millisecond, Cap: 2 * time.Second}
	}
	if opts.SettleTimeout == 0 {
		opts.SettleTimeout = 5 * time.Second
	}
	return runConsumer(t, e.connector(), handler, opts)
}

// quietLogger is the suite's logger: silent unless E2E_DEBUG is set.
func quietLogger() *slog.Logger {
	level := slog.LevelWarn + 100
	if os.Getenv("E2E_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// newConnector is retry.Namespace.Queue for a string the test knows to be valid.
func newConnector(t *testing.T, connStr, queue string, opts *retry.ConnectOptions) retry.Connector {
	t.Helper()
	connect, err := retry.NewNamespace(connStr, opts).Queue(queue)
	require.NoError(t, err)
	return connect
}

// runConsumer runs a consumer on connect until the test ends. Unlike startConsumer it keeps the
// library's defaults (SettleTimeout 30 s, Fibonacci backoff) unless opts says otherwise.
func runConsumer(t *testing.T, connect retry.Connector, handler retry.Handler, opts *retry.Options) *retry.Consumer {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quietLogger()
	}
	c, err := retry.NewConsumer(connect, handler, opts)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(testTimeout):
			t.Error("consumer did not stop")
		}
	})
	return c
}

// waitRunning waits until c reports itself running.
func waitRunning(t *testing.T, c *retry.Consumer) {
	t.Helper()
	require.Eventually(t, func() bool { return c.Health().Ready() }, testTimeout, 5*time.Millisecond, "consumer never became ready")
}

func TestSuccessCompletes(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{})
	out := sbtest.NewOutcomes()
	startConsumer(t, e, func(context.Context, *azservicebus.ReceivedMessage) error { return nil },
		&retry.Options{Hooks: retry.Hooks{OnProcessed: out.Hook}})
	e.send(t, sbtest.Message("ok-1"), sbtest.Message("ok-2"))
	out.WaitFor(t, "both completed", func(ps []retry.ProcessedParams) bool {
		return count(ps, "ok-1", retry.OutcomeCompleted) == 1 && count(ps, "ok-2", retry.OutcomeCompleted) == 1
	})
	require.Eventually(t, func() bool { return e.settled(t) }, testTimeout, 10*time.Millisecond)
}

// TestReceiverOptionsKeepPeekLock: the connectors pass ConnectOptions.Receiver to the SDK but always
// receive in PeekLock, which settling and retrying need. A user asking for ReceiveAndDelete still gets
// a retry that is scheduled and then completed; in ReceiveAndDelete the broker would delete the message
// on receipt and the consumer could settle nothing.
func TestReceiverOptionsKeepPeekLock(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{})
	out := sbtest.NewOutcomes()
	connect := newConnector(t, e.connStr, e.queue, &retry.ConnectOptions{
		Receiver: &azservicebus.ReceiverOptions{ReceiveMode: azservicebus.ReceiveModeReceiveAndDelete},
	})
	var calls atomic.Int32
	runConsumer(t, connect, func(context.Context, *azservicebus.ReceivedMessage) error {
		if calls.Add(1) == 1 {
			return errors.New("first attempt fails")
		}
		return nil
	}, &retry.Options{Backoff: backoff.Constant{Interval: 50 * time.Millisecond}, Hooks: retry.Hooks{OnProcessed: out.Hook}})
	e.send(t, sbtest.Message("mode-1"))
	// Waits for the retry's completion itself: on a loaded machine the original's complete can time out
	// after its copy was scheduled, and its redelivery is then completed first (Result.Inherited).
	out.WaitFor(t, "the retry completed", func(ps []retry.ProcessedParams) bool {
		for _, p := range ps {
			if p.Envelope.Key == "mode-1" && p.Result.Outcome == retry.OutcomeCompleted && p.Result.Attempt == 2 {
				return true
			}
		}
		return false
	})
	ps := out.Snapshot()
	assert.Equal(t, int32(2), calls.Load(), "the handler ran twice: the failure and its retry (%v)", sbtest.Summarize(ps))
	assert.Equal(t, 1, count(ps, "mode-1", retry.OutcomeRetryScheduled), "%v", sbtest.Summarize(ps))
	require.Eventually(t, func() bool { return e.settled(t) }, testTimeout, 10*time.Millisecond)
}

func TestFailureIsScheduledAndRedeliveredOnTime(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{})
	out := sbtest.NewOutcomes()
	type delivery struct {
		at       time.Time
		env      envelope.Envelope
		count    uint32
		id       string
		props    map[string]any
		body     []byte
		enqueued time.Time
	}
	var mu sync.Mutex
	var seen []delivery
	startConsumer(t, e, func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		env, _ := envelope.FromContext(ctx)
		mu.Lock()
		seen = append(seen, delivery{at: time.Now(), env: env, count: m.DeliveryCount, id: m.MessageID, props: m.ApplicationProperties, body: m.Body, enqueued: *m.EnqueuedTime})
		mu.Unlock()
		if env.Attempt == 1 {
			return errBoom
		}
		return nil
	}, &retry.Options{Backoff: backoff.Constant{Interval: 700 * time.Millisecond}, Hooks: retry.Hooks{OnProcessed: out.Hook}})
	msg := sbtest.Message("flaky-1")
	msg.ApplicationProperties = map[string]any{"tenant": "acme", "n": int32(7)}
	msg.CorrelationID = strPtr("corr-9")
	e.send(t, msg)
	out.WaitFor(t, "attempt 2 completed", func(ps []retry.ProcessedParams) bool {
		return count(ps, "flaky-1", retry.OutcomeCompleted) == 1
	})

	ps := out.Snapshot()
	require.Equal(t, retry.OutcomeRetryScheduled, ps[0].Result.Outcome)
	scheduledFor := ps[0].Result.ScheduledFor
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 2)
	first, second := seen[0], seen[1]
	assert.Equal(t, 1, first.env.Attempt)
	assert.Equal(t, 2, second.env.Attempt)
	assert.False(t, second.at.Before(scheduledFor.Truncate(time.Millisecond)), "redelivered at %v, scheduled for %v", second.at, scheduledFor)
	assert.Equal(t, uint32(1), second.count, "a fresh message, not a redelivery")
	assert.Equal(t, second.env.RetryMessageID(2), second.id)
	assert.Regexp(t, `^sbretry-[0-9a-f]{40}-2$`, second.id)
	assert.Equal(t, e.queue, second.env.Source)
	assert.Equal(t, first.body, second.body)
	assert.Equal(t, "acme", second.props["tenant"])
	assert.Equal(t, int32(7), second.props["n"], "application property types survive AMQP")
	assert.Equal(t, int64(2), second.props[envelope.PropAttempt])
	assert.Equal(t, "corr-9", second.env.CorrelationID)
	assert.Equal(t, "flaky-1", second.env.OriginalMessageID)
	assert.WithinDuration(t, first.enqueued, second.env.FirstEnqueuedTime, time.Millisecond)
	require.Eventually(t, func() bool { return e.settled(t) }, testTimeout, 10*time.Millisecond)
}

func TestDeadLetterAfterMaxAttemptsVisibleInDLQ(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{})
	out := sbtest.NewOutcomes()
	startConsumer(t, e, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom },
		&retry.Options{MaxAttempts: 3, Hooks: retry.Hooks{OnProcessed: out.Hook}})
	e.send(t, sbtest.Message("poison-1"))
	out.WaitFor(t, "dead-letter", func(ps []retry.ProcessedParams) bool {
		return count(ps, "poison-1", retry.OutcomeDeadLettered) == 1
	})
	assert.Equal(t, 2, count(out.Snapshot(), "poison-1", retry.OutcomeRetryScheduled))

	m := e.receiveDeadLetter(t)
	env, err := envelope.Decode(m)
	require.NoError(t, err)
	assert.Equal(t, "poison-1", env.OriginalMessageID)
	assert.Equal(t, env.RetryMessageID(3), m.MessageID)
	assert.Equal(t, int64(3), m.ApplicationProperties[envelope.PropDeadLetterAttempt])
	assert.Equal(t, "RetryMaxAttemptsExceeded", m.ApplicationProperties[envelope.PropDeadLetterReason])
	assert.Equal(t, errBoom.Error(), m.ApplicationProperties[envelope.PropLastError])
	assert.IsType(t, time.Time{}, m.ApplicationProperties[envelope.PropDeadLetterTime])
	require.NotNil(t, m.DeadLetterReason)
	assert.Equal(t, "RetryMaxAttemptsExceeded", *m.DeadLetterReason)
	require.NotNil(t, m.DeadLetterErrorDescription)
	assert.Equal(t, errBoom.Error(), *m.DeadLetterErrorDescription)
	assert.Equal(t, int64(3), m.ApplicationProperties[envelope.PropAttempt])
}

// A handler whose context has a deadline (here set by Hooks.OnStart) that keeps expiring makes failed
// attempts, each retried with its backoff, until MaxAttempts dead-letters it with our reason: the timeouts
// must not pass for a shutdown, which would leave the message to the broker's redeliveries until it
// dead-letters it for MaxDeliveryCountExceeded, with no backoff and no attempt counted.
func TestHandlerTimeoutsAreRetriedWithBackoff(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{lockDuration: time.Second, maxDeliveryCount: 2})
	out := sbtest.NewOutcomes()
	var mu sync.Mutex
	var cancels []context.CancelFunc
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range cancels {
			c()
		}
	})
	startConsumer(t, e, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
		<-ctx.Done()
		return ctx.Err()
	}, &retry.Options{MaxAttempts: 3, Backoff: backoff.Fibonacci{Base: 100 * time.Millisecond, Cap: time.Second}, Hooks: retry.Hooks{
		OnProcessed: out.Hook,
		OnStart: func(p retry.StartParams) context.Context {
			ctx, cancel := context.WithTimeout(p.Context, 100*time.Millisecond)
			mu.Lock()
			cancels = append(cancels, cancel)
			mu.Unlock()
			return ctx
		},
	}})
	e.send(t, sbtest.Message("slow-1"))
	out.WaitFor(t, "dead-letter", func(ps []retry.ProcessedParams) bool {
		return count(ps, "slow-1", retry.OutcomeDeadLettered) == 1
	})
	assert.Equal(t, 2, count(out.Snapshot(), "slow-1", retry.OutcomeRetryScheduled), "each timeout is a failed attempt")
	assert.Zero(t, count(out.Snapshot(), "slow-1", retry.OutcomeLeftForRedelivery))
	m := e.receiveDeadLetter(t)
	require.NotNil(t, m.DeadLetterReason)
	assert.Equal(t, "RetryMaxAttemptsExceeded", *m.DeadLetterReason)
	assert.Equal(t, int64(3), m.ApplicationProperties[envelope.PropDeadLetterAttempt])
	assert.Contains(t, m.ApplicationProperties[envelope.PropLastError], context.DeadlineExceeded.Error())
}

func TestInvalidRetryPropertiesDeadLettered(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{})
	out := sbtest.NewOutcomes()
	called := make(chan struct{}, 1)
	startConsumer(t, e, func(context.Context, *azservicebus.ReceivedMessage) error { called <- struct{}{}; return nil },
		&retry.Options{Hooks: retry.Hooks{OnProcessed: out.Hook}})
	m := sbtest.Message("hostile-1")
	m.ApplicationProperties = map[string]any{envelope.PropAttempt: "99999999999"}
	e.send(t, m)
	out.WaitFor(t, "dead-letter", func(ps []retry.ProcessedParams) bool { return len(ps) == 1 })
	p := out.Snapshot()[0]
	assert.Equal(t, retry.OutcomeDeadLettered, p.Result.Outcome)
	assert.Equal(t, "RetryInvalidProperties", p.Result.DeadLetterReason)
	assert.Empty(t, called, "the handler never saw it")
}

func TestDuplicateRepublishAbsorbed(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{lockDuration: 2 * time.Second})
	if e.em == nil {
		t.Skip("needs fault injection")
	}
	out := sbtest.NewOutcomes()
	startConsumer(t, e, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
		if env, _ := envelope.FromContext(ctx); env.Attempt == 1 {
			return errBoom
		}
		return nil
	}, &retry.Options{Backoff: backoff.Constant{Interval: 3 * time.Second}, DisableLockRenewal: true, Hooks: retry.Hooks{OnProcessed: out.Hook}})
	// The complete after the first republish fails, as if the lock were lost at that moment: the
	// original comes back when its lock expires, fails again, and republishes the same MessageId.
	e.em.RejectNextSettlements(1, "com.microsoft:message-lock-lost")
	e.send(t, sbtest.Message("dup-1"))
	out.WaitFor(t, "attempt 2 completed", func(ps []retry.ProcessedParams) bool {
		return count(ps, "dup-1", retry.OutcomeCompleted) == 1
	})
	require.Eventually(t, func() bool { return e.settled(t) }, testTimeout, 10*time.Millisecond)
	ps := out.Snapshot()
	var dupReported bool
	attempt2 := 0
	for _, p := range ps {
		dupReported = dupReported || p.Result.PossibleDuplicate
		if p.Result.Attempt == 2 {
			attempt2++
		}
	}
	assert.True(t, dupReported, "the failed complete is reported as a possible duplicate: %v", sbtest.Summarize(ps))
	assert.Equal(t, 2, count(ps, "dup-1", retry.OutcomeRetryScheduled)+count(ps, "dup-1", retry.OutcomeLeftForRedelivery), "%v", sbtest.Summarize(ps))
	assert.Equal(t, 1, attempt2, "the second copy was dropped by duplicate detection: %v", sbtest.Summarize(ps))
}

func TestDroppedConnectionRecoveredWithoutLoss(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{lockDuration: 2 * time.Second})
	if e.em == nil {
		t.Skip("needs fault injection")
	}
	const total = 30
	out := sbtest.NewOutcomes()
	var mu sync.Mutex
	handled := map[string]int{} // successful handler runs per message
	c := startConsumer(t, e, func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		select { // real work takes time, so the drop lands mid-flight
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		mu.Lock()
		handled[m.MessageID]++
		mu.Unlock()
		return nil
	}, &retry.Options{
		MaxConcurrency:   4,
		ReconnectDelays:  []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond},
		WatchdogInterval: 500 * time.Millisecond,
		Hooks:            retry.Hooks{OnProcessed: out.Hook},
	})
	var msgs []*azservicebus.Message
	for i := range total {
		msgs = append(msgs, sbtest.Message(fmt.Sprintf("m-%02d", i)))
	}
	e.send(t, msgs...)
	out.WaitFor(t, "some progress", func(ps []retry.ProcessedParams) bool { return len(ps) >= 5 })
	e.em.DropConnections()
	// Nothing lost: every message was handled successfully and the queue ends empty. A complete that
	// the drop cut off may have reached the broker (the message is gone) or not (it is redelivered and
	// handled again): at-least-once, never zero times.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) == total && e.settled(t)
	}, testTimeout, 10*time.Millisecond, "every message handled and the queue empty")
	mu.Lock()
	again := 0
	for _, n := range handled {
		again += n - 1
	}
	mu.Unlock()
	h := c.Health()
	t.Logf("after the drop: %d handled twice, %d connects, %d receive failures, %d left for redelivery, state %s",
		again, h.Connects, h.ReceiveFailures, h.LeftForRedelivery, h.State)
}

// TestOutageRecoveredByReconnectLoop takes the broker away long enough for the SDK's own recovery to
// give up, so the consumer's reconnect tries and then its watchdog must bring it back.
func TestOutageRecoveredByReconnectLoop(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{lockDuration: 2 * time.Second})
	if e.em == nil {
		t.Skip("needs fault injection")
	}
	out := sbtest.NewOutcomes()
	var states []retry.State
	var smu sync.Mutex
	c := startConsumer(t, e, func(context.Context, *azservicebus.ReceivedMessage) error { return nil }, &retry.Options{
		MaxConcurrency:   2,
		ReconnectDelays:  []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond},
		WatchdogInterval: 500 * time.Millisecond,
		Hooks: retry.Hooks{OnProcessed: out.Hook, OnStateChange: func(p retry.StateChangeParams) {
			smu.Lock()
			states = append(states, p.To)
			smu.Unlock()
		}},
	})
	e.send(t, sbtest.Message("before"))
	out.WaitFor(t, "first message", func(ps []retry.ProcessedParams) bool { return count(ps, "before", retry.OutcomeCompleted) == 1 })

	e.em.RefuseConnections(time.Hour)
	e.em.DropConnections()
	require.Eventually(t, func() bool { return c.Health().State == retry.StateWatchdog }, testTimeout, 10*time.Millisecond,
		"the reconnect tries fail while the broker is away, then the watchdog takes over")

	// While the broker is away the consumer must not call itself ready, even right after a watchdog
	// tick builds a new client (the SDK connects lazily; the connection check catches it).
	notReady := time.NewTimer(1200 * time.Millisecond) // covers two watchdog ticks
	for sampling := true; sampling; {
		select {
		case <-notReady.C:
			sampling = false
		case <-time.After(5 * time.Millisecond):
			require.False(t, c.Health().Ready(), "ready during the outage: %+v", c.Health())
		}
	}
	e.em.RefuseConnections(0) // the broker is back
	e.send(t, sbtest.Message("after"))
	out.WaitFor(t, "message after the outage", func(ps []retry.ProcessedParams) bool { return count(ps, "after", retry.OutcomeCompleted) == 1 })
	require.Eventually(t, func() bool { return c.Health().State == retry.StateRunning }, testTimeout, 10*time.Millisecond)
	h := c.Health()
	assert.GreaterOrEqual(t, h.ReceiveFailures, uint64(1))
	assert.GreaterOrEqual(t, h.Connects, uint64(2), "a fresh client after the outage")
	smu.Lock()
	assert.Subset(t, states, []retry.State{retry.StateReconnecting, retry.StateWatchdog})
	smu.Unlock()
	t.Logf("outage: %d connects, %d connect failures, %d receive failures", h.Connects, h.ConnectFailures, h.ReceiveFailures)
}
func strPtr(s string) *string { return &s }

// TestLargeMessages: a message close to the broker's size limit is retried through the real SDK, and
// one whose retry copy (body plus retry properties) could exceed it is dead-lettered with our reason
// instead of failing to republish forever.
func TestLargeMessages(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{})
	out := sbtest.NewOutcomes()
	longErr := errors.New(strings.Repeat("downstream unavailable; ", 60))
	startConsumer(t, e, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
		if env, _ := envelope.FromContext(ctx); env.Attempt == 1 {
			return longErr
		}
		return nil
	}, &retry.Options{Hooks: retry.Hooks{OnProcessed: out.Hook}})
	big := sbtest.Message("big-1")
	big.Body = make([]byte, 200*1024)
	// Sendable as it is (with a margin for the system properties a real namespace counts), but its copy
	// adds the envelope and this long error, which takes it past the limit.
	tooBig := sbtest.Message("too-big-1")
	tooBig.Body = make([]byte, 256*1024-1500)
	e.send(t, big, tooBig)
	out.WaitFor(t, "both settled", func(ps []retry.ProcessedParams) bool {
		return count(ps, "big-1", retry.OutcomeCompleted) == 1 && count(ps, "too-big-1", retry.OutcomeDeadLettered) == 1
	})
	for _, p := range out.Snapshot() {
		if p.Envelope.Key == "too-big-1" {
			assert.Equal(t, "RetryMessageTooLarge", p.Result.DeadLetterReason)
		}
		if p.Envelope.Key == "big-1" && p.Result.Attempt == 2 {
			assert.Len(t, p.Message.Body, 200*1024, "the copy kept the whole body")
		}
	}
}

// TestMultiSectionBodyDeadLettered: a body of several AMQP data sections (which other SDKs can send) is
// not in ReceivedMessage.Body, so a retry copy would lose it; it is dead-lettered intact instead.
func TestMultiSectionBodyDeadLettered(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{})
	out := sbtest.NewOutcomes()
	startConsumer(t, e, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom },
		&retry.Options{Hooks: retry.Hooks{OnProcessed: out.Hook}})
	s, err := e.client(t).NewSender(e.queue, nil)
	require.NoError(t, err)
	id := "multi-1"
	require.NoError(t, s.SendAMQPAnnotatedMessage(t.Context(), &azservicebus.AMQPAnnotatedMessage{
		Body:       azservicebus.AMQPAnnotatedMessageBody{Data: [][]byte{[]byte(`{"amount":`), []byte(`42}`)}},
		Properties: &azservicebus.AMQPAnnotatedMessageProperties{MessageID: id},
	}, nil))
	out.WaitFor(t, "dead-letter", func(ps []retry.ProcessedParams) bool { return len(ps) == 1 })
	p := out.Snapshot()[0]
	assert.Equal(t, retry.OutcomeDeadLettered, p.Result.Outcome)
	assert.Equal(t, "RetryUnsupportedBody", p.Result.DeadLetterReason)

	m := e.receiveDeadLetter(t)
	assert.Equal(t, [][]byte{[]byte(`{"amount":`), []byte(`42}`)}, m.RawAMQPMessage.Body.Data, "the body survives intact")
}

// TestRepublishFailureLeavesOriginalForRedelivery: when scheduling the copy fails (the management
// operation is refused), the original is not completed; it comes back when its lock expires and the
// next attempt goes ahead. Nothing is lost, and the attempt is not counted twice.
func TestRepublishFailureLeavesOriginalForRedelivery(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{lockDuration: time.Second})
	if e.em == nil {
		t.Skip("needs fault injection")
	}
	out := sbtest.NewOutcomes()
	var mu sync.Mutex
	var deliveries []uint32
	c := startConsumer(t, e, func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		env, _ := envelope.FromContext(ctx)
		if env.Attempt == 1 {
			mu.Lock()
			deliveries = append(deliveries, m.DeliveryCount)
			mu.Unlock()
			return errBoom
		}
		return nil
	}, &retry.Options{Hooks: retry.Hooks{OnProcessed: out.Hook}})
	waitRunning(t, c) // its connection check schedules a probe, which the fault below would refuse
	e.em.RejectNextManagement(100, "com.microsoft:schedule-message", 503)
	e.send(t, sbtest.Message("rp-1"))
	out.WaitFor(t, "a failed republish", func(ps []retry.ProcessedParams) bool {
		return count(ps, "rp-1", retry.OutcomeLeftForRedelivery) == 1
	})
	q, _ := e.em.Broker().Queue(e.queue)
	assert.Equal(t, 1, q.Stats().Locked+q.Stats().Active, "the original is still there")
	e.em.RejectNextManagement(0, "", 0) // the management node recovers
	out.WaitFor(t, "attempt 2 completed", func(ps []retry.ProcessedParams) bool {
		return count(ps, "rp-1", retry.OutcomeCompleted) == 1
	})
	ps := out.Snapshot()
	assert.ErrorContains(t, ps[0].Result.SettleErr, "503")
	assert.Equal(t, 1, count(ps, "rp-1", retry.OutcomeRetryScheduled))
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []uint32{1, 2}, deliveries, "attempt 1 ran again on the broker's redelivery")
	require.Eventually(t, func() bool { return e.settled(t) }, testTimeout, 10*time.Millisecond)
}

// TestLocksThatSurviveADisconnect covers the other reported behaviour of the real service: locks
// outlive a dropped connection and renewals keep working. The handler then runs to its end; whether
// its complete goes through or the message comes back after the lock expires, it is handled at least
// once and nothing is lost.
func TestLocksThatSurviveADisconnect(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{lockDuration: 2 * time.Second, keepLocksOnDisconnect: true})
	if e.em == nil {
		t.Skip("needs fault injection")
	}
	out := sbtest.NewOutcomes()
	started := make(chan struct{}, 10)
	var mu sync.Mutex
	handled := 0
	startConsumer(t, e, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
		started <- struct{}{}
		select { // longer than the lock: renewal must keep it
		case <-time.After(3 * time.Second):
		case <-ctx.Done():
			return ctx.Err()
		}
		mu.Lock()
		handled++
		mu.Unlock()
		return nil
	}, &retry.Options{SettleTimeout: 2 * time.Second, Hooks: retry.Hooks{OnProcessed: out.Hook}})
	e.send(t, sbtest.Message("keep-1"))
	<-started
	e.em.DropConnections()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return handled >= 1 && e.settled(t)
	}, testTimeout, 10*time.Millisecond)
	for _, p := range out.Snapshot() {
		assert.NotErrorIs(t, p.Result.SettleErr, retry.ErrLockLost, "renewal kept the lock: the handler was not cancelled")
	}
	t.Logf("outcomes: %v", sbtest.Summarize(out.Snapshot()))
}

// The built-in connectors say which endpoint a connection talks to, for telemetry's server.address.
func TestConnectionReportsItsAddress(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{})
	conn, err := e.connector()(t.Context())
	require.NoError(t, err)
	defer func() { require.NoError(t, conn.Close(context.Background())) }()
	endpoint := strings.TrimSuffix(strings.TrimPrefix(strings.Split(e.connStr, ";")[0], "Endpoint=sb://"), "/")
	assert.Equal(t, endpoint, conn.Address)
}
