package retry_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
)

func TestAttemptsFollowScheduleThenDeadLetter(t *testing.T) {
	const maxAttempts = 5
	var seen []envelope.Envelope
	f := newFixture(t, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
		env, ok := envelope.FromContext(ctx)
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
			delay := backoff.Fibonacci{}.Delay(attempt)
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
	msg.ApplicationProperties[envelope.PropAttempt] = int64(28)
	f.broker.Send(msg)
	assert.Equal(t, retry.OutcomeRetryScheduled, f.process().Outcome, "attempt 28 still retries")
	f.clock.Add(backoff.DefaultCap)
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
			}, &retry.Options{Backoff: backoff.Fibonacci{Cap: time.Hour}})
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
	assert.LessOrEqual(t, len(d), 1024)
	assert.True(t, strings.HasSuffix(d, "…"))
	assert.NotContains(t, d, "hunter2")
	assert.NotContains(t, f.logs.String(), "hunter2")
	assert.True(t, utf8.ValidString(d))
}

func TestOversizedCopyDeadLetters(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
	// The original fits the queue's 256 KiB; its copy, with the retry properties, would not.
	_, err := f.broker.Send(&azservicebus.Message{MessageID: strPtr("big"), Body: bytes.Repeat([]byte("x"), 256*1024-256)})
	require.NoError(t, err)
	res := f.process()
	assert.Equal(t, retry.OutcomeDeadLettered, res.Outcome)
	assert.Equal(t, "RetryMessageTooLarge", res.DeadLetterReason)
	// The description says how large the copy would be and what the limit is, then the handler's error.
	dl := f.broker.DeadLettered()
	require.Len(t, dl, 1)
	assert.Regexp(t, `^the retry copy would take about \d+ bytes \(body \d+\); the limit is 262144 \(Options.MaxMessageSize\); the handler failed with: downstream unavailable$`, dl[0].Description)
}

func TestCopyOverHeaderLimitsDeadLetters(t *testing.T) {
	cases := []struct {
		name  string
		props map[string]any
		desc  string // the dead-letter description, a regexp
	}{
		{"one property near 32 KiB", map[string]any{"big": strings.Repeat("x", 32*1024-10)}, `^the retry copy's application property "big" takes about \d+ bytes; the limit is 32768; `},
		// Just under 64 KiB, which Service Bus accepts; the copy's retry properties take it over.
		{"properties over 64 KiB together with the copy's", map[string]any{"a": strings.Repeat("x", 30*1024), "b": strings.Repeat("x", 30*1024), "c": strings.Repeat("x", 4000)}, `^the retry copy's header and application properties take about \d+ bytes; the limit is 65536; `},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
			_, err := f.broker.Send(&azservicebus.Message{MessageID: strPtr("hdr"), Body: []byte("x"), ApplicationProperties: tc.props})
			require.NoError(t, err)
			res := f.process()
			assert.Equal(t, retry.OutcomeDeadLettered, res.Outcome)
			assert.Equal(t, "RetryMessageTooLarge", res.DeadLetterReason)
			assert.Empty(t, f.broker.Scheduled())
			dl := f.broker.DeadLettered()
			require.Len(t, dl, 1)
			assert.Regexp(t, tc.desc, dl[0].Description)
		})
	}
	// Just inside the limits, the copy is scheduled.
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("ok"), Body: []byte("x"), ApplicationProperties: map[string]any{"a": strings.Repeat("x", 30*1024), "b": strings.Repeat("x", 30*1024)}})
	assert.Equal(t, retry.OutcomeRetryScheduled, f.process().Outcome)
}

// TestFirstAttemptDeadLetterRecordsItsIdentity: a message dead-lettered at its first attempt has no
// envelope of its own, so the dead letter records its key, correlation id and original MessageID for
// the operator tools; near the header limit they are left out rather than making the dead-letter fail.
func TestFirstAttemptDeadLetterRecordsItsIdentity(t *testing.T) {
	permanent := func(context.Context, *azservicebus.ReceivedMessage) error { return retry.Permanent(errBoom) }
	f := newFixture(t, permanent, nil)
	_, err := f.broker.Send(&azservicebus.Message{MessageID: strPtr("order-7"), CorrelationID: strPtr("trace-7"), Body: []byte("x")})
	require.NoError(t, err)
	require.Equal(t, retry.OutcomeDeadLettered, f.process().Outcome)
	dead := f.broker.DeadLettered()
	require.Len(t, dead, 1)
	props := dead[0].Message.ApplicationProperties
	assert.Equal(t, "order-7", props[envelope.PropKey])
	assert.Equal(t, "trace-7", props[envelope.PropCorrelationID])
	assert.Equal(t, "order-7", props[envelope.PropOriginalMessageID])
	env, err := envelope.Decode(dead[0].Message)
	require.NoError(t, err)
	assert.Equal(t, "order-7", env.Key)

	g := newFixture(t, permanent, nil)
	big := map[string]any{"a": strings.Repeat("x", 32*1024-40), "b": strings.Repeat("x", 32*1024-40)}
	_, err = g.broker.Send(&azservicebus.Message{MessageID: strPtr("big-7"), Body: []byte("x"), ApplicationProperties: big})
	require.NoError(t, err)
	require.Equal(t, retry.OutcomeDeadLettered, g.process().Outcome)
	dead = g.broker.DeadLettered()
	require.Len(t, dead, 1)
	assert.NotContains(t, dead[0].Message.ApplicationProperties, envelope.PropKey, "no room under the header limit")
}

// Service Bus counts a TimeToLive from the scheduled enqueue time. A copy gets only what is left of the
// producer's lifetime, and a retry that would be due after the expiry is dead-lettered with our reason.
// Before, every copy carried the full TTL again: a 1-minute message could live for weeks.
func TestExpiryIsTheProducers(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
	msg := sampleMessage()
	ttl := 35 * time.Second
	msg.TimeToLive = &ttl
	f.broker.Send(msg)
	start := f.clock.Now()

	res := f.process() // attempt 1 at t=0, copy due at 10 s
	require.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
	c := f.broker.Scheduled()[0].Message
	assert.Equal(t, 25*time.Second, *c.TimeToLive, "35 s minus the 10 s wait")
	assert.Equal(t, start.Add(ttl), c.ApplicationProperties[envelope.PropExpiresAt])

	f.clock.Add(10 * time.Second)
	res = f.process() // attempt 2 at 10 s, copy due at 20 s
	require.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
	c = f.broker.Scheduled()[1].Message
	assert.Equal(t, 15*time.Second, *c.TimeToLive)
	assert.Equal(t, start.Add(ttl), c.ApplicationProperties[envelope.PropExpiresAt], "the expiry never moves")

	f.clock.Add(10 * time.Second)
	res = f.process() // attempt 3 at 20 s; attempt 4 would be due at 40 s > 35 s
	assert.Equal(t, retry.OutcomeDeadLettered, res.Outcome)
	assert.Equal(t, "RetryMessageExpired", res.DeadLetterReason)
	require.Len(t, f.broker.DeadLettered(), 1)
	assert.Equal(t, "RetryMessageExpired", f.broker.DeadLettered()[0].Reason)
}

func TestIgnoreExpiryKeepsTheOldBehaviour(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom },
		&retry.Options{IgnoreExpiry: true})
	msg := sampleMessage()
	ttl := 5 * time.Second
	msg.TimeToLive = &ttl
	f.broker.Send(msg)
	res := f.process() // due at 10 s, after the 5 s expiry
	require.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
	assert.Equal(t, ttl, *f.broker.Scheduled()[0].Message.TimeToLive, "the original TTL again")
}

func TestNoTimeToLiveNoLimit(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
	msg := sampleMessage()
	msg.TimeToLive = nil
	f.broker.Send(msg)
	require.Equal(t, retry.OutcomeRetryScheduled, f.process().Outcome)
	c := f.broker.Scheduled()[0].Message
	assert.Nil(t, c.TimeToLive)
	assert.NotContains(t, c.ApplicationProperties, envelope.PropExpiresAt)
}

// A custom Backoff's delays are bounded like RetryAfter's: never negative, never beyond the cap.
func TestCustomBackoffDelaysAreBounded(t *testing.T) {
	for name, tc := range map[string]struct {
		delay, want time.Duration
	}{
		"negative is zero":        {-time.Hour, 0},
		"beyond the default cap":  {30 * 24 * time.Hour, backoff.DefaultCap},
		"within bounds unchanged": {time.Minute, time.Minute},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom },
				&retry.Options{Backoff: fixedBackoff(tc.delay)})
			msg := sampleMessage()
			msg.TimeToLive = nil
			f.broker.Send(msg)
			res := f.process()
			require.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
			assert.Equal(t, tc.want, res.Delay)
		})
	}
}

// fixedBackoff is a custom Backoff that declares no bounds.
type fixedBackoff time.Duration

func (b fixedBackoff) Delay(int) time.Duration { return time.Duration(b) }

// A dead letter carries, as application properties, the final attempt, the time, the reason and the
// last error, rendered through Options.ErrorText and redacted.
func TestDeadLetterCarriesWhatHappened(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, &retry.Options{
		MaxAttempts: 1,
		ErrorText:   func(err error) string { return "rendered: " + err.Error() + " SharedAccessKey=c2VjcmV0" },
	})
	f.broker.Send(sampleMessage())
	res := f.process()
	require.Equal(t, retry.OutcomeDeadLettered, res.Outcome)
	dl := f.broker.DeadLettered()[0]
	assert.Equal(t, "rendered: downstream unavailable SharedAccessKey=REDACTED", dl.Description)
	props := dl.Message.ApplicationProperties
	assert.Equal(t, int64(1), props[envelope.PropDeadLetterAttempt])
	// The same instant: an AMQP timestamp comes back in the local time zone (go-amqp's decoding).
	at, ok := props[envelope.PropDeadLetterTime].(time.Time)
	require.True(t, ok, "%T", props[envelope.PropDeadLetterTime])
	assert.True(t, f.clock.Now().Equal(at), "dead-lettered at %v, want %v", at, f.clock.Now())
	assert.Equal(t, "RetryMaxAttemptsExceeded", props[envelope.PropDeadLetterReason])
	assert.Equal(t, dl.Description, props[envelope.PropLastError])
	assert.Equal(t, "orders", props[envelope.PropSource])
	assert.Equal(t, "acme", props["tenant"], "the producer's properties stay")
}

// A copy whose remaining lifetime is under a millisecond would travel as a TimeToLive of 0, which the
// broker reads as no TTL at all, and live forever: the message is dead-lettered as expired instead.
func TestSubMillisecondLifetimeDeadLettersAsExpired(t *testing.T) {
	for name, tc := range map[string]struct {
		left    time.Duration // the copy's lifetime once due
		outcome retry.Outcome
	}{
		"half a millisecond": {500 * time.Microsecond, retry.OutcomeDeadLettered},
		"a nanosecond":       {time.Nanosecond, retry.OutcomeDeadLettered},
		"one millisecond":    {time.Millisecond, retry.OutcomeRetryScheduled},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
			msg := sampleMessage()
			ttl := 10*time.Second + tc.left // the first retry is due after 10 s
			msg.TimeToLive = &ttl
			f.broker.Send(msg)
			res := f.process()
			require.Equal(t, tc.outcome, res.Outcome)
			if tc.outcome == retry.OutcomeDeadLettered {
				assert.Equal(t, "RetryMessageExpired", res.DeadLetterReason)
				assert.Empty(t, f.broker.Scheduled())
				return
			}
			c := f.broker.Scheduled()[0].Message
			assert.Equal(t, tc.left, *c.TimeToLive)
		})
	}
}
