package inspect

import (
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/sbretry/retry/envelope"
	"github.com/stretchr/testify/assert"
)

func TestMatches(t *testing.T) {
	copyMsg := &azservicebus.ReceivedMessage{
		MessageID:     "sbretry-abc-2",
		CorrelationID: ptr("producer-corr"),
		ApplicationProperties: map[string]any{
			envelope.PropAttempt: int64(2), envelope.PropKey: "order-42", envelope.PropCorrelationID: "corr-7",
			envelope.PropOriginalMessageID: "m-1",
		},
	}
	first := &azservicebus.ReceivedMessage{MessageID: "m-9", CorrelationID: ptr("corr-9")}
	resubmitted := &azservicebus.ReceivedMessage{MessageID: "sbretry-resubmit-x", ApplicationProperties: map[string]any{envelope.PropResubmittedFrom: "m-5"}}
	hostile := &azservicebus.ReceivedMessage{MessageID: "h-1", ApplicationProperties: map[string]any{envelope.PropAttempt: "many", envelope.PropKey: "order-42"}}
	cases := []struct {
		name string
		msg  *azservicebus.ReceivedMessage
		id   string
		want bool
	}{
		{"copy by key", copyMsg, "order-42", true},
		{"copy by envelope correlation id", copyMsg, "corr-7", true},
		{"copy by producer correlation id", copyMsg, "producer-corr", true},
		{"copy by original message id", copyMsg, "m-1", true},
		{"copy by its own id", copyMsg, "sbretry-abc-2", true},
		{"copy by another id", copyMsg, "m-2", false},
		{"first delivery by message id", first, "m-9", true},
		{"first delivery by correlation id", first, "corr-9", true},
		{"resubmission by the original id", resubmitted, "m-5", true},
		{"invalid envelope: only the message id", hostile, "order-42", false},
		{"invalid envelope by message id", hostile, "h-1", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { assert.Equal(t, tc.want, decode(tc.msg).matches(tc.id)) })
	}
}

func TestDeadLetterFallbacks(t *testing.T) {
	enq := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := enq.Add(-time.Minute)
	seq := int64(9)
	ours := decode(&azservicebus.ReceivedMessage{
		MessageID: "x", SequenceNumber: &seq, EnqueuedTime: &enq,
		ApplicationProperties: map[string]any{
			envelope.PropAttempt: int64(4), envelope.PropDeadLetterAttempt: int64(5), envelope.PropDeadLetterTime: at,
			envelope.PropDeadLetterReason: "RetryMessageExpired", envelope.PropLastError: "late",
		},
	}).deadLetter("q/$DeadLetterQueue")
	assert.Equal(t, 5, ours.Attempt, "the dead-letter attempt wins over the envelope's")
	assert.Equal(t, at, ours.DeadLetteredAt)
	assert.Equal(t, "RetryMessageExpired", ours.Reason, "our reason when the broker's is missing")
	assert.Equal(t, "late", ours.LastError)
	assert.Equal(t, int64(9), ours.SequenceNumber)

	hostile := decode(&azservicebus.ReceivedMessage{
		MessageID: "h", EnqueuedTime: &enq, DeadLetterReason: ptr("RetryInvalidProperties"),
		ApplicationProperties: map[string]any{envelope.PropAttempt: "many"},
	}).deadLetter("q/$DeadLetterQueue")
	assert.Equal(t, 0, hostile.Attempt, "unknown")
	assert.Error(t, hostile.EnvelopeErr)
	assert.Equal(t, enq, hostile.DeadLetteredAt, "the dead-letter queue's enqueue time")
	assert.Equal(t, int64(-1), hostile.SequenceNumber)
}
