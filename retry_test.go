package retry_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/retrytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	errBoom   = errors.New("downstream unavailable")
	okHandler = func(context.Context, *azservicebus.ReceivedMessage) error { return nil }
)

type nopSender struct{}

func (nopSender) ScheduleMessages(context.Context, []*azservicebus.Message, time.Time, *azservicebus.ScheduleMessagesOptions) ([]int64, error) {
	return nil, nil
}
func (nopSender) Close(context.Context) error { return nil }

// fixture is a processor over a retrytest broker on a mock clock.
type fixture struct {
	t      *testing.T
	clock  *clock.Mock
	broker *retrytest.Broker
	recv   retry.Receiver
	proc   *retry.Processor
	logs   *bytes.Buffer
}

func newFixture(t *testing.T, handler retry.Handler, opts *retry.Options) *fixture {
	t.Helper()
	f := &fixture{t: t, clock: clock.NewMock(), logs: &bytes.Buffer{}}
	f.clock.Set(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	f.broker = newBroker(t, f.clock, &retrytest.BrokerOptions{DuplicateDetection: true})
	f.recv = f.broker.Receiver()
	if opts == nil {
		opts = &retry.Options{}
	}
	opts.Clock = f.clock
	if opts.EntityPath == "" {
		opts.EntityPath = "orders"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewJSONHandler(&lockedWriter{w: f.logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	proc, err := retry.NewProcessor(f.broker.Sender(), handler, opts)
	require.NoError(t, err)
	f.proc = proc
	return f
}

// receiveOne takes the next message, which must be available now (the timeout only guards a broken test).
func (f *fixture) receiveOne() *azservicebus.ReceivedMessage {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msgs, err := f.recv.ReceiveMessages(ctx, 1, nil)
	require.NoError(f.t, err)
	require.Len(f.t, msgs, 1)
	return msgs[0]
}

func (f *fixture) process() retry.Result {
	f.t.Helper()
	return f.proc.Process(context.Background(), f.recv, f.receiveOne())
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func strPtr(s string) *string { return &s }

// chainOf is the envelope identity of sampleMessage's chain in the fixture: entity "orders", first
// delivery with sequence number seq.
func chainOf(seq int64) retry.Envelope {
	return retry.Envelope{Source: "orders", FirstSequenceNumber: seq, OriginalMessageID: "order-42"}
}

func sampleMessage() *azservicebus.Message {
	ttl := time.Hour
	return &azservicebus.Message{
		MessageID:             strPtr("order-42"),
		Body:                  []byte{0x00, 0xff, 'h', 'i', 0x00},
		ContentType:           strPtr("application/octet-stream"),
		CorrelationID:         strPtr("corr-7"),
		Subject:               strPtr("orders"),
		To:                    strPtr("billing"),
		ReplyTo:               strPtr("replies"),
		SessionID:             strPtr("session-1"),
		PartitionKey:          strPtr("session-1"),
		TimeToLive:            &ttl,
		ApplicationProperties: map[string]any{"tenant": "acme", "n": int64(3), "raw": []byte{1, 2, 3}},
	}
}

func TestProcessSuccessCompletes(t *testing.T) {
	f := newFixture(t, okHandler, nil)
	f.broker.Send(sampleMessage())
	res := f.process()
	assert.Equal(t, retry.OutcomeCompleted, res.Outcome)
	assert.Len(t, f.broker.Completed(), 1)
	assert.Empty(t, f.broker.Scheduled())
	assert.Empty(t, f.broker.DeadLettered())
}

func TestProcessFailureSchedulesExactCopy(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
	f.broker.Send(sampleMessage())
	start := f.clock.Now()
	res := f.process()
	require.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)

	sched := f.broker.Scheduled()
	require.Len(t, sched, 1, "exactly one copy")
	s := sched[0]
	assert.Equal(t, start.Add(10*time.Second), s.At, "now + Fibonacci{}.Delay(1)")
	assert.Equal(t, chainOf(1).RetryMessageID(2), s.MessageID)
	assert.Equal(t, 2, s.Attempt)
	m := s.Message
	assert.Equal(t, []byte{0x00, 0xff, 'h', 'i', 0x00}, m.Body, "body byte-identical")
	assert.Equal(t, "application/octet-stream", *m.ContentType)
	assert.Equal(t, "corr-7", *m.CorrelationID)
	assert.Equal(t, "orders", *m.Subject)
	assert.Equal(t, "billing", *m.To)
	assert.Equal(t, "replies", *m.ReplyTo)
	assert.Equal(t, "session-1", *m.SessionID)
	assert.Equal(t, "session-1", *m.PartitionKey)
	assert.Equal(t, time.Hour-10*time.Second, *m.TimeToLive, "what is left of the producer's TimeToLive when the copy is due")
	assert.Equal(t, start.Add(time.Hour), m.ApplicationProperties[retry.PropExpiresAt])
	assert.Equal(t, "orders", m.ApplicationProperties[retry.PropSource])
	assert.Equal(t, int64(1), m.ApplicationProperties[retry.PropFirstSequenceNumber])
	assert.Equal(t, "acme", m.ApplicationProperties["tenant"])
	assert.Equal(t, int64(3), m.ApplicationProperties["n"])
	assert.Equal(t, []byte{1, 2, 3}, m.ApplicationProperties["raw"])
	assert.Equal(t, int64(2), m.ApplicationProperties[retry.PropAttempt])
	assert.Equal(t, "corr-7", m.ApplicationProperties[retry.PropCorrelationID], "seeded from CorrelationID")
	assert.Equal(t, "order-42", m.ApplicationProperties[retry.PropOriginalMessageID])
	assert.Equal(t, errBoom.Error(), m.ApplicationProperties[retry.PropLastError])
	assert.Equal(t, start, m.ApplicationProperties[retry.PropFirstEnqueuedTime])

	assert.Len(t, f.broker.Completed(), 1, "the original is completed")
	assert.Equal(t, 1, f.broker.Stats().Pending)
}

func TestRetryCopyIsDeepCopy(t *testing.T) {
	var got *azservicebus.ReceivedMessage
	f := newFixture(t, func(_ context.Context, m *azservicebus.ReceivedMessage) error {
		got = m
		return errBoom
	}, nil)
	f.broker.Send(sampleMessage())
	f.process()
	// Mutating the received message after the fact must not reach the scheduled copy.
	got.ApplicationProperties["raw"].([]byte)[0] = 99
	got.ApplicationProperties["tenant"] = "evil"
	got.Body[0] = 42
	f.clock.Add(10 * time.Second)
	next := f.receiveOne()
	assert.Equal(t, []byte{1, 2, 3}, next.ApplicationProperties["raw"])
	assert.Equal(t, "acme", next.ApplicationProperties["tenant"])
	assert.Equal(t, byte(0), next.Body[0])
}

func TestCorrelationIDSeededFromKeyWithoutCorrelationID(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("m-1"), Body: []byte("x")})
	f.process()
	s := f.broker.Scheduled()
	require.Len(t, s, 1)
	assert.Equal(t, "m-1", s[0].Message.ApplicationProperties[retry.PropCorrelationID])
	assert.Nil(t, s[0].Message.CorrelationID)
}

func TestAttemptsFollowScheduleThenDeadLetter(t *testing.T) {
	const maxAttempts = 5
	var seen []retry.Envelope
	f := newFixture(t, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
		env, ok := retry.EnvelopeFromContext(ctx)
		require.True(t, ok)
		seen = append(seen, env)
		return errBoom
	}, &retry.Options{MaxAttempts: maxAttempts})
	f.broker.Send(sampleMessage())
	first := f.clock.Now()
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		res := f.process()
		assert.Equal(t, attempt, res.Attempt)
		if attempt < maxAttempts {
			require.Equal(t, retry.OutcomeRetryScheduled, res.Outcome, "attempt %d", attempt)
			delay := retry.Fibonacci{}.Delay(attempt)
			assert.Equal(t, delay, res.Delay)
			// Not receivable a moment before its time.
			f.clock.Add(delay - time.Millisecond)
			assert.Equal(t, 0, f.broker.Stats().Active, "attempt %d copy visible early", attempt+1)
			f.clock.Add(time.Millisecond)
		} else {
			require.Equal(t, retry.OutcomeDeadLettered, res.Outcome)
		}
	}
	require.Len(t, seen, maxAttempts)
	for i, env := range seen {
		assert.Equal(t, i+1, env.Attempt)
		assert.Equal(t, "corr-7", env.CorrelationID)
		assert.Equal(t, "order-42", env.OriginalMessageID)
		assert.Equal(t, first, env.FirstEnqueuedTime)
	}
	dl := f.broker.DeadLettered()
	require.Len(t, dl, 1)
	assert.Equal(t, "RetryMaxAttemptsExceeded", dl[0].Reason)
	assert.Equal(t, errBoom.Error(), dl[0].Description)
	assert.Equal(t, chainOf(1).RetryMessageID(5), dl[0].Message.MessageID)
	ids := []string{}
	for _, s := range f.broker.Scheduled() {
		ids = append(ids, s.MessageID)
	}
	c := chainOf(1)
	assert.Equal(t, []string{c.RetryMessageID(2), c.RetryMessageID(3), c.RetryMessageID(4), c.RetryMessageID(5)}, ids)
}

func TestDefaultMaxAttemptsIs29(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
	msg := sampleMessage()
	msg.TimeToLive = nil // the 7-day waits would outlive it
	msg.ApplicationProperties[retry.PropAttempt] = int64(28)
	f.broker.Send(msg)
	assert.Equal(t, retry.OutcomeRetryScheduled, f.process().Outcome, "attempt 28 still retries")
	f.clock.Add(retry.DefaultCap)
	res := f.process()
	assert.Equal(t, 29, res.Attempt)
	assert.Equal(t, retry.OutcomeDeadLettered, res.Outcome, "the message fails for good after attempt 29")
}

func TestPermanentDeadLettersAtOnce(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error {
		return retry.Permanent(errors.New("schema invalid"))
	}, nil)
	f.broker.Send(sampleMessage())
	res := f.process()
	assert.Equal(t, retry.OutcomeDeadLettered, res.Outcome)
	assert.Empty(t, f.broker.Scheduled())
	dl := f.broker.DeadLettered()
	require.Len(t, dl, 1)
	assert.Equal(t, "RetryPermanentFailure", dl[0].Reason)
	assert.Equal(t, "schema invalid", dl[0].Description)
	assert.NoError(t, retry.Permanent(nil))
	assert.True(t, retry.IsPermanent(retry.Permanent(errBoom)))
	assert.ErrorIs(t, retry.Permanent(errBoom), errBoom)
}

func TestRetryAfterUsesDelayBoundedByCap(t *testing.T) {
	cases := []struct {
		name  string
		delay time.Duration
		want  time.Duration
	}{
		{"handler delay", 90 * time.Second, 90 * time.Second},
		{"capped", 48 * time.Hour, time.Hour},
		{"negative is zero", -time.Second, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error {
				return retry.RetryAfter(tc.delay, errBoom)
			}, &retry.Options{Backoff: retry.Fibonacci{Cap: time.Hour}})
			msg := sampleMessage()
			msg.TimeToLive = nil // a 1-hour delay would reach its expiry
			f.broker.Send(msg)
			now := f.clock.Now()
			res := f.process()
			require.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
			assert.Equal(t, tc.want, res.Delay)
			assert.Equal(t, now.Add(tc.want), f.broker.Scheduled()[0].At)
		})
	}
}

func TestRetryBudgetDeadLetters(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom },
		&retry.Options{RetryBudget: 25 * time.Second})
	f.broker.Send(sampleMessage())
	assert.Equal(t, retry.OutcomeRetryScheduled, f.process().Outcome) // due at +10 s
	f.clock.Add(10 * time.Second)
	assert.Equal(t, retry.OutcomeRetryScheduled, f.process().Outcome) // due at +20 s
	f.clock.Add(10 * time.Second)
	res := f.process() // next would be +40 s > 25 s budget
	assert.Equal(t, retry.OutcomeDeadLettered, res.Outcome)
	assert.Equal(t, "RetryBudgetExhausted", res.DeadLetterReason)
}

func TestRepublishFailureLeavesOriginal(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
	f.broker.Send(sampleMessage())
	f.broker.Fail(retrytest.OpSchedule, 1, retrytest.ErrConnectionLost)
	var observed []retry.ProcessedParams
	f.proc = mustProcessor(t, f, &retry.Options{Hooks: retry.Hooks{OnProcessed: func(p retry.ProcessedParams) { observed = append(observed, p) }}})
	res := f.process()
	assert.Equal(t, retry.OutcomeLeftForRedelivery, res.Outcome)
	assert.ErrorIs(t, res.SettleErr, retrytest.ErrConnectionLost)
	assert.Empty(t, f.broker.Completed(), "never complete without a scheduled successor")
	assert.Equal(t, 1, f.broker.Stats().Locked, "the original stays locked, then returns")
	require.Len(t, observed, 1)
	assert.Equal(t, retry.OutcomeLeftForRedelivery, observed[0].Result.Outcome)
	logs := f.logs.String()
	assert.Contains(t, logs, `"level":"ERROR"`)
	assert.Contains(t, logs, `"correlation_id":"corr-7"`)
	assert.Contains(t, logs, "republishing the retry failed")

	// The lock expires, the broker redelivers, and this time the republish works.
	f.clock.Add(retrytest.DefaultLockDuration)
	res = f.process()
	assert.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
	assert.Len(t, f.broker.Completed(), 1)
}

func mustProcessor(t *testing.T, f *fixture, opts *retry.Options) *retry.Processor {
	t.Helper()
	opts.Clock = f.clock
	opts.Logger = slog.New(slog.NewJSONHandler(&lockedWriter{w: f.logs}, nil))
	p, err := retry.NewProcessor(f.broker.Sender(), func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, opts)
	require.NoError(t, err)
	return p
}

func TestCompleteFailureAfterRepublishIsPossibleDuplicate(t *testing.T) {
	var calls atomic.Int32
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { calls.Add(1); return errBoom }, nil)
	f.broker.Send(sampleMessage())
	f.broker.Fail(retrytest.OpComplete, 1, &azservicebus.Error{Code: azservicebus.CodeLockLost})
	res := f.process()
	assert.Equal(t, retry.OutcomeLeftForRedelivery, res.Outcome)
	assert.True(t, res.PossibleDuplicate)

	// The redelivery reaches the same processor: it knows the copy is scheduled, so it completes the
	// original without running the handler again or scheduling a second copy.
	f.clock.Add(retrytest.DefaultLockDuration)
	res = f.process()
	assert.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
	assert.True(t, res.Inherited)
	assert.Equal(t, int32(1), calls.Load(), "the handler ran once")
	sched := f.broker.Scheduled()
	require.Len(t, sched, 1, "one successor")
	assert.Equal(t, sched[0].SequenceNumber, res.SequenceNumber)
	st := f.broker.Stats()
	assert.Equal(t, 1, st.Pending+st.Active, "one copy in flight")
}

func TestCompleteFailureAbsorbedAcrossProcesses(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
	f.broker.Send(sampleMessage())
	f.broker.Fail(retrytest.OpComplete, 1, &azservicebus.Error{Code: azservicebus.CodeLockLost})
	require.True(t, f.process().PossibleDuplicate)

	// The redelivery reaches another process (a fresh processor): the handler fails again and the
	// republish reuses the MessageId, which duplicate detection drops.
	other, err := retry.NewProcessor(f.broker.Sender(), func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom },
		&retry.Options{Clock: f.clock, EntityPath: "orders", Logger: discardLogger()})
	require.NoError(t, err)
	f.clock.Add(retrytest.DefaultLockDuration)
	res := other.Process(context.Background(), f.recv, f.receiveOne())
	assert.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
	sched := f.broker.Scheduled()
	require.Len(t, sched, 2)
	assert.Equal(t, sched[0].MessageID, sched[1].MessageID, "deterministic MessageId")
	assert.True(t, sched[1].Duplicate, "absorbed by duplicate detection")
	st := f.broker.Stats()
	assert.Equal(t, 1, st.Pending+st.Active, "one copy in flight")
}

func TestDeadLetterFailureDoesNotComplete(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return retry.Permanent(errBoom) }, nil)
	f.broker.Send(sampleMessage())
	f.broker.Fail(retrytest.OpDeadLetter, 1, nil)
	res := f.process()
	assert.Equal(t, retry.OutcomeLeftForRedelivery, res.Outcome)
	assert.Equal(t, "RetryPermanentFailure", res.DeadLetterReason)
	assert.Empty(t, f.broker.Completed())
	assert.Empty(t, f.broker.DeadLettered())
	assert.Equal(t, 1, f.broker.Stats().Locked)
}

func TestDeadLetterDescriptionTruncatedAndRedacted(t *testing.T) {
	long := strings.Repeat("é", 3000) // 2 bytes each
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error {
		return retry.Permanent(errors.New("dial failed: Endpoint=sb://x/;SharedAccessKey=hunter2; " + long))
	}, nil)
	f.broker.Send(sampleMessage())
	f.process()
	dl := f.broker.DeadLettered()
	require.Len(t, dl, 1)
	d := dl[0].Description
	assert.LessOrEqual(t, len(d), retry.DefaultDescriptionLimit)
	assert.True(t, strings.HasSuffix(d, "…"))
	assert.NotContains(t, d, "hunter2")
	assert.NotContains(t, f.logs.String(), "hunter2")
	assert.True(t, utf8.ValidString(d))
}

func TestSettleCallsAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hang := &hangingSettler{}
		p, err := retry.NewProcessor(nopSender{}, okHandler, &retry.Options{SettleTimeout: 20 * time.Second, Logger: discardLogger(), DisableLockRenewal: true})
		require.NoError(t, err)
		start := time.Now()
		res := p.Process(context.Background(), hang, &azservicebus.ReceivedMessage{MessageID: "m"})
		assert.Equal(t, retry.OutcomeLeftForRedelivery, res.Outcome)
		assert.ErrorIs(t, res.SettleErr, context.DeadlineExceeded)
		assert.Equal(t, 20*time.Second, time.Since(start), "bounded by the settle timeout (fake time)")
	})
}

// hangingSettler never answers, like the SDK's settle path after a connection drop; it returns only
// when its context ends.
type hangingSettler struct{}

func (hangingSettler) CompleteMessage(ctx context.Context, _ *azservicebus.ReceivedMessage, _ *azservicebus.CompleteMessageOptions) error {
	<-ctx.Done()
	return ctx.Err()
}

func (hangingSettler) DeadLetterMessage(ctx context.Context, _ *azservicebus.ReceivedMessage, _ *azservicebus.DeadLetterOptions) error {
	<-ctx.Done()
	return ctx.Err()
}

func (hangingSettler) RenewMessageLock(ctx context.Context, _ *azservicebus.ReceivedMessage, _ *azservicebus.RenewMessageLockOptions) error {
	<-ctx.Done()
	return ctx.Err()
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
