package sbemu

import (
	"context"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

// sessionEntity is one session-aware entity as the SDK reaches it: a queue,
// or a topic and its RequiresSession subscription. The session tests run
// on both, since a subscription is a queue of its own behind a topic that
// carries the duplicate detection and the scheduled messages.
type sessionEntity struct {
	name string
	// sendTo is the entity messages are sent and scheduled to.
	sendTo string
	// accept accepts session id (nil: the next available one).
	accept func(ctx context.Context, client *azservicebus.Client, id *string) (*azservicebus.SessionReceiver, error)
	// broker is the entity's broker queue, for its counts.
	broker func(em *Emulator) *broker.Queue
}

// sessionEntities are the queue "sq" and the subscription "st/sub" of
// sessionEntityConfig.
var sessionEntities = []sessionEntity{
	{
		name:   "queue",
		sendTo: "sq",
		accept: func(ctx context.Context, client *azservicebus.Client, id *string) (*azservicebus.SessionReceiver, error) {
			if id == nil {
				return client.AcceptNextSessionForQueue(ctx, "sq", nil)
			}
			return client.AcceptSessionForQueue(ctx, "sq", *id, nil)
		},
		broker: func(em *Emulator) *broker.Queue { q, _ := em.Broker().Queue("sq"); return q },
	},
	{
		name:   "subscription",
		sendTo: "st",
		accept: func(ctx context.Context, client *azservicebus.Client, id *string) (*azservicebus.SessionReceiver, error) {
			if id == nil {
				return client.AcceptNextSessionForSubscription(ctx, "st", "sub", nil)
			}
			return client.AcceptSessionForSubscription(ctx, "st", "sub", *id, nil)
		},
		broker: func(em *Emulator) *broker.Queue { q, _ := em.Broker().Subscription("st", "sub"); return q },
	},
}

// sessionEntityConfig is a session queue and a topic with a session
// subscription, both with a 30 s lock and duplicate detection, on clock
// (nil: the real one).
func sessionEntityConfig(clock Clock) Config {
	return Config{
		Clock: clock,
		Queues: []broker.QueueConfig{{
			Name: "sq", RequiresSession: true, LockDuration: 30 * time.Second, DuplicateDetectionWindow: 10 * time.Minute,
		}},
		Topics: []broker.TopicConfig{{
			Name: "st", DuplicateDetectionWindow: 10 * time.Minute,
			Subscriptions: []broker.SubscriptionConfig{{Name: "sub", RequiresSession: true, LockDuration: 30 * time.Second}},
		}},
	}
}

// forEachSessionEntity runs test as a subtest on each of sessionEntities,
// each with an emulator of its own.
func forEachSessionEntity(t *testing.T, clock func() Clock, test func(t *testing.T, em *Emulator, ent sessionEntity)) {
	for _, ent := range sessionEntities {
		t.Run(ent.name, func(t *testing.T) {
			var c Clock
			if clock != nil {
				c = clock()
			}
			test(t, startEmulator(t, sessionEntityConfig(c)), ent)
		})
	}
}

// mustAccept accepts session id (nil: the next available) and closes the
// receiver at cleanup.
func (ent sessionEntity) mustAccept(t *testing.T, client *azservicebus.Client, id *string) *azservicebus.SessionReceiver {
	t.Helper()
	r, err := ent.accept(ctxT(t), client, id)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return r
}

// send sends one message with body to session id, with MessageId msgID
// when it is not empty.
func (ent sessionEntity) send(t *testing.T, s *azservicebus.Sender, id, body, msgID string) {
	t.Helper()
	m := &azservicebus.Message{Body: []byte(body), SessionID: to.Ptr(id)}
	if msgID != "" {
		m.MessageID = &msgID
	}
	require.NoError(t, s.SendMessage(ctxT(t), m, nil))
}

// receiveSession receives n messages from r, in arrival order, and
// returns them; it settles nothing.
func receiveSession(t *testing.T, r *azservicebus.SessionReceiver, n int) []*azservicebus.ReceivedMessage {
	t.Helper()
	var out []*azservicebus.ReceivedMessage
	for len(out) < n {
		msgs, err := r.ReceiveMessages(ctxT(t), n-len(out), nil)
		require.NoError(t, err)
		out = append(out, msgs...)
	}
	require.Len(t, out, n)
	return out
}

// bodies lists the messages' bodies as strings.
func bodies(msgs []*azservicebus.ReceivedMessage) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = string(m.Body)
	}
	return out
}

// TestSDKSessionEntityBasics: on a queue and on a subscription, a named
// session and the next available one are accepted, deliver their own
// messages in send order, keep a state and renew their lock.
func TestSDKSessionEntityBasics(t *testing.T) {
	forEachSessionEntity(t, nil, func(t *testing.T, em *Emulator, ent sessionEntity) {
		client := newClient(t, em)
		sender := newSender(t, client, ent.sendTo)
		for _, b := range []string{"a1", "b1", "a2", "b2", "a3"} {
			ent.send(t, sender, b[:1], b, "")
		}

		a := ent.mustAccept(t, client, to.Ptr("a"))
		got := receiveSession(t, a, 3)
		assert.Equal(t, []string{"a1", "a2", "a3"}, bodies(got), "only its session, in send order")
		for _, m := range got {
			assert.Equal(t, "a", *m.SessionID)
			require.NoError(t, a.CompleteMessage(ctxT(t), m, nil))
		}
		require.NoError(t, a.SetSessionState(ctxT(t), []byte("step 3"), nil))
		state, err := a.GetSessionState(ctxT(t), nil)
		require.NoError(t, err)
		assert.Equal(t, "step 3", string(state))
		before := a.LockedUntil()
		require.NoError(t, a.RenewSessionLock(ctxT(t), nil))
		assert.False(t, a.LockedUntil().Before(before))

		next := ent.mustAccept(t, client, nil)
		assert.Equal(t, "b", next.SessionID(), "a is held; b has messages")
		got = receiveSession(t, next, 2)
		assert.Equal(t, []string{"b1", "b2"}, bodies(got))
		for _, m := range got {
			require.NoError(t, next.CompleteMessage(ctxT(t), m, nil))
		}

		// The state outlives the receiver and is the next holder's.
		require.NoError(t, a.Close(ctxT(t)))
		again := ent.mustAccept(t, newClient(t, em), to.Ptr("a"))
		state, err = again.GetSessionState(ctxT(t), nil)
		require.NoError(t, err)
		assert.Equal(t, "step 3", string(state))
		assert.Equal(t, broker.Stats{}, ent.broker(em).Stats())
	})
}

// TestSDKSessionPeekIsTheSessions: a session receiver peeks only its own
// session's messages, as the .NET SDK's live test
// SessionReceiverLiveTests.RoundRobinSessions expects of Service Bus.
func TestSDKSessionPeekIsTheSessions(t *testing.T) {
	forEachSessionEntity(t, nil, func(t *testing.T, em *Emulator, ent sessionEntity) {
		client := newClient(t, em)
		sender := newSender(t, client, ent.sendTo)
		for _, b := range []string{"a1", "b1", "a2"} {
			ent.send(t, sender, b[:1], b, "")
		}
		b := ent.mustAccept(t, client, to.Ptr("b"))
		peeked, err := b.PeekMessages(ctxT(t), 10, &azservicebus.PeekMessagesOptions{FromSequenceNumber: to.Ptr(int64(1))})
		require.NoError(t, err)
		assert.Equal(t, []string{"b1"}, bodies(peeked))
	})
}
