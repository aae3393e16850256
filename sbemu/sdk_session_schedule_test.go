package sbemu

import (
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSDKScheduledMessageJoinsItsSession: a message scheduled with a
// SessionID becomes receivable at its time and only in its session, behind
// what the session already held, and gets a new sequence number then; a
// cancelled one never arrives. On a subscription the topic holds it until
// it is due. (A receiver parked on the session across the hour would lose
// its 30 s session lock; holding a session that long needs renewals.)
func TestSDKScheduledMessageJoinsItsSession(t *testing.T) {
	forEachSessionEntity(t, fakeClockNow, func(t *testing.T, em *Emulator, ent sessionEntity) {
		fake := em.cfg.Clock.(*fakeClock)
		start := fake.Now()
		client := newClient(t, em)
		sender := newSender(t, client, ent.sendTo)

		at := start.Add(time.Hour)
		seqs, err := sender.ScheduleMessages(ctxT(t), []*azservicebus.Message{
			{Body: []byte("later"), SessionID: to.Ptr("s")},
			{Body: []byte("cancelled"), SessionID: to.Ptr("s")},
			{Body: []byte("alone"), SessionID: to.Ptr("u")},
		}, at, nil)
		require.NoError(t, err)
		require.Len(t, seqs, 3)
		require.NoError(t, sender.CancelScheduledMessages(ctxT(t), seqs[1:2], nil))
		ent.send(t, sender, "s", "now", "")

		s := ent.mustAccept(t, client, to.Ptr("s"))
		now := receiveSession(t, s, 1)[0]
		assert.Equal(t, "now", string(now.Body), "the scheduled messages wait")
		require.NoError(t, s.CompleteMessage(ctxT(t), now, nil))
		require.NoError(t, s.Close(ctxT(t)))

		fake.Advance(59 * time.Minute)
		assert.Equal(t, 2, scheduledCount(em, ent), "not due yet")
		fake.Advance(time.Minute)
		assert.Zero(t, scheduledCount(em, ent), "due")

		// Each joins its own session; they activate in schedule order, so
		// "s" is the next available session, then "u".
		for _, want := range []struct{ session, body string }{{"s", "later"}, {"u", "alone"}} {
			r := ent.mustAccept(t, client, nil)
			assert.Equal(t, want.session, r.SessionID())
			got := receiveSession(t, r, 1)[0]
			assert.Equal(t, want.body, string(got.Body))
			assert.Equal(t, want.session, *got.SessionID)
			require.NotNil(t, got.EnqueuedTime)
			assert.True(t, got.EnqueuedTime.Equal(at), "enqueued at the scheduled time, got %v", got.EnqueuedTime)
			require.NoError(t, r.CompleteMessage(ctxT(t), got, nil))
			peeked, err := r.PeekMessages(ctxT(t), 10, &azservicebus.PeekMessagesOptions{FromSequenceNumber: to.Ptr(int64(0))})
			require.NoError(t, err)
			assert.Empty(t, peeked, "nothing else in the session: the cancelled message is gone")
		}

		assert.Zero(t, ent.broker(em).Stats())
	})
}

// scheduledCount counts the messages scheduled for ent: on a queue, its
// own; for a subscription, its topic's.
func scheduledCount(em *Emulator, ent sessionEntity) int {
	q, _ := em.Broker().Queue(ent.sendTo)
	return len(q.ScheduledMessages())
}

// TestSDKDuplicateDetectionWithSessions: duplicate detection on a session
// entity is keyed on MessageId alone, whatever the session: a second send
// of a MessageId within the window is reported as a success and dropped,
// in its own session and in another one ("duplicate messages having same
// MessageId and sent to topic within duration of
// DuplicateDetectionHistoryTimeWindow will be discarded",
// TopicProperties.RequiresDuplicateDetection in the .NET SDK reference; on
// a partitioned entity the key is MessageId and PartitionKey, which a
// SessionId overrides, duplicate-detection.md, but the emulator does not
// partition). A retry copy sent under a new MessageId into the same
// session arrives behind the session's earlier messages.
func TestSDKDuplicateDetectionWithSessions(t *testing.T) {
	forEachSessionEntity(t, nil, func(t *testing.T, em *Emulator, ent sessionEntity) {
		client := newClient(t, em)
		sender := newSender(t, client, ent.sendTo)
		ent.send(t, sender, "a", "first", "m-1")
		ent.send(t, sender, "a", "duplicate, same session", "m-1")
		ent.send(t, sender, "b", "duplicate, other session", "m-1")
		_, err := sender.ScheduleMessages(ctxT(t), []*azservicebus.Message{
			{Body: []byte("duplicate, scheduled"), SessionID: to.Ptr("a"), MessageID: to.Ptr("m-1")},
		}, time.Now(), nil)
		require.NoError(t, err)
		ent.send(t, sender, "b", "second", "m-2")
		ent.send(t, sender, "a", "retry copy", "m-1/retry-1")

		a := ent.mustAccept(t, client, to.Ptr("a"))
		got := receiveSession(t, a, 2)
		assert.Equal(t, []string{"first", "retry copy"}, bodies(got))
		b := ent.mustAccept(t, client, to.Ptr("b"))
		got = append(got, receiveSession(t, b, 1)...)
		assert.Equal(t, "second", string(got[2].Body))
		for i, m := range got {
			r := a
			if i == 2 {
				r = b
			}
			require.NoError(t, r.CompleteMessage(ctxT(t), m, nil))
		}
		assert.Zero(t, ent.broker(em).Stats(), "the duplicates were dropped")
	})
}
