package sbemu

import (
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

// TestSDKSessionDeferralStaysInItsSession: a message deferred inside a
// session is received by sequence number only through a receiver holding
// that session. The SDKs only let a session receiver ask inside its own
// session (azure-servicebus 0.50 for Python, SessionReceiver.
// receive_deferred_messages: "This operation can only receive deferred
// messages from the current session"; it sends the receiver's session-id
// with the request, the Go SDK its receive link's name). What Service Bus
// answers for a number that belongs to another session is not documented;
// the emulator answers as for a number that is not a deferred message of
// the entity, 404 com.microsoft:message-not-found ("Failed to lock one or
// more specified messages. Either the message is already locked or does
// not exist", Azure/azure-service-bus#415), which the Go SDK reports as
// CodeNotFound, and the message stays deferred for its own session.
func TestSDKSessionDeferralStaysInItsSession(t *testing.T) {
	forEachSessionEntity(t, nil, func(t *testing.T, em *Emulator, ent sessionEntity) {
		client := newClient(t, em)
		sender := newSender(t, client, ent.sendTo)
		ent.send(t, sender, "a", "a1", "")
		ent.send(t, sender, "a", "a2", "")
		ent.send(t, sender, "b", "b1", "")

		a := ent.mustAccept(t, client, to.Ptr("a"))
		first := receiveSession(t, a, 1)[0]
		require.NoError(t, a.DeferMessage(ctxT(t), first, nil))
		seq := *first.SequenceNumber
		next := receiveSession(t, a, 1)[0]
		assert.Equal(t, "a2", string(next.Body), "the deferred message is not delivered again")
		require.NoError(t, a.CompleteMessage(ctxT(t), next, nil))

		peeked, err := a.PeekMessages(ctxT(t), 10, &azservicebus.PeekMessagesOptions{FromSequenceNumber: to.Ptr(int64(1))})
		require.NoError(t, err)
		require.Len(t, peeked, 1)
		assert.Equal(t, azservicebus.MessageStateDeferred, peeked[0].State)

		// Other sessions, on the same connection and on another one; the
		// empty session id is a session like any other.
		for _, other := range []*azservicebus.SessionReceiver{
			ent.mustAccept(t, client, to.Ptr("b")),
			ent.mustAccept(t, newClient(t, em), to.Ptr("")),
		} {
			_, err := other.ReceiveDeferredMessages(ctxT(t), []int64{seq}, nil)
			requireCode(t, err, azservicebus.CodeNotFound)
		}

		got, err := a.ReceiveDeferredMessages(ctxT(t), []int64{seq}, nil)
		require.NoError(t, err)
		require.Len(t, got, 1)
		assert.Equal(t, "a1", string(got[0].Body))
		assert.Equal(t, "a", *got[0].SessionID)
		assert.Equal(t, azservicebus.MessageStateDeferred, got[0].State)

		// Closed without settling: deferred still, for the session's next
		// holder, and not receivable otherwise.
		require.NoError(t, a.Close(ctxT(t)))
		a2 := ent.mustAccept(t, newClient(t, em), to.Ptr("a"))
		assert.Equal(t, broker.Stats{Active: 1, Deferred: 1}, ent.broker(em).Stats(), "b1 active, a1 deferred")
		again, err := a2.ReceiveDeferredMessages(ctxT(t), []int64{seq}, nil)
		require.NoError(t, err)
		require.Len(t, again, 1)
		require.NoError(t, a2.CompleteMessage(ctxT(t), again[0], nil))
		assert.Equal(t, broker.Stats{Active: 1}, ent.broker(em).Stats())
	})
}

// TestSDKSessionHoldWithDeferralStateAndWakeUp runs, through the SDK, the
// broker operations a durable hold of a session is built from (issue 18):
// a failed message deferred, what blocks the session written to its state,
// a wake-up scheduled into the session, the consumer gone; later messages
// of the session make it available again and are deferred in their turn;
// the wake-up, due, makes the session available once more and arrives
// behind everything sent meanwhile, since a scheduled message takes its
// sequence number when it activates; then the deferred messages are taken
// back by sequence number, in order. Nothing else offers the session in
// between: a session with only deferred and scheduled messages is not
// available.
func TestSDKSessionHoldWithDeferralStateAndWakeUp(t *testing.T) {
	forEachSessionEntity(t, fakeClockNow, func(t *testing.T, em *Emulator, ent sessionEntity) {
		fake := em.cfg.Clock.(*fakeClock)
		sender := newSender(t, newClient(t, em), ent.sendTo)
		ent.send(t, sender, "s", "m1", "")

		// The first consumer: m1 fails; hold the session and crash.
		crashed := newClient(t, em)
		a := ent.mustAccept(t, crashed, to.Ptr("s"))
		m1 := receiveSession(t, a, 1)[0]
		require.NoError(t, a.DeferMessage(ctxT(t), m1, nil))
		require.NoError(t, a.SetSessionState(ctxT(t), []byte("blocked"), nil))
		wakeAt := fake.Now().Add(time.Minute)
		_, err := sender.ScheduleMessages(ctxT(t), []*azservicebus.Message{{Body: []byte("wake-up"), SessionID: to.Ptr("s")}}, wakeAt, nil)
		require.NoError(t, err)
		em.DropConnections()

		// A follower makes the session available; it is deferred behind m1.
		ent.send(t, sender, "s", "m2", "")
		client := newClient(t, em)
		b := ent.mustAccept(t, client, nil)
		require.Equal(t, "s", b.SessionID())
		state, err := b.GetSessionState(ctxT(t), nil)
		require.NoError(t, err)
		assert.Equal(t, "blocked", string(state))
		m2 := receiveSession(t, b, 1)[0]
		assert.Equal(t, "m2", string(m2.Body), "the wake-up is not due")
		require.NoError(t, b.DeferMessage(ctxT(t), m2, nil))
		require.NoError(t, b.Close(ctxT(t)))
		assert.Equal(t, 2, ent.broker(em).Stats().Deferred)

		// At the wake-up the session is available again.
		fake.Advance(time.Minute)
		c := ent.mustAccept(t, client, nil)
		require.Equal(t, "s", c.SessionID())
		wake := receiveSession(t, c, 1)[0]
		assert.Equal(t, "wake-up", string(wake.Body))
		assert.Greater(t, *wake.SequenceNumber, *m2.SequenceNumber, "numbered when it activated, behind m2")
		for _, want := range []*azservicebus.ReceivedMessage{m1, m2} {
			got, err := c.ReceiveDeferredMessages(ctxT(t), []int64{*want.SequenceNumber}, nil)
			require.NoError(t, err)
			require.Len(t, got, 1)
			assert.Equal(t, string(want.Body), string(got[0].Body))
			require.NoError(t, c.CompleteMessage(ctxT(t), got[0], nil))
		}
		require.NoError(t, c.CompleteMessage(ctxT(t), wake, nil))
		require.NoError(t, c.SetSessionState(ctxT(t), nil, nil))
		assert.Zero(t, ent.broker(em).Stats())
	})
}
