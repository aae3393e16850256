package retry_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
)

// A dead letter resubmitted with ResubmitMessage starts over: attempt 1, a fresh id that duplicate
// detection does not drop, no retry or dead-letter properties; and it keeps its identity: the handler
// sees the producer's MessageID as OriginalMessageID, the same key and correlation id, and how many
// times it was redriven, when. A second redrive counts two.
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
	first := seen
	f.clock.Add(10 * time.Second)
	require.Equal(t, retry.OutcomeDeadLettered, f.process().Outcome)
	dead := f.broker.DeadLettered()[0].Message

	now := f.clock.Now()
	fresh := retry.ResubmitMessage(dead, 0, now)
	require.NotNil(t, fresh)
	assert.Equal(t, fresh.MessageID, retry.ResubmitMessage(dead, 0, now.Add(time.Hour)).MessageID, "deterministic: a repeat after a crash is a duplicate")
	assert.NotEqual(t, dead.MessageID, *fresh.MessageID)
	assert.NotEqual(t, "order-42", *fresh.MessageID)
	kept := map[string]bool{retry.PropResubmittedFrom: true, retry.PropOriginalMessageID: true, retry.PropKey: true,
		retry.PropCorrelationID: true, retry.PropRedrives: true, retry.PropRedrivenAt: true}
	for k := range fresh.ApplicationProperties {
		assert.False(t, !kept[k] && strings.HasPrefix(k, "sbretry-"), "retry property %s kept", k)
	}
	assert.Equal(t, "order-42", fresh.ApplicationProperties[retry.PropResubmittedFrom])
	assert.Equal(t, "acme", fresh.ApplicationProperties["tenant"])
	assert.Equal(t, dead.Body, fresh.Body)
	assert.Nil(t, fresh.TimeToLive)

	f.broker.Send(fresh)
	f.process()
	assert.Equal(t, 1, seen.Attempt, "a fresh first delivery")
	assert.Equal(t, "order-42", seen.OriginalMessageID, "the producer's id, not the resubmission's")
	assert.Equal(t, first.Key, seen.Key, "the original's key")
	assert.Equal(t, first.CorrelationID, seen.CorrelationID, "the original's correlation id")
	assert.Equal(t, 1, seen.Redrives)
	assert.True(t, now.Equal(seen.RedrivenAt), "when it was redriven")

	// Its retry copy carries the identity and the redrive on; dead-lettered again and redriven again,
	// it counts two redrives.
	f.clock.Add(10 * time.Second)
	require.Equal(t, retry.OutcomeDeadLettered, f.process().Outcome)
	assert.Equal(t, 2, seen.Attempt)
	assert.Equal(t, "order-42", seen.OriginalMessageID)
	assert.Equal(t, 1, seen.Redrives)
	dl := f.broker.DeadLettered()
	require.Len(t, dl, 2)
	later := f.clock.Now()
	again := retry.ResubmitMessage(dl[1].Message, 0, later)
	assert.NotEqual(t, *fresh.MessageID, *again.MessageID, "another dead letter, another id")
	fail = false
	f.broker.Send(again)
	assert.Equal(t, retry.OutcomeCompleted, f.process().Outcome)
	assert.Equal(t, "order-42", seen.OriginalMessageID)
	assert.Equal(t, first.Key, seen.Key)
	assert.Equal(t, 2, seen.Redrives)
	assert.True(t, later.Equal(seen.RedrivenAt))
	assert.Nil(t, retry.ResubmitMessage(nil, 0, now))
}

// A message resubmitted by an older version, which recorded the producer's id only in
// PropResubmittedFrom, still shows it as OriginalMessageID; a hostile redrive count is refused.
func TestEnvelopeRedriveProperties(t *testing.T) {
	env, err := retry.DecodeEnvelope(&azservicebus.ReceivedMessage{MessageID: "sbretry-resubmit-x", ApplicationProperties: map[string]any{retry.PropResubmittedFrom: "order-7"}})
	require.NoError(t, err)
	assert.Equal(t, "order-7", env.OriginalMessageID)
	assert.Zero(t, env.Redrives)
	for _, bad := range []any{int64(-1), "3", int64(1) << 40} {
		_, err := retry.DecodeEnvelope(&azservicebus.ReceivedMessage{MessageID: "m", ApplicationProperties: map[string]any{retry.PropRedrives: bad}})
		assert.ErrorIs(t, err, retry.ErrInvalidEnvelope, "%v", bad)
	}
	_, err = retry.DecodeEnvelope(&azservicebus.ReceivedMessage{MessageID: "m", ApplicationProperties: map[string]any{retry.PropRedrivenAt: "yesterday"}})
	assert.ErrorIs(t, err, retry.ErrInvalidEnvelope)
}
