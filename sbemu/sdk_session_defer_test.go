package sbemu

import (
	"testing"

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
