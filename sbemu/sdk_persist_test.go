package sbemu

import (
	"context"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

// receiveN receives until n messages arrived.
func receiveN(t *testing.T, ctx context.Context, r *azservicebus.Receiver, n int) []*azservicebus.ReceivedMessage {
	t.Helper()
	var out []*azservicebus.ReceivedMessage
	for len(out) < n {
		msgs, err := r.ReceiveMessages(ctx, n-len(out), nil)
		require.NoError(t, err)
		out = append(out, msgs...)
	}
	return out
}

// TestSDKPersistenceSurvivesRestart drives an emulator with DataDir through
// the real SDK (sends, a scheduled message, settlements and a queue
// created through the administration API), closes it, starts another on
// the same directory and finds every acknowledged change there.
func TestSDKPersistenceSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{DataDir: dir, Queues: []broker.QueueConfig{{Name: "orders", DuplicateDetectionWindow: time.Hour}}}
	ctx := ctxT(t)

	em := StartT(t, cfg)
	client := newClient(t, em)
	sender := newSender(t, client, "orders")
	for i, body := range []string{"one", "two", "three", "four"} {
		require.NoError(t, sender.SendMessage(ctx, &azservicebus.Message{
			Body: []byte(body), MessageID: to.Ptr(body), ApplicationProperties: map[string]any{"i": int64(i)},
		}, nil))
	}
	scheduled, err := sender.ScheduleMessages(ctx, []*azservicebus.Message{{Body: []byte("later")}}, time.Now().Add(time.Hour), nil)
	require.NoError(t, err)
	require.Len(t, scheduled, 1)
	receiver := newReceiver(t, client, "orders", nil)
	got := receiveN(t, ctx, receiver, 4)
	require.NoError(t, receiver.CompleteMessage(ctx, got[0], nil))
	require.NoError(t, receiver.DeadLetterMessage(ctx, got[1], &azservicebus.DeadLetterOptions{Reason: to.Ptr("Poison")}))
	require.NoError(t, receiver.AbandonMessage(ctx, got[2], nil))
	// got[3] stays locked until the emulator closes.
	ac, err := admin.NewClientFromConnectionString(em.ConnectionString(), em.AdminClientOptions())
	require.NoError(t, err)
	_, err = ac.CreateQueue(ctx, "created-by-admin", nil)
	require.NoError(t, err)
	require.NoError(t, client.Close(ctx))
	require.NoError(t, em.Close())

	em2 := StartT(t, cfg)
	client2 := newClient(t, em2)
	receiver2 := newReceiver(t, client2, "orders", nil)
	again := receiveN(t, ctx, receiver2, 2)
	assert.Equal(t, "three", string(again[0].Body))
	assert.Equal(t, int64(2), again[0].ApplicationProperties["i"])
	assert.Equal(t, uint32(2), again[0].DeliveryCount, "abandoned once")
	assert.Equal(t, "four", string(again[1].Body))
	assert.Equal(t, uint32(2), again[1].DeliveryCount, "the lock lost at close counts")
	assert.Equal(t, got[3].SequenceNumber, again[1].SequenceNumber)
	for _, m := range again {
		require.NoError(t, receiver2.CompleteMessage(ctx, m, nil))
	}

	dlq := newReceiver(t, client2, "orders", &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	dead := receiveN(t, ctx, dlq, 1)
	assert.Equal(t, "two", string(dead[0].Body))
	require.NotNil(t, dead[0].DeadLetterReason)
	assert.Equal(t, "Poison", *dead[0].DeadLetterReason)

	peeked, err := receiver2.PeekMessages(ctx, 10, &azservicebus.PeekMessagesOptions{FromSequenceNumber: &scheduled[0]})
	require.NoError(t, err)
	require.Len(t, peeked, 1)
	assert.Equal(t, azservicebus.MessageStateScheduled, peeked[0].State)
	sender2 := newSender(t, client2, "orders")
	require.NoError(t, sender2.CancelScheduledMessages(ctx, scheduled, nil), "the scheduled number survived")

	// Duplicate detection still knows "one"; a new message gets a new number.
	require.NoError(t, sender2.SendMessage(ctx, &azservicebus.Message{Body: []byte("dup"), MessageID: to.Ptr("one")}, nil))
	require.NoError(t, sender2.SendMessage(ctx, &azservicebus.Message{Body: []byte("five"), MessageID: to.Ptr("five")}, nil))
	fresh := receiveN(t, ctx, receiver2, 1)
	assert.Equal(t, "five", string(fresh[0].Body))
	assert.Greater(t, *fresh[0].SequenceNumber, scheduled[0], "sequence numbers continue")

	ac2, err := admin.NewClientFromConnectionString(em2.ConnectionString(), em2.AdminClientOptions())
	require.NoError(t, err)
	q, err := ac2.GetQueue(ctx, "created-by-admin", nil)
	require.NoError(t, err)
	assert.NotNil(t, q, "the queue created through the administration API")
}

// Once the journal has stopped (here: a write fault injected, then a message handed to the broker
// directly), a receive link waiting for messages is detached with the error, so the SDK's receive returns
// and recovers instead of waiting silently on a link that will never deliver.
func TestSDKReceiveLinkDetachedWhenTheJournalStops(t *testing.T) {
	em, err := Start(Config{DataDir: t.TempDir(), Queues: []broker.QueueConfig{{Name: "orders"}}})
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.Error(t, em.Close(), "Close reports the journal's failure")
	})
	client := newClient(t, em)
	receiver := newReceiver(t, client, "orders", nil)
	sender := newSender(t, client, "orders")
	sendText(t, sender, "first")
	first := receiveOne(t, receiver)
	require.NoError(t, receiver.CompleteMessage(ctxT(t), first, nil))

	got := make(chan error, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	go func() {
		_, err := receiver.ReceiveMessages(ctx, 1, nil)
		got <- err
	}()
	q, ok := em.Broker().Queue("orders")
	require.True(t, ok)
	require.NoError(t, em.Broker().InjectJournalFault(broker.JournalWriteFault))
	_, _, _ = q.Send(&amqp.Message{Data: [][]byte{[]byte("x")}}, 10)
	err = <-got
	assert.NoError(t, err, "the receive returns when the link is detached, not at its deadline")
	assert.NoError(t, ctx.Err())
}

// TestSDKJournalFailureIsNeverAcknowledged makes the journal's next write
// or fsync fail under the real SDK: the send that needed it fails (it must
// not succeed), so does a complete after it, the emulator's Close reports
// the failure, and an emulator started on the same directory has exactly
// what was acknowledged: both messages sent before, the completed one
// included, and not the failed send.
func TestSDKJournalFailureIsNeverAcknowledged(t *testing.T) {
	for _, fault := range []broker.JournalFault{broker.JournalWriteFault, broker.JournalSyncFault} {
		t.Run(map[broker.JournalFault]string{broker.JournalWriteFault: "write", broker.JournalSyncFault: "fsync"}[fault], func(t *testing.T) {
			cfg := Config{DataDir: t.TempDir(), Queues: []broker.QueueConfig{{Name: "orders"}}}
			em, err := Start(cfg)
			require.NoError(t, err)
			closed := false
			t.Cleanup(func() {
				if !closed {
					_ = em.Close()
				}
			})
			ctx := ctxT(t)
			client := newClient(t, em)
			sender := newSender(t, client, "orders")
			sendText(t, sender, "kept-1")
			sendText(t, sender, "kept-2")
			receiver := newReceiver(t, client, "orders", nil)
			got := receiveN(t, ctx, receiver, 1)
			require.Equal(t, "kept-1", string(got[0].Body))

			require.NoError(t, em.Broker().InjectJournalFault(fault))
			err = sender.SendMessage(ctx, &azservicebus.Message{Body: []byte("lost"), MessageID: to.Ptr("lost")}, nil)
			require.Error(t, err, "SendMessage must fail when its message could not be made durable")
			assert.Contains(t, err.Error(), "persistence failed")
			// The complete is refused too; the SDK then recovers its
			// connection, whose authentication the stopped journal refuses
			// as well, and would retry until its context ends.
			completeCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			assert.Error(t, receiver.CompleteMessage(completeCtx, got[0], nil), "nor is a complete acknowledged after the failure")
			require.NoError(t, client.Close(ctx))
			closed = true
			assert.Error(t, em.Close(), "Close reports the journal's failure")

			ctx = ctxT(t)
			em2 := StartT(t, cfg)
			client2 := newClient(t, em2)
			receiver2 := newReceiver(t, client2, "orders", nil)
			peeked, err := receiver2.PeekMessages(ctx, 10, nil)
			require.NoError(t, err)
			var bodies []string
			for _, m := range peeked {
				bodies = append(bodies, string(m.Body))
			}
			assert.Equal(t, []string{"kept-1", "kept-2"}, bodies)
		})
	}
}
