package sbemu

import (
	"testing"

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
