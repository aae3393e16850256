package retry_test

import (
	"context"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/retrytest"
)

// Two different messages that share an idempotency key (an order id) both fail once: with duplicate
// detection on, both retries must survive. With "{key}-attempt-{n}" ids the second was dropped as a
// duplicate and its original completed: lost.
func TestMessagesSharingAKeyBothRetry(t *testing.T) {
	byOrder := func(m *azservicebus.ReceivedMessage) string { return m.ApplicationProperties["order"].(string) }
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom },
		&retry.Options{IdempotencyKey: byOrder})
	for _, id := range []string{"charge-1", "refund-1"} {
		f.broker.Send(&azservicebus.Message{MessageID: strPtr(id), Body: []byte(id), ApplicationProperties: map[string]any{"order": "order-1"}})
	}
	require.Equal(t, retry.OutcomeRetryScheduled, f.process().Outcome)
	require.Equal(t, retry.OutcomeRetryScheduled, f.process().Outcome)
	sched := f.broker.Scheduled()
	require.Len(t, sched, 2)
	assert.NotEqual(t, sched[0].MessageID, sched[1].MessageID)
	assert.False(t, sched[0].Duplicate || sched[1].Duplicate, "no retry dropped as a duplicate")
	for _, s := range sched {
		assert.Equal(t, "order-1", s.Message.ApplicationProperties[retry.PropKey], "the key stays in the envelope")
	}
	f.clock.Add(10 * time.Second)
	bodies := map[string]bool{}
	for range 2 {
		m := f.receiveOne()
		bodies[string(m.Body)] = true
		require.NoError(t, f.recv.CompleteMessage(t.Context(), m, nil))
	}
	assert.Equal(t, map[string]bool{"charge-1": true, "refund-1": true}, bodies, "both copies delivered")
}

// A producer's own message whose id happens to look like a retry id of another message ("job-7" and
// "job-7-attempt-2" from a workflow engine's counter) must not make the retry a duplicate.
func TestProducerIDCannotShadowARetry(t *testing.T) {
	f := newFixture(t, func(_ context.Context, m *azservicebus.ReceivedMessage) error {
		if m.MessageID == "job-7" {
			return errBoom
		}
		return nil
	}, nil)
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("job-7-attempt-2"), Body: []byte("other")})
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("job-7"), Body: []byte("job")})
	assert.Equal(t, retry.OutcomeCompleted, f.process().Outcome)
	assert.Equal(t, retry.OutcomeRetryScheduled, f.process().Outcome)
	require.Len(t, f.broker.Scheduled(), 1)
	assert.False(t, f.broker.Scheduled()[0].Duplicate)
	f.clock.Add(10 * time.Second)
	assert.Equal(t, "job", string(f.receiveOne().Body), "the retry arrives")
}

// The same message failing on two subscriptions whose copies meet in one entity (a shared retry target)
// gets two different retry ids, because the chain names the entity it started on.
func TestSameMessageOnTwoEntitiesGetsTwoChains(t *testing.T) {
	b := newBroker(t, nil, &retrytest.BrokerOptions{DuplicateDetection: true})
	fail := func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }
	var ids []string
	for _, entity := range []string{"orders/Subscriptions/billing", "orders/Subscriptions/audit"} {
		p, err := retry.NewProcessor(b.Sender(), fail, &retry.Options{EntityPath: entity, Logger: discardLogger()})
		require.NoError(t, err)
		seq := int64(5) // the same message: one topic fans out the same sequence number to each subscription
		res := p.Process(t.Context(), nopSettler{}, &azservicebus.ReceivedMessage{MessageID: "m", SequenceNumber: &seq})
		require.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
		ids = append(ids, res.RetryMessageID)
	}
	assert.NotEqual(t, ids[0], ids[1])
	assert.Zero(t, b.Stats().Duplicates)
}

// A copy written by the previous version (its property names, its "{key}-attempt-{n}" id, no chain
// identity) is still processed: its attempt counts on, its key and correlation are kept, and its chain
// is re-based on its own sequence number, so the next id is deterministic and new-style.
func TestCopyFromPreviousVersionIsProcessed(t *testing.T) {
	var seen retry.Envelope
	f := newFixture(t, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
		seen, _ = retry.EnvelopeFromContext(ctx)
		return errBoom
	}, &retry.Options{MaxAttempts: 5})
	first := f.clock.Now().Add(-time.Minute)
	f.broker.Send(&azservicebus.Message{
		MessageID: strPtr("order-42-attempt-2"),
		Body:      []byte("legacy"),
		ApplicationProperties: map[string]any{
			retry.PropAttempt:           int64(2),
			retry.PropCorrelationID:     "corr-7",
			retry.PropOriginalMessageID: "order-42",
			retry.PropKey:               "order-42",
			retry.PropFirstEnqueuedTime: first,
			retry.PropLastError:         "boom",
		},
	})
	res := f.process()
	require.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
	assert.Equal(t, 2, seen.Attempt)
	assert.Equal(t, "order-42", seen.Key)
	assert.Equal(t, "corr-7", seen.CorrelationID)
	assert.Equal(t, "order-42", seen.OriginalMessageID)
	assert.Equal(t, "boom", seen.LastError)
	assert.Equal(t, first, seen.FirstEnqueuedTime)
	assert.Equal(t, "orders", seen.Source)
	assert.Equal(t, int64(1), seen.FirstSequenceNumber, "re-based on the legacy copy's own delivery")
	c := f.broker.Scheduled()[0].Message
	assert.Equal(t, seen.RetryMessageID(3), *c.MessageID)
	assert.Equal(t, int64(3), c.ApplicationProperties[retry.PropAttempt])
	assert.Equal(t, int64(1), c.ApplicationProperties[retry.PropFirstSequenceNumber])

	// The next attempt keeps that chain.
	f.clock.Add(time.Minute)
	require.Equal(t, retry.OutcomeRetryScheduled, f.process().Outcome)
	assert.Equal(t, 3, seen.Attempt)
	assert.Equal(t, int64(1), seen.FirstSequenceNumber)
	assert.Equal(t, seen.RetryMessageID(4), f.broker.Scheduled()[1].MessageID)
}

// A legacy copy that now succeeds is simply completed.
func TestCopyFromPreviousVersionSucceeds(t *testing.T) {
	f := newFixture(t, okHandler, nil)
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("k-attempt-3"), ApplicationProperties: map[string]any{
		retry.PropAttempt: int64(3), retry.PropKey: "k", retry.PropOriginalMessageID: "k",
	}})
	res := f.process()
	assert.Equal(t, retry.OutcomeCompleted, res.Outcome)
	assert.Equal(t, 3, res.Attempt)
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
	assert.Equal(t, start.Add(ttl), c.ApplicationProperties[retry.PropExpiresAt])

	f.clock.Add(10 * time.Second)
	res = f.process() // attempt 2 at 10 s, copy due at 20 s
	require.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
	c = f.broker.Scheduled()[1].Message
	assert.Equal(t, 15*time.Second, *c.TimeToLive)
	assert.Equal(t, start.Add(ttl), c.ApplicationProperties[retry.PropExpiresAt], "the expiry never moves")

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
	assert.NotContains(t, c.ApplicationProperties, retry.PropExpiresAt)
}

// A custom Backoff's delays are bounded like RetryAfter's: never negative, never beyond the cap.
func TestCustomBackoffDelaysAreBounded(t *testing.T) {
	for name, tc := range map[string]struct {
		delay, want time.Duration
	}{
		"negative is zero":        {-time.Hour, 0},
		"beyond the default cap":  {30 * 24 * time.Hour, retry.DefaultCap},
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
	assert.Equal(t, int64(1), props[retry.PropDeadLetterAttempt])
	assert.Equal(t, f.clock.Now(), props[retry.PropDeadLetterTime])
	assert.Equal(t, "RetryMaxAttemptsExceeded", props[retry.PropDeadLetterReason])
	assert.Equal(t, dl.Description, props[retry.PropLastError])
	assert.Equal(t, "orders", props[retry.PropSource])
	assert.Equal(t, "acme", props["tenant"], "the producer's properties stay")
}

// A dead letter resubmitted with ResubmitMessage starts over: attempt 1, a fresh id that duplicate
// detection does not drop, the same key for handlers, no retry or dead-letter properties.
func TestResubmitMessageStartsAFreshChain(t *testing.T) {
	fail := true
	var seen retry.Envelope
	f := newFixture(t, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
		seen, _ = retry.EnvelopeFromContext(ctx)
		if fail {
			return errBoom
		}
		return nil
	}, &retry.Options{MaxAttempts: 2})
	f.broker.Send(sampleMessage())
	f.process()
	f.clock.Add(10 * time.Second)
	require.Equal(t, retry.OutcomeDeadLettered, f.process().Outcome)
	dead := f.broker.DeadLettered()[0].Message

	fresh := retry.ResubmitMessage(dead, 0)
	require.NotNil(t, fresh)
	assert.Equal(t, fresh.MessageID, retry.ResubmitMessage(dead, 0).MessageID, "deterministic: a repeat after a crash is a duplicate")
	assert.NotEqual(t, dead.MessageID, *fresh.MessageID)
	assert.NotEqual(t, "order-42", *fresh.MessageID)
	for k := range fresh.ApplicationProperties {
		assert.False(t, k != retry.PropResubmittedFrom && len(k) > 8 && k[:8] == "sbretry-", "retry property %s kept", k)
	}
	assert.Equal(t, "order-42", fresh.ApplicationProperties[retry.PropResubmittedFrom])
	assert.Equal(t, "acme", fresh.ApplicationProperties["tenant"])
	assert.Equal(t, dead.Body, fresh.Body)
	assert.Nil(t, fresh.TimeToLive)

	fail = false
	f.broker.Send(fresh)
	res := f.process()
	assert.Equal(t, retry.OutcomeCompleted, res.Outcome)
	assert.Equal(t, 1, seen.Attempt, "a fresh first delivery")
	assert.Equal(t, "order-42", seen.Key, "the original's key")
	assert.Nil(t, retry.ResubmitMessage(nil, 0))
}

// nopSettler accepts every settle call.
type nopSettler struct{}

func (nopSettler) CompleteMessage(context.Context, *azservicebus.ReceivedMessage, *azservicebus.CompleteMessageOptions) error {
	return nil
}

func (nopSettler) DeadLetterMessage(context.Context, *azservicebus.ReceivedMessage, *azservicebus.DeadLetterOptions) error {
	return nil
}

func (nopSettler) RenewMessageLock(context.Context, *azservicebus.ReceivedMessage, *azservicebus.RenewMessageLockOptions) error {
	return nil
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
