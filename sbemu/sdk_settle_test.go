package sbemu

import (
	"errors"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

// requireCode asserts that err is an *azservicebus.Error with code.
func requireCode(t *testing.T, err error, code azservicebus.Code) {
	t.Helper()
	require.Error(t, err)
	var sbErr *azservicebus.Error
	require.True(t, errors.As(err, &sbErr), "want *azservicebus.Error, got %T: %v", err, err)
	assert.Equal(t, code, sbErr.Code, "error: %v", err)
}

func TestSDKAbandonRedeliversWithDeliveryCount2(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sendText(t, newSender(t, client, "queue"), "again")
	receiver := newReceiver(t, client, "queue", nil)

	first := receiveOne(t, receiver)
	assert.Equal(t, uint32(1), first.DeliveryCount)
	require.NoError(t, receiver.AbandonMessage(ctxT(t), first, &azservicebus.AbandonMessageOptions{
		PropertiesToModify: map[string]any{"attempt": int64(1)},
	}))

	second := receiveOne(t, receiver)
	assert.Equal(t, "again", string(second.Body))
	assert.Equal(t, uint32(2), second.DeliveryCount)
	assert.Equal(t, *first.SequenceNumber, *second.SequenceNumber)
	assert.Equal(t, int64(1), second.ApplicationProperties["attempt"], "PropertiesToModify become application properties")
	require.NoError(t, receiver.CompleteMessage(ctxT(t), second, nil))
}

func TestSDKDeadLetterReadBackFromDeadLetterQueue(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sendText(t, newSender(t, client, "queue"), "poison")
	receiver := newReceiver(t, client, "queue", nil)

	msg := receiveOne(t, receiver)
	require.NoError(t, receiver.DeadLetterMessage(ctxT(t), msg, &azservicebus.DeadLetterOptions{
		Reason:           to.Ptr("BadPayload"),
		ErrorDescription: to.Ptr("could not parse"),
	}))

	dlq := newReceiver(t, client, "queue", &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	dead := receiveOne(t, dlq)
	assert.Equal(t, "poison", string(dead.Body))
	require.NotNil(t, dead.DeadLetterReason)
	assert.Equal(t, "BadPayload", *dead.DeadLetterReason)
	require.NotNil(t, dead.DeadLetterErrorDescription)
	assert.Equal(t, "could not parse", *dead.DeadLetterErrorDescription)
	require.NotNil(t, dead.DeadLetterSource)
	assert.Equal(t, "queue", *dead.DeadLetterSource)
	require.NoError(t, dlq.CompleteMessage(ctxT(t), dead, nil))
}

func TestSDKMaxDeliveryCountDeadLetters(t *testing.T) {
	em := startEmulator(t, Config{Queues: []broker.QueueConfig{{Name: "q", MaxDeliveryCount: 2}}})
	client := newClient(t, em)
	sendText(t, newSender(t, client, "q"), "flaky")
	receiver := newReceiver(t, client, "q", nil)

	for i := 1; i <= 2; i++ {
		msg := receiveOne(t, receiver)
		assert.Equal(t, uint32(i), msg.DeliveryCount)
		require.NoError(t, receiver.AbandonMessage(ctxT(t), msg, nil))
	}

	dlq := newReceiver(t, client, "q", &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	dead := receiveOne(t, dlq)
	require.NotNil(t, dead.DeadLetterReason)
	assert.Equal(t, broker.ReasonMaxDeliveryCountExceeded, *dead.DeadLetterReason)
	q, _ := em.Broker().Queue("q")
	assert.Zero(t, q.Stats().Active)
}

func TestSDKRenewMessageLock(t *testing.T) {
	mock := clock.NewMock()
	mock.Set(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	em := startEmulator(t, Config{Clock: mock, Queues: []broker.QueueConfig{{Name: "q", LockDuration: time.Minute}}})
	client := newClient(t, em)
	sendText(t, newSender(t, client, "q"), "long job")
	receiver := newReceiver(t, client, "q", nil)

	msg := receiveOne(t, receiver)
	require.NotNil(t, msg.LockedUntil)
	assert.True(t, msg.LockedUntil.Equal(mock.Now().Add(time.Minute)), "locked until %v", msg.LockedUntil)

	mock.Add(40 * time.Second)
	require.NoError(t, receiver.RenewMessageLock(ctxT(t), msg, nil))
	assert.True(t, msg.LockedUntil.Equal(mock.Now().Add(time.Minute)), "renewed until %v", msg.LockedUntil)

	mock.Add(40 * time.Second) // past the original lock, inside the renewed one
	require.NoError(t, receiver.CompleteMessage(ctxT(t), msg, nil))
}

func TestSDKRenewMessageLockAfterExpiryIsLockLost(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sendText(t, newSender(t, client, "queue"), "x")
	receiver := newReceiver(t, client, "queue", nil)
	msg := receiveOne(t, receiver)

	em.ExpireLocks()
	requireCode(t, receiver.RenewMessageLock(ctxT(t), msg, nil), azservicebus.CodeLockLost)
}

func TestSDKLockExpiryRedelivers(t *testing.T) {
	mock := clock.NewMock()
	em := startEmulator(t, Config{Clock: mock, Queues: []broker.QueueConfig{{Name: "q", LockDuration: 30 * time.Second}}})
	client := newClient(t, em)
	sendText(t, newSender(t, client, "q"), "slow")
	receiver := newReceiver(t, client, "q", nil)

	first := receiveOne(t, receiver)
	assert.Equal(t, uint32(1), first.DeliveryCount)
	mock.Add(31 * time.Second)

	second := receiveOne(t, receiver)
	assert.Equal(t, "slow", string(second.Body))
	assert.Equal(t, uint32(2), second.DeliveryCount)
	assert.NotEqual(t, first.LockToken, second.LockToken)

	requireCode(t, receiver.CompleteMessage(ctxT(t), first, nil), azservicebus.CodeLockLost)
	require.NoError(t, receiver.CompleteMessage(ctxT(t), second, nil))
}

func TestSDKSettleAfterLockExpiryIsLockLost(t *testing.T) {
	mock := clock.NewMock()
	em := startEmulator(t, Config{Clock: mock, Queues: []broker.QueueConfig{{Name: "q", LockDuration: 10 * time.Second}}})
	client := newClient(t, em)
	sender := newSender(t, client, "q")
	receiver := newReceiver(t, client, "q", nil)

	tests := []struct {
		name   string
		settle func(*azservicebus.ReceivedMessage) error
	}{
		{"complete", func(m *azservicebus.ReceivedMessage) error { return receiver.CompleteMessage(ctxT(t), m, nil) }},
		{"abandon", func(m *azservicebus.ReceivedMessage) error { return receiver.AbandonMessage(ctxT(t), m, nil) }},
		{"dead-letter", func(m *azservicebus.ReceivedMessage) error { return receiver.DeadLetterMessage(ctxT(t), m, nil) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sendText(t, sender, tc.name)
			msg := receiveOne(t, receiver)
			mock.Add(11 * time.Second)
			requireCode(t, tc.settle(msg), azservicebus.CodeLockLost)
			// The expired message is back; take it out for the next case.
			again := receiveOne(t, receiver)
			require.NoError(t, receiver.CompleteMessage(ctxT(t), again, nil))
		})
	}
}

func TestSDKReceiveAndDelete(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sendText(t, newSender(t, client, "queue"), "once")
	receiver := newReceiver(t, client, "queue", &azservicebus.ReceiverOptions{ReceiveMode: azservicebus.ReceiveModeReceiveAndDelete})

	msg := receiveOne(t, receiver)
	assert.Equal(t, "once", string(msg.Body))
	q, _ := em.Broker().Queue("queue")
	// The emulator deletes the message once its transfer is queued for the
	// socket, which may be just after the client has it.
	waitFor(t, func() bool { st := q.Stats(); return st.Active+st.Locked == 0 })
	assert.Equal(t, broker.Stats{}, q.Stats(), "receive-and-delete removes the message")
}

// TestSDKDeadLetterCountsFailedDeliveriesOnly: a message abandoned once and
// then dead-lettered reads DeliveryCount 2 from the dead-letter queue, before
// and after an abandon there, as on Service Bus (the SDK's live test
// TestMessageSettlementUsingReceiver; Azure/azure-sdk-for-net#53437).
func TestSDKDeadLetterCountsFailedDeliveriesOnly(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sendText(t, newSender(t, client, "queue"), "twice")
	receiver := newReceiver(t, client, "queue", nil)

	first := receiveOne(t, receiver)
	require.NoError(t, receiver.AbandonMessage(ctxT(t), first, nil))
	second := receiveOne(t, receiver)
	require.Equal(t, uint32(2), second.DeliveryCount)
	require.NoError(t, receiver.DeadLetterMessage(ctxT(t), second, nil))

	dlq := newReceiver(t, client, "queue", &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	dead := receiveOne(t, dlq)
	assert.Equal(t, uint32(2), dead.DeliveryCount, "the dead-letter settled the second delivery; only the first failed")
	require.NoError(t, dlq.AbandonMessage(ctxT(t), dead, nil))
	again := receiveOne(t, dlq)
	assert.Equal(t, uint32(2), again.DeliveryCount, "deliveries from the dead-letter queue do not count")
	require.NoError(t, dlq.CompleteMessage(ctxT(t), again, nil))
}
