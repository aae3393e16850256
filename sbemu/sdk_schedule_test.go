package sbemu

import (
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scheduleDelay is short real time so the tests stay fast; the assertions
// compare against the scheduled instant, not against a sleep.
const scheduleDelay = 300 * time.Millisecond

// scheduleAt returns an instant scheduleDelay from now, truncated to the
// millisecond precision of an AMQP timestamp so that the time the emulator
// receives is exactly the time the test asserts against.
func scheduleAt() time.Time {
	return time.Now().Add(scheduleDelay).Truncate(time.Millisecond)
}

func TestSDKScheduleMessages(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sender := newSender(t, client, "queue")
	receiver := newReceiver(t, client, "queue", nil)

	at := scheduleAt()
	seqs, err := sender.ScheduleMessages(ctxT(t), []*azservicebus.Message{
		{Body: []byte("later-1")}, {Body: []byte("later-2")},
	}, at, nil)
	require.NoError(t, err)
	require.Len(t, seqs, 2)
	assert.NotEqual(t, seqs[0], seqs[1])

	q, _ := em.Broker().Queue("queue")
	assert.Len(t, q.ScheduledMessages(), 2, "both wait for their time") // may flake only if the CI stalls 300ms

	got := map[string]bool{}
	for len(got) < 2 {
		msgs, err := receiver.ReceiveMessages(ctxT(t), 2, nil)
		require.NoError(t, err)
		now := time.Now()
		for _, m := range msgs {
			assert.False(t, now.Before(at), "received at %v, before the scheduled %v", now, at)
			require.NotNil(t, m.ScheduledEnqueueTime)
			assert.WithinDuration(t, at, *m.ScheduledEnqueueTime, time.Millisecond)
			got[string(m.Body)] = true
			require.NoError(t, receiver.CompleteMessage(ctxT(t), m, nil))
		}
	}
	assert.Equal(t, map[string]bool{"later-1": true, "later-2": true}, got)
}

func TestSDKCancelScheduledMessages(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sender := newSender(t, client, "queue")

	seqs, err := sender.ScheduleMessages(ctxT(t), []*azservicebus.Message{{Body: []byte("never")}}, time.Now().Add(time.Hour), nil)
	require.NoError(t, err)
	require.Len(t, seqs, 1)
	q, _ := em.Broker().Queue("queue")
	require.Len(t, q.ScheduledMessages(), 1)

	require.NoError(t, sender.CancelScheduledMessages(ctxT(t), seqs, nil))
	assert.Empty(t, q.ScheduledMessages())

	// Cancelling again: the message is gone.
	requireCode(t, sender.CancelScheduledMessages(ctxT(t), seqs, nil), azservicebus.CodeNotFound)
}

func TestSDKSendMessageWithScheduledEnqueueTime(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sender := newSender(t, client, "queue")
	receiver := newReceiver(t, client, "queue", nil)

	at := scheduleAt()
	require.NoError(t, sender.SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("timed"), ScheduledEnqueueTime: &at}, nil))

	msg := receiveOne(t, receiver)
	assert.False(t, time.Now().Before(at), "received before the scheduled time")
	assert.Equal(t, "timed", string(msg.Body))
	require.NotNil(t, msg.ScheduledEnqueueTime)
	require.NoError(t, receiver.CompleteMessage(ctxT(t), msg, nil))
}

func TestSDKPeekMessages(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sender := newSender(t, client, "queue")
	for _, body := range []string{"a", "b", "c"} {
		sendText(t, sender, body)
	}
	receiver := newReceiver(t, client, "queue", nil)

	peeked, err := receiver.PeekMessages(ctxT(t), 2, nil)
	require.NoError(t, err)
	require.Len(t, peeked, 2)
	assert.Equal(t, "a", string(peeked[0].Body))
	assert.Equal(t, "b", string(peeked[1].Body))
	require.NotNil(t, peeked[0].SequenceNumber)
	require.NotNil(t, peeked[1].SequenceNumber)
	assert.Less(t, *peeked[0].SequenceNumber, *peeked[1].SequenceNumber)

	// The receiver continues after the last peeked sequence number.
	rest, err := receiver.PeekMessages(ctxT(t), 10, nil)
	require.NoError(t, err)
	require.Len(t, rest, 1)
	assert.Equal(t, "c", string(rest[0].Body))

	// Nothing left: the emulator answers 204 and the SDK returns no messages.
	none, err := receiver.PeekMessages(ctxT(t), 10, nil)
	require.NoError(t, err)
	assert.Empty(t, none)

	// Peeking locks nothing: all three are still receivable.
	q, _ := em.Broker().Queue("queue")
	assert.Equal(t, 3, q.Stats().Active)
}
