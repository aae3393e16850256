package sbemu

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

func TestSDKDropConnectionsRecoversWithoutLoss(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sender := newSender(t, client, "queue")
	receiver := newReceiver(t, client, "queue", nil)

	const n = 10
	for i := 0; i < n; i++ {
		sendText(t, sender, fmt.Sprint(i))
	}
	// Hold some messages under lock, then lose the connection.
	held, err := receiver.ReceiveMessages(ctxT(t), 3, nil)
	require.NoError(t, err)
	require.NotEmpty(t, held)

	em.DropConnections()

	// Both sender and receiver recover on their next calls.
	sendText(t, sender, fmt.Sprint(n))
	got := map[string]uint32{}
	for len(got) < n+1 {
		msgs, err := receiver.ReceiveMessages(ctxT(t), 20, nil)
		require.NoError(t, err) // a call interrupted by the drop returns (nil, nil)
		for _, m := range msgs {
			got[string(m.Body)] = m.DeliveryCount
			require.NoError(t, receiver.CompleteMessage(ctxT(t), m, nil))
		}
	}
	for _, m := range held {
		assert.Equal(t, uint32(2), got[string(m.Body)], "a lock lost with the connection counts as a delivery")
	}
	q, _ := em.Broker().Queue("queue")
	st := q.Stats()
	assert.Zero(t, st.Active+st.Locked+st.DeadLettered)
}

func TestSDKDropConnectionsDuringBlockedReceive(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	receiver := newReceiver(t, client, "queue", nil)
	sendText(t, newSender(t, client, "queue"), "warm-up")
	require.NoError(t, receiver.CompleteMessage(ctxT(t), receiveOne(t, receiver), nil))

	type result struct {
		msgs []*azservicebus.ReceivedMessage
		err  error
	}
	done := make(chan result, 1)
	go func() {
		msgs, err := receiver.ReceiveMessages(ctxT(t), 1, nil)
		done <- result{msgs, err}
	}()
	// Wait until the receive is parked on the broker, then cut the wire.
	q, _ := em.Broker().Queue("queue")
	require.Eventually(t, func() bool { return em.receiversWaiting() > 0 }, testTimeout, time.Millisecond)
	em.DropConnections()
	res := <-done
	assert.NoError(t, res.err)
	assert.Empty(t, res.msgs, "the SDK returns (nil, nil) when the connection drops mid-receive")

	sendText(t, newSender(t, client, "queue"), "after")
	msg := receiveAfterRecovery(t, receiver)
	assert.Equal(t, "after", string(msg.Body))
	require.NoError(t, receiver.CompleteMessage(ctxT(t), msg, nil))
	assert.Zero(t, q.Stats().Active)
}

func TestSDKHangDelaysThenResumes(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sender := newSender(t, client, "queue")
	sendText(t, sender, "before")

	const hang = 300 * time.Millisecond
	start := time.Now()
	em.Hang(hang)
	sendText(t, sender, "during")
	assert.GreaterOrEqual(t, time.Since(start), hang, "the send waited for the hang to end")

	q, _ := em.Broker().Queue("queue")
	assert.Equal(t, 2, q.Stats().Active)
}

func TestSDKHangTimesOutCallers(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sender := newSender(t, client, "queue")
	sendText(t, sender, "before")

	em.Hang(time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := sender.SendMessage(ctx, &azservicebus.Message{Body: []byte("stuck")}, nil)
	require.Error(t, err)
	em.Hang(0) // end the hang so closing the client does not wait
}

func TestSDKRejectNextSends(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sender := newSender(t, client, "queue")

	em.RejectNextSends(1, "amqp:not-allowed")
	err := sender.SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("refused")}, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "amqp:not-allowed")

	sendText(t, sender, "accepted")
	q, _ := em.Broker().Queue("queue")
	msgs := q.ActiveMessages()
	require.Len(t, msgs, 1)
	assert.Equal(t, "accepted", string(msgs[0].GetData()))
}

func TestSDKRejectNextSettlements(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sendText(t, newSender(t, client, "queue"), "sticky")
	receiver := newReceiver(t, client, "queue", nil)
	msg := receiveOne(t, receiver)

	em.RejectNextSettlements(1, "com.microsoft:message-lock-lost")
	requireCode(t, receiver.CompleteMessage(ctxT(t), msg, nil), azservicebus.CodeLockLost)

	// The emulator kept the lock: it can still be renewed, and the message
	// is neither completed nor back in the queue.
	q, _ := em.Broker().Queue("queue")
	assert.Equal(t, 1, q.Stats().Locked)
	require.NoError(t, receiver.RenewMessageLock(ctxT(t), msg, nil))

	// Settlements are back to normal for the next message.
	sendText(t, newSender(t, client, "queue"), "next")
	next := receiveOne(t, receiver)
	require.NoError(t, receiver.CompleteMessage(ctxT(t), next, nil))
}

func TestSDKExpireLocks(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sendText(t, newSender(t, client, "queue"), "x")
	receiver := newReceiver(t, client, "queue", nil)
	first := receiveOne(t, receiver)

	em.ExpireLocks()
	requireCode(t, receiver.CompleteMessage(ctxT(t), first, nil), azservicebus.CodeLockLost)
	second := receiveOne(t, receiver)
	assert.Equal(t, uint32(2), second.DeliveryCount)
	require.NoError(t, receiver.CompleteMessage(ctxT(t), second, nil))
}

func TestSDKDetachLinksRecovers(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sender := newSender(t, client, "queue")
	receiver := newReceiver(t, client, "queue", nil)
	sendText(t, sender, "one")
	msg := receiveOne(t, receiver)

	assert.Equal(t, 2, em.DetachLinks("queue"), "the sender and the receiver link")

	// The message received on the detached link settles through the
	// management link by lock token.
	require.NoError(t, receiver.CompleteMessage(ctxT(t), msg, nil))
	// New links are created transparently.
	sendText(t, sender, "two")
	again := receiveAfterRecovery(t, receiver)
	assert.Equal(t, "two", string(again.Body))
	require.NoError(t, receiver.CompleteMessage(ctxT(t), again, nil))
}

func TestSDKSettleThroughManagementAfterDetach(t *testing.T) {
	tests := []struct {
		name   string
		settle func(*azservicebus.Receiver, *azservicebus.ReceivedMessage) error
		check  func(t *testing.T, em *Emulator, client *azservicebus.Client, r *azservicebus.Receiver)
	}{
		{
			name: "abandon",
			settle: func(r *azservicebus.Receiver, m *azservicebus.ReceivedMessage) error {
				return r.AbandonMessage(ctxT(t), m, &azservicebus.AbandonMessageOptions{PropertiesToModify: map[string]any{"k": "v"}})
			},
			check: func(t *testing.T, _ *Emulator, _ *azservicebus.Client, r *azservicebus.Receiver) {
				again := receiveAfterRecovery(t, r)
				assert.Equal(t, uint32(2), again.DeliveryCount)
				assert.Equal(t, "v", again.ApplicationProperties["k"])
				require.NoError(t, r.CompleteMessage(ctxT(t), again, nil))
			},
		},
		{
			name: "dead-letter",
			settle: func(r *azservicebus.Receiver, m *azservicebus.ReceivedMessage) error {
				reason, desc := "Why", "Because"
				return r.DeadLetterMessage(ctxT(t), m, &azservicebus.DeadLetterOptions{Reason: &reason, ErrorDescription: &desc})
			},
			check: func(t *testing.T, _ *Emulator, client *azservicebus.Client, _ *azservicebus.Receiver) {
				dlq := newReceiver(t, client, "queue", &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
				dead := receiveOne(t, dlq)
				require.NotNil(t, dead.DeadLetterReason)
				assert.Equal(t, "Why", *dead.DeadLetterReason)
				require.NotNil(t, dead.DeadLetterErrorDescription)
				assert.Equal(t, "Because", *dead.DeadLetterErrorDescription)
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			em := startEmulator(t, Config{})
			client := newClient(t, em)
			sendText(t, newSender(t, client, "queue"), tc.name)
			receiver := newReceiver(t, client, "queue", nil)
			msg := receiveOne(t, receiver)
			require.Equal(t, 2, em.DetachLinks("queue"), "sender and receiver")
			require.NoError(t, tc.settle(receiver, msg))
			tc.check(t, em, client, receiver)
		})
	}
}

func TestSDKRefuseConnectionsFailsCallsUntilOver(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	receiver := newReceiver(t, client, "queue", nil)
	sendText(t, newSender(t, client, "queue"), "warm-up")
	msgs, err := receiver.ReceiveMessages(ctxT(t), 1, nil)
	require.NoError(t, err)
	require.NoError(t, receiver.CompleteMessage(ctxT(t), msgs[0], nil))

	em.RefuseConnections(time.Hour)
	em.DropConnections()
	// The SDK's recovery cannot reconnect: after its retries the call fails with a connection error.
	var sbErr *azservicebus.Error
	for i := 0; ; i++ {
		_, err = receiver.ReceiveMessages(ctxT(t), 1, nil)
		if err != nil || i == 5 {
			break
		}
	}
	require.ErrorAs(t, err, &sbErr)
	assert.Equal(t, azservicebus.CodeConnectionLost, sbErr.Code)

	em.RefuseConnections(0)
	fresh := newClient(t, em)
	sendText(t, newSender(t, fresh, "queue"), "after")
	msgs, err = newReceiver(t, fresh, "queue", nil).ReceiveMessages(ctxT(t), 1, nil)
	require.NoError(t, err)
	assert.Equal(t, "after", string(msgs[0].Body))
}

func TestSDKRejectNextManagementFailsSchedule(t *testing.T) {
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sender := newSender(t, client, "queue")
	// More rejections than the client's retries, so the call fails.
	em.RejectNextManagement(100, "com.microsoft:schedule-message", 503)
	_, err := sender.ScheduleMessages(ctxT(t), []*azservicebus.Message{{Body: []byte("x")}}, time.Now().Add(time.Minute), nil)
	require.Error(t, err)
	q, _ := em.Broker().Queue("queue")
	assert.Zero(t, q.Stats().Scheduled, "nothing was scheduled")
	// Other operations are not affected, and cancelling the rejections makes scheduling work again.
	_, err = newReceiver(t, client, "queue", nil).PeekMessages(ctxT(t), 1, nil)
	require.NoError(t, err)
	em.RejectNextManagement(0, "", 0)
	seqs, err := sender.ScheduleMessages(ctxT(t), []*azservicebus.Message{{Body: []byte("x")}}, time.Now().Add(time.Minute), nil)
	require.NoError(t, err)
	assert.Len(t, seqs, 1)
}

func TestSDKKeepLocksOnDisconnect(t *testing.T) {
	em := startEmulator(t, Config{KeepLocksOnDisconnect: true, Queues: []broker.QueueConfig{{Name: "queue", LockDuration: 2 * time.Second}}})
	client := newClient(t, em)
	receiver := newReceiver(t, client, "queue", nil)
	sendText(t, newSender(t, client, "queue"), "held")
	msgs, err := receiver.ReceiveMessages(ctxT(t), 1, nil)
	require.NoError(t, err)
	held := msgs[0]

	em.DropConnections()
	// The lock survives the drop: renewing it through the recovered management link works, and the
	// message is not handed to anyone else meanwhile.
	require.NoError(t, receiver.RenewMessageLock(ctxT(t), held, nil))
	q, _ := em.Broker().Queue("queue")
	assert.Equal(t, 1, q.Stats().Locked)
	assert.Zero(t, q.Stats().Active)

	// Once it expires, the message comes back with the delivery counted.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	again, err := receiver.ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	require.Len(t, again, 1)
	assert.Equal(t, "held", string(again[0].Body))
	assert.Equal(t, uint32(2), again[0].DeliveryCount)
	require.NoError(t, receiver.CompleteMessage(ctxT(t), again[0], nil))
}

// TestSDKSettleFromAnotherConnectionAfterADrop: Service Bus keeps a
// message's lock when the connection that received it closes, so a
// receiver on a new connection can settle it by lock token through
// $management, which the SDK falls back to (azservicebus v1.11.0 live test
// TestMessageSettlementUsingOnlyBackupSettlement). KeepLocksOnDisconnect
// gives that; without it the lock goes with the connection and the
// settlement reports the lock lost.
func TestSDKSettleFromAnotherConnectionAfterADrop(t *testing.T) {
	tests := []struct {
		name      string
		keepLocks bool
		settle    func(*azservicebus.Receiver, *azservicebus.ReceivedMessage) error
	}{
		{"complete", true, func(r *azservicebus.Receiver, m *azservicebus.ReceivedMessage) error {
			return r.CompleteMessage(ctxT(t), m, nil)
		}},
		{"abandon", true, func(r *azservicebus.Receiver, m *azservicebus.ReceivedMessage) error {
			return r.AbandonMessage(ctxT(t), m, nil)
		}},
		{"dead-letter", true, func(r *azservicebus.Receiver, m *azservicebus.ReceivedMessage) error {
			return r.DeadLetterMessage(ctxT(t), m, nil)
		}},
		{"complete, locks released on disconnect", false, func(r *azservicebus.Receiver, m *azservicebus.ReceivedMessage) error {
			return r.CompleteMessage(ctxT(t), m, nil)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			em := startEmulator(t, Config{KeepLocksOnDisconnect: tc.keepLocks})
			sendText(t, newSender(t, newClient(t, em), "queue"), "settle me elsewhere")
			oldClient := newClient(t, em)
			msg := receiveOne(t, newReceiver(t, oldClient, "queue", nil))
			require.NoError(t, oldClient.Close(ctxT(t)))

			err := tc.settle(newReceiver(t, newClient(t, em), "queue", nil), msg)
			q, _ := em.Broker().Queue("queue")
			if !tc.keepLocks {
				requireCode(t, err, azservicebus.CodeLockLost)
				assert.Equal(t, 1, q.Stats().Active, "the message went back when its connection closed")
				return
			}
			require.NoError(t, err)
			assert.Zero(t, q.Stats().Locked, "settled by lock token from the new connection")
		})
	}
}
