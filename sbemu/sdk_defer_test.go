package sbemu

import (
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

// deferReceived sends body, receives it and defers it on the receive link;
// it returns the sequence number.
func deferReceived(t *testing.T, s *azservicebus.Sender, r *azservicebus.Receiver, body string) int64 {
	t.Helper()
	sendText(t, s, body)
	msg := receiveOne(t, r)
	require.Equal(t, body, string(msg.Body))
	require.NoError(t, r.DeferMessage(ctxT(t), msg, nil))
	return *msg.SequenceNumber
}

// peekAll peeks every message of r's entity.
func peekAll(t *testing.T, r *azservicebus.Receiver) []*azservicebus.ReceivedMessage {
	t.Helper()
	msgs, err := r.PeekMessages(ctxT(t), 100, &azservicebus.PeekMessagesOptions{FromSequenceNumber: to.Ptr(int64(0))})
	require.NoError(t, err)
	return msgs
}

// TestSDKDeferAndReceiveDeferred follows the SDK's live tests
// TestReceiverDeferAndReceiveDeferredMessages and TestDeferredMessages/Defer:
// a deferred message is skipped by receives, peeks as deferred, comes back
// by sequence number as deferred, can be deferred again with properties
// (through update-disposition) and completed.
func TestSDKDeferAndReceiveDeferred(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sender := newSender(t, client, "queue")
	receiver := newReceiver(t, client, "queue", nil)

	seq := deferReceived(t, sender, receiver, "later")
	sendText(t, sender, "now")
	next := receiveOne(t, receiver)
	assert.Equal(t, "now", string(next.Body), "the deferred message is not delivered again")
	require.NoError(t, receiver.CompleteMessage(ctxT(t), next, nil))

	peeked := peekAll(t, receiver)
	require.Len(t, peeked, 1)
	assert.Equal(t, azservicebus.MessageStateDeferred, peeked[0].State)

	got, err := receiver.ReceiveDeferredMessages(ctxT(t), []int64{seq}, nil)
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, "later", string(got[0].Body))
	assert.Equal(t, azservicebus.MessageStateDeferred, got[0].State)
	assert.Equal(t, uint32(2), got[0].DeliveryCount)
	assert.NotEqual(t, [16]byte{}, got[0].LockToken)
	require.NotNil(t, got[0].LockedUntil)

	// Double defer, through the management link (the SDK settles messages
	// received by sequence number only there).
	require.NoError(t, receiver.DeferMessage(ctxT(t), got[0], &azservicebus.DeferMessageOptions{
		PropertiesToModify: map[string]any{"hello": "world"},
	}))
	again, err := receiver.ReceiveDeferredMessages(ctxT(t), []int64{seq}, nil)
	require.NoError(t, err)
	require.Len(t, again, 1)
	assert.Equal(t, "world", again[0].ApplicationProperties["hello"])
	require.NoError(t, receiver.RenewMessageLock(ctxT(t), again[0], nil))
	require.NoError(t, receiver.CompleteMessage(ctxT(t), again[0], nil))
	assert.Empty(t, peekAll(t, receiver))
}

// TestSDKDeferredAbandonStaysDeferred is the live test
// TestDeferredMessages/Abandon: abandoning a deferred message counts the
// delivery and leaves it deferred.
func TestSDKDeferredAbandonStaysDeferred(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	receiver := newReceiver(t, client, "queue", nil)
	seq := deferReceived(t, newSender(t, client, "queue"), receiver, "x")
	got, err := receiver.ReceiveDeferredMessages(ctxT(t), []int64{seq}, nil)
	require.NoError(t, err)
	require.NoError(t, receiver.AbandonMessage(ctxT(t), got[0], &azservicebus.AbandonMessageOptions{
		PropertiesToModify: map[string]any{"hello": "world"},
	}))

	peeked := peekAll(t, receiver)
	require.Len(t, peeked, 1)
	assert.Equal(t, got[0].DeliveryCount+1, peeked[0].DeliveryCount, "delivery count is incremented")
	assert.Equal(t, azservicebus.MessageStateDeferred, peeked[0].State)
	assert.Equal(t, "world", peeked[0].ApplicationProperties["hello"])
	_, err = receiver.ReceiveDeferredMessages(ctxT(t), []int64{seq}, nil)
	require.NoError(t, err, "still deferred")
}

// TestSDKDeferredDeadLetter is the live test TestDeferredMessage_DeadLettering.
func TestSDKDeferredDeadLetter(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	receiver := newReceiver(t, client, "queue", nil)
	seq := deferReceived(t, newSender(t, client, "queue"), receiver, "x")
	got, err := receiver.ReceiveDeferredMessages(ctxT(t), []int64{seq}, nil)
	require.NoError(t, err)
	require.NoError(t, receiver.DeadLetterMessage(ctxT(t), got[0], &azservicebus.DeadLetterOptions{Reason: to.Ptr("why")}))

	dlq := newReceiver(t, client, "queue", &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	dead := receiveOne(t, dlq)
	assert.Equal(t, "x", string(dead.Body))
	require.NotNil(t, dead.DeadLetterReason)
	assert.Equal(t, "why", *dead.DeadLetterReason)
	require.NoError(t, dlq.CompleteMessage(ctxT(t), dead, nil))
	assert.Empty(t, peekAll(t, receiver))
}

// TestSDKReceiveDeferredReceiveAndDelete is the live test
// TestReceiverDeferWithReceiveAndDelete.
func TestSDKReceiveDeferredReceiveAndDelete(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	receiver := newReceiver(t, client, "queue", nil)
	seq := deferReceived(t, newSender(t, client, "queue"), receiver, "x")

	rd := newReceiver(t, client, "queue", &azservicebus.ReceiverOptions{ReceiveMode: azservicebus.ReceiveModeReceiveAndDelete})
	got, err := rd.ReceiveDeferredMessages(ctxT(t), []int64{seq}, nil)
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, "x", string(got[0].Body))
	assert.Empty(t, peekAll(t, receiver), "received and deleted")
}

// TestSDKDeferByLockToken settles by lock token alone, as the live test
// TestReceiverSettleWithLockToken/Defer does: the SDK sends
// update-disposition "defered" through the management link.
func TestSDKDeferByLockToken(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sendText(t, newSender(t, client, "queue"), "x")
	receiver := newReceiver(t, client, "queue", nil)
	msg := receiveOne(t, receiver)
	require.NoError(t, receiver.DeferMessage(ctxT(t), &azservicebus.ReceivedMessage{LockToken: msg.LockToken}, nil))

	got, err := receiver.ReceiveDeferredMessages(ctxT(t), []int64{*msg.SequenceNumber}, nil)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.NoError(t, receiver.CompleteMessage(ctxT(t), got[0], nil))
}

func TestSDKReceiveDeferredNotDeferredIsNotFound(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sender := newSender(t, client, "queue")
	receiver := newReceiver(t, client, "queue", nil)
	seq := deferReceived(t, sender, receiver, "deferred")
	sendText(t, sender, "active")

	tests := []struct {
		name string
		seqs []int64
	}{
		{"unknown", []int64{seq, 12345}},
		{"active, not deferred", []int64{seq + 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := receiver.ReceiveDeferredMessages(ctxT(t), tc.seqs, nil)
			requireCode(t, err, azservicebus.CodeNotFound)
		})
	}
	got, err := receiver.ReceiveDeferredMessages(ctxT(t), []int64{seq}, nil)
	require.NoError(t, err, "a refused request received nothing")
	require.Len(t, got, 1)
}

// TestSDKDeferredMessageExpiresOnlyWhenReceived: "Deferred messages aren't
// expired and automatically moved to a dead-letter queue until a client
// app attempts to receive them" (message-deferral.md).
func TestSDKDeferredMessageExpiresOnlyWhenReceived(t *testing.T) {
	mock := clock.NewMock()
	mock.Set(time.Now())
	em := startEmulator(t, Config{Clock: mock, Queues: []broker.QueueConfig{{Name: "q", DefaultTTL: time.Minute, DeadLetterOnExpiration: true}}})
	client := newClient(t, em)
	receiver := newReceiver(t, client, "q", nil)
	seq := deferReceived(t, newSender(t, client, "q"), receiver, "x")
	mock.Add(time.Hour)

	peeked := peekAll(t, receiver)
	require.Len(t, peeked, 1, "still there after its time-to-live")
	assert.Equal(t, azservicebus.MessageStateDeferred, peeked[0].State)

	_, err := receiver.ReceiveDeferredMessages(ctxT(t), []int64{seq}, nil)
	requireCode(t, err, azservicebus.CodeNotFound)
	assert.Empty(t, peekAll(t, receiver))
	dlq := newReceiver(t, client, "q", &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	dead := receiveOne(t, dlq)
	require.NotNil(t, dead.DeadLetterReason)
	assert.Equal(t, broker.ReasonTTLExpired, *dead.DeadLetterReason)
}

func TestSDKDeferredPersistsAcrossRestart(t *testing.T) {
	cfg := Config{DataDir: t.TempDir()}
	em := StartT(t, cfg)
	client := newClient(t, em)
	seq := deferReceived(t, newSender(t, client, "queue"), newReceiver(t, client, "queue", nil), "kept")
	require.NoError(t, client.Close(ctxT(t)))
	require.NoError(t, em.Close())

	em2 := StartT(t, cfg)
	client2 := newClient(t, em2)
	receiver2 := newReceiver(t, client2, "queue", nil)
	peeked := peekAll(t, receiver2)
	require.Len(t, peeked, 1)
	assert.Equal(t, azservicebus.MessageStateDeferred, peeked[0].State)
	got, err := receiver2.ReceiveDeferredMessages(ctxT(t), []int64{seq}, nil)
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, "kept", string(got[0].Body))
	require.NoError(t, receiver2.CompleteMessage(ctxT(t), got[0], nil))
}

// TestAMQPReceiveBySequenceNumberBounds: the count is bounded by
// Limits.MaxPeekCount and a malformed request is a 400, not a panic.
func TestAMQPReceiveBySequenceNumberBounds(t *testing.T) {
	em := startEmulator(t, Config{Limits: Limits{MaxPeekCount: 2}})
	session := dialAMQP(t, em)
	tests := []struct {
		name string
		body any
	}{
		{"over the limit", map[string]any{"sequence-numbers": []int64{1, 2, 3}}},
		{"not an array", map[string]any{"sequence-numbers": "1"}},
		{"empty", map[string]any{"sequence-numbers": []int64{}}},
		{"no map", "x"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reply := managementRequest(t, session, "queue/$management", &amqp.Message{
				ApplicationProperties: map[string]any{"operation": opReceiveBySequenceNumber},
				Value:                 tc.body,
			})
			assert.Equal(t, int32(400), reply.ApplicationProperties["statusCode"])
		})
	}
}
