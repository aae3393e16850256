package sbemu

import (
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

func TestSDKDuplicateDetection(t *testing.T) {
	em := startEmulator(t, Config{Queues: []broker.QueueConfig{{Name: "q", DuplicateDetectionWindow: time.Minute}}})
	client := newClient(t, em)
	sender := newSender(t, client, "q")

	for i := 0; i < 2; i++ {
		require.NoError(t, sender.SendMessage(ctxT(t), &azservicebus.Message{MessageID: to.Ptr("order-1"), Body: []byte("copy")}, nil))
	}
	require.NoError(t, sender.SendMessage(ctxT(t), &azservicebus.Message{MessageID: to.Ptr("order-2"), Body: []byte("other")}, nil))

	q, _ := em.Broker().Queue("q")
	assert.Equal(t, 2, q.Stats().Active, "the duplicate was dropped")

	receiver := newReceiver(t, client, "q", nil)
	msgs, err := receiver.ReceiveMessages(ctxT(t), 10, nil)
	require.NoError(t, err)
	for len(msgs) < 2 {
		more, err := receiver.ReceiveMessages(ctxT(t), 10, nil)
		require.NoError(t, err)
		msgs = append(msgs, more...)
	}
	require.Len(t, msgs, 2)
	assert.Equal(t, "order-1", msgs[0].MessageID)
	assert.Equal(t, "order-2", msgs[1].MessageID)
}

func TestSDKTimeToLiveExpiresToDeadLetterQueue(t *testing.T) {
	mock := clock.NewMock()
	em := startEmulator(t, Config{Clock: mock, Queues: []broker.QueueConfig{{Name: "q", DeadLetterOnExpiration: true}}})
	client := newClient(t, em)
	sender := newSender(t, client, "q")
	require.NoError(t, sender.SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("stale"), TimeToLive: to.Ptr(10 * time.Second)}, nil))
	require.NoError(t, sender.SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("fresh")}, nil))

	mock.Add(11 * time.Second)

	receiver := newReceiver(t, client, "q", nil)
	msg := receiveOne(t, receiver)
	assert.Equal(t, "fresh", string(msg.Body), "the expired message is never delivered")

	dlq := newReceiver(t, client, "q", &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	dead := receiveOne(t, dlq)
	assert.Equal(t, "stale", string(dead.Body))
	require.NotNil(t, dead.DeadLetterReason)
	assert.Equal(t, broker.ReasonTTLExpired, *dead.DeadLetterReason)
	require.NotNil(t, dead.TimeToLive)
	assert.Equal(t, 10*time.Second, *dead.TimeToLive)
}

func TestSDKMessageTooLarge(t *testing.T) {
	em := startEmulator(t, Config{Queues: []broker.QueueConfig{{Name: "q", MaxMessageSize: 4096}}})
	client := newClient(t, em)
	sender := newSender(t, client, "q")

	err := sender.SendMessage(ctxT(t), &azservicebus.Message{Body: []byte(strings.Repeat("x", 8192))}, nil)
	// The emulator advertises the queue's limit as the link's
	// max-message-size and rejects larger transfers with
	// amqp:link:message-size-exceeded; the SDK reports either as
	// ErrMessageTooLarge.
	require.ErrorIs(t, err, azservicebus.ErrMessageTooLarge)

	// The link survives: a small message still goes through.
	sendText(t, sender, "small")
	q, _ := em.Broker().Queue("q")
	assert.Equal(t, 1, q.Stats().Active)
}

func TestSDKLargeMessageSpansFrames(t *testing.T) {
	em := startEmulator(t, Config{Queues: []broker.QueueConfig{{Name: "q", MaxMessageSize: 1 << 20}}})
	client := newClient(t, em)
	body := []byte(strings.Repeat("0123456789abcdef", 40_000)) // 640 KB: ten 64 KiB frames each way
	require.NoError(t, newSender(t, client, "q").SendMessage(ctxT(t), &azservicebus.Message{Body: body}, nil))

	receiver := newReceiver(t, client, "q", nil)
	msg := receiveOne(t, receiver)
	assert.Equal(t, body, msg.Body)
	require.NoError(t, receiver.CompleteMessage(ctxT(t), msg, nil))
}

func TestSDKSendMessageBatch(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sender := newSender(t, client, "queue")
	batch, err := sender.NewMessageBatch(ctxT(t), nil)
	require.NoError(t, err)
	for _, body := range []string{"b1", "b2", "b3"} {
		require.NoError(t, batch.AddMessage(&azservicebus.Message{Body: []byte(body)}, nil))
	}
	require.NoError(t, sender.SendMessageBatch(ctxT(t), batch, nil))

	q, _ := em.Broker().Queue("queue")
	msgs := q.ActiveMessages()
	require.Len(t, msgs, 3)
	for i, want := range []string{"b1", "b2", "b3"} {
		assert.Equal(t, want, string(msgs[i].GetData()))
	}
}

// TestSDKUnknownQueueIsNotFound: sending to, receiving from and peeking an
// entity that does not exist fails with CodeNotFound, because the put-token
// before the links is answered 404 (cbs.go), as the SDK's live tests
// TestNewClientNewSenderNotFound and TestNewClientNewReceiverNotFound expect.
func TestSDKUnknownQueueIsNotFound(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sender := newSender(t, client, "no-such-queue")
	err := sender.SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("x")}, nil)
	requireCode(t, err, azservicebus.CodeNotFound)
	assert.Contains(t, err.Error(), "status code 404")

	receiver := newReceiver(t, client, "no-such-queue", nil)
	_, err = receiver.ReceiveMessages(ctxT(t), 1, nil)
	requireCode(t, err, azservicebus.CodeNotFound)

	sub, err := client.NewReceiverForSubscription("no-such-topic", "no-such-subscription", nil)
	require.NoError(t, err)
	defer func() { _ = sub.Close(ctxT(t)) }()
	_, err = sub.PeekMessages(ctxT(t), 1, nil)
	requireCode(t, err, azservicebus.CodeNotFound)

	_, err = client.AcceptNextSessionForQueue(ctxT(t), "no-such-queue", nil)
	requireCode(t, err, azservicebus.CodeNotFound)
}

func TestSDKPropertiesTooLarge(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sender := newSender(t, client, "queue")
	big := map[string]any{"p": strings.Repeat("x", broker.MaxPropertySize)}
	err := sender.SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("x"), ApplicationProperties: big}, nil)
	require.Error(t, err, "a property over 32 KiB is refused, as Service Bus refuses it")
	_, err = sender.ScheduleMessages(ctxT(t), []*azservicebus.Message{{Body: []byte("x"), ApplicationProperties: big}}, time.Now().Add(time.Minute), nil)
	require.Error(t, err)
	q, _ := em.Broker().Queue("queue")
	st := q.Stats()
	assert.Zero(t, st.Active+st.Scheduled)
}
