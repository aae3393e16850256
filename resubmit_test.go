package retry_test

import (
	"context"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
)

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
