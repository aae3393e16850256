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
	"github.com/sbretry/retry/envelope"
)

// A dead letter resubmitted with ResubmitMessage starts over: attempt 1, a fresh id that duplicate
// detection does not drop, no retry or dead-letter properties; and it keeps its identity: the handler
// sees the producer's MessageID as OriginalMessageID, the same key and correlation id, and how many
// times it was redriven, when. A second redrive counts two.
func TestResubmitMessageStartsAFreshChain(t *testing.T) {
	fail := true
	var seen envelope.Envelope
	f := newFixture(t, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
		seen, _ = envelope.FromContext(ctx)
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
	fresh := envelope.Resubmit(dead, 0, now)
	require.NotNil(t, fresh)
	assert.Equal(t, fresh.MessageID, envelope.Resubmit(dead, 0, now.Add(time.Hour)).MessageID, "deterministic: a repeat after a crash is a duplicate")
	assert.NotEqual(t, dead.MessageID, *fresh.MessageID)
	assert.NotEqual(t, "order-42", *fresh.MessageID)
	kept := map[string]bool{envelope.PropResubmittedFrom: true, envelope.PropOriginalMessageID: true, envelope.PropKey: true,
		envelope.PropCorrelationID: true, envelope.PropRedrives: true, envelope.PropRedrivenAt: true}
	for k := range fresh.ApplicationProperties {
		assert.False(t, !kept[k] && strings.HasPrefix(k, "sbretry-"), "retry property %s kept", k)
	}
	assert.Equal(t, "order-42", fresh.ApplicationProperties[envelope.PropResubmittedFrom])
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
	again := envelope.Resubmit(dl[1].Message, 0, later)
	assert.NotEqual(t, *fresh.MessageID, *again.MessageID, "another dead letter, another id")
	fail = false
	f.broker.Send(again)
	assert.Equal(t, retry.OutcomeCompleted, f.process().Outcome)
	assert.Equal(t, "order-42", seen.OriginalMessageID)
	assert.Equal(t, first.Key, seen.Key)
	assert.Equal(t, 2, seen.Redrives)
	assert.True(t, later.Equal(seen.RedrivenAt))
	assert.Nil(t, envelope.Resubmit(nil, 0, now))
}

// A message resubmitted by an older version, which recorded the producer's id only in
// PropResubmittedFrom, still shows it as OriginalMessageID; a hostile redrive count is refused.
