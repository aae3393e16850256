package retry_test

import (
	"context"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
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
		assert.Equal(t, "order-1", s.Message.ApplicationProperties[envelope.PropKey], "the key stays in the envelope")
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
	var seen envelope.Envelope
	f := newFixture(t, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
		seen, _ = envelope.FromContext(ctx)
		return errBoom
	}, &retry.Options{MaxAttempts: 5})
	first := f.clock.Now().Add(-time.Minute)
	f.broker.Send(&azservicebus.Message{
		MessageID: strPtr("order-42-attempt-2"),
		Body:      []byte("legacy"),
		ApplicationProperties: map[string]any{
			envelope.PropAttempt:           int64(2),
			envelope.PropCorrelationID:     "corr-7",
			envelope.PropOriginalMessageID: "order-42",
			envelope.PropKey:               "order-42",
			envelope.PropFirstEnqueuedTime: first,
			envelope.PropLastError:         "boom",
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
	assert.Equal(t, int64(3), c.ApplicationProperties[envelope.PropAttempt])
	assert.Equal(t, int64(1), c.ApplicationProperties[envelope.PropFirstSequenceNumber])

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
		envelope.PropAttempt: int64(3), envelope.PropKey: "k", envelope.PropOriginalMessageID: "k",
	}})
	res := f.process()
	assert.Equal(t, retry.OutcomeCompleted, res.Outcome)
	assert.Equal(t, 3, res.Attempt)
}
