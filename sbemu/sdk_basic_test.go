package sbemu

import (
	"testing"

	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSDKSendReceiveComplete(t *testing.T) {
	em := startEmulator(t, Config{Queues: nil})
	client := newClient(t, em)
	sender := newSender(t, client, DefaultQueueName)
	receiver := newReceiver(t, client, DefaultQueueName, nil)

	sendText(t, sender, "hello")
	msg := receiveOne(t, receiver)
	assert.Equal(t, "hello", string(msg.Body))
	assert.Equal(t, uint32(1), msg.DeliveryCount)
	require.NotNil(t, msg.SequenceNumber)
	require.NotNil(t, msg.LockedUntil)
	require.NotNil(t, msg.EnqueuedTime)
	require.NoError(t, receiver.CompleteMessage(ctxT(t), msg, nil))

	q, ok := em.Broker().Queue(DefaultQueueName)
	require.True(t, ok)
	st := q.Stats()
	assert.Zero(t, st.Active)
	assert.Zero(t, st.Locked)
}

// TestSDKDeliveryCarriesLockTokenAnnotation: a peek-lock delivery names its
// lock token in the x-opt-lock-token delivery annotation too, as Service Bus
// does, equal to the one the SDK reads from the delivery tag.
func TestSDKDeliveryCarriesLockTokenAnnotation(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sendText(t, newSender(t, client, "queue"), "locked")
	msg := receiveOne(t, newReceiver(t, client, "queue", nil))

	require.NotNil(t, msg.RawAMQPMessage)
	token, ok := msg.RawAMQPMessage.DeliveryAnnotations["x-opt-lock-token"]
	require.True(t, ok, "delivery annotations: %v", msg.RawAMQPMessage.DeliveryAnnotations)
	assert.Equal(t, amqp.UUID(msg.LockToken), token)
}
