package sbemu

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

// newInMemoryClient connects the SDK to em through a pipe.
func newInMemoryClient(t *testing.T, em *Emulator) *azservicebus.Client {
	t.Helper()
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), &azservicebus.ClientOptions{
		NewWebSocketConn: em.NewWebSocketConn,
	})
	require.NoError(t, err)
	return client
}

// TestSDKInMemoryAlongsideTCP uses the in-memory door of an emulator that
// also listens on TCP: both clients reach the same broker.
func TestSDKInMemoryAlongsideTCP(t *testing.T) {
	em := startEmulator(t, Config{})
	mem := newInMemoryClient(t, em)
	t.Cleanup(func() { _ = mem.Close(context.Background()) })
	sendText(t, newSender(t, mem, "queue"), "through a pipe")
	msg := receiveOne(t, newReceiver(t, newClient(t, em), "queue", nil))
	assert.Equal(t, "through a pipe", string(msg.Body))
}

// TestSDKInsideSynctest runs the unmodified SDK, the emulator and its broker
// in one testing/synctest bubble, on the default clock: a message scheduled
// an hour ahead arrives, and a lock expires, as soon as every goroutine
// waits, with the bubble's fake time showing exactly the hour and the lock
// duration. Nothing waits for real time.
func TestSDKInsideSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		em, err := Start(Config{InMemory: true, Queues: []broker.QueueConfig{{Name: "q", LockDuration: time.Minute}}})
		require.NoError(t, err)
		defer func() { require.NoError(t, em.Close()) }()
		assert.Contains(t, em.ConnectionString(), "sb://"+InMemoryHost)

		ctx := context.Background()
		client := newInMemoryClient(t, em)
		defer func() { _ = client.Close(ctx) }()
		sender, err := client.NewSender("q", nil)
		require.NoError(t, err)
		defer func() { _ = sender.Close(ctx) }()
		receiver, err := client.NewReceiverForQueue("q", nil)
		require.NoError(t, err)
		defer func() { _ = receiver.Close(ctx) }()

		start := time.Now()
		_, err = sender.ScheduleMessages(ctx, []*azservicebus.Message{{Body: []byte("in an hour")}}, start.Add(time.Hour), nil)
		require.NoError(t, err)
		msgs, err := receiver.ReceiveMessages(ctx, 1, nil)
		require.NoError(t, err)
		require.Len(t, msgs, 1)
		assert.Equal(t, "in an hour", string(msgs[0].Body))
		assert.GreaterOrEqual(t, time.Since(start), time.Hour)
		assert.Less(t, time.Since(start), time.Hour+time.Second, "delivered when due, not later")

		// The lock runs out on the same fake time: the message comes back.
		again, err := receiver.ReceiveMessages(ctx, 1, nil)
		require.NoError(t, err)
		require.Len(t, again, 1)
		assert.Equal(t, uint32(2), again[0].DeliveryCount)
		var sbErr *azservicebus.Error
		require.ErrorAs(t, receiver.CompleteMessage(ctx, msgs[0], nil), &sbErr)
		assert.Equal(t, azservicebus.CodeLockLost, sbErr.Code)
		require.NoError(t, receiver.CompleteMessage(ctx, again[0], nil))
	})
}
