package sbemu

import (
	"context"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The session lock is the umbrella of the message locks taken under it
// (broker/session.go has the sources): these tests drive it through the SDK
// on a queue and on a subscription.

// fakeClockNow is a fake clock set to the present, to the millisecond of an
// AMQP timestamp, since the SDK reads the times the emulator stamps.
func fakeClockNow() Clock { return newFakeClock(time.Now().Truncate(time.Millisecond)) }

// TestSDKSessionLockRenewalKeepsMessageLocks: a message received in a
// session stays settleable for as long as the session lock is renewed,
// well past LockDuration, with no renewal of its own (the SDKs have none
// for session receivers); its LockedUntil is the session's. Without
// renewal, settling it after the session lock ran out is lock-lost.
func TestSDKSessionLockRenewalKeepsMessageLocks(t *testing.T) {
	forEachSessionEntity(t, fakeClockNow, func(t *testing.T, em *Emulator, ent sessionEntity) {
		fake := em.cfg.Clock.(*fakeClock)
		client := newClient(t, em)
		sender := newSender(t, client, ent.sendTo)
		ent.send(t, sender, "s", "kept", "")
		ent.send(t, sender, "s", "lost", "")

		r := ent.mustAccept(t, client, to.Ptr("s"))
		kept := receiveSession(t, r, 1)[0]
		require.NotNil(t, kept.LockedUntil)
		assert.True(t, kept.LockedUntil.Equal(r.LockedUntil()), "message lock %v, session lock %v", *kept.LockedUntil, r.LockedUntil())
		for range 4 { // 80 s against a 30 s lock
			fake.Advance(20 * time.Second)
			require.NoError(t, r.RenewSessionLock(ctxT(t), nil))
		}
		require.NoError(t, r.CompleteMessage(ctxT(t), kept, nil))

		lost := receiveSession(t, r, 1)[0]
		fake.Advance(31 * time.Second)
		// The broker's wake-up ends the lock; settle once the link is gone,
		// as on Service Bus, where the link closes when the lock is lost.
		waitFor(t, func() bool { return em.sessionReceiversActive() == 0 })
		requireSettleFails(t, func(ctx context.Context) error { return r.CompleteMessage(ctx, lost, nil) })
	})
}

// requireSettleFails requires a settlement to fail within a second. The
// Go SDK (v1.11.0) treats a lost lock on a session receiver as worth a
// link recovery (internal/errors.go GetRecoveryKindForSession) and retries
// a settlement from 4 s whatever the client's RetryOptions say, so through
// it a settlement whose lock is gone ends in CodeLockLost only after about
// half a minute, or in com.microsoft:session-cannot-be-locked when the
// recovery finds the session taken; the first answer comes at once.
func requireSettleFails(t *testing.T, settle func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	require.Error(t, settle(ctx))
}

// TestSDKSessionLockExpiryReleasesTheSession: once a session lock runs out
// another receiver accepts the session and gets its unsettled messages
// first, in order, the delivery counted ("Session is accepted, but the
// session lock expires (due to timeout)": the delivery count is
// incremented, message-sessions.md); the first receiver can no longer
// settle them.
func TestSDKSessionLockExpiryReleasesTheSession(t *testing.T) {
	forEachSessionEntity(t, fakeClockNow, func(t *testing.T, em *Emulator, ent sessionEntity) {
		fake := em.cfg.Clock.(*fakeClock)
		client := newClient(t, em)
		sender := newSender(t, client, ent.sendTo)
		for _, b := range []string{"1", "2", "3"} {
			ent.send(t, sender, "s", b, "")
		}
		first := ent.mustAccept(t, client, to.Ptr("s"))
		held := receiveSession(t, first, 2)

		fake.Advance(31 * time.Second)
		waitFor(t, func() bool { return em.sessionReceiversActive() == 0 }) // first's link detached
		second := ent.mustAccept(t, newClient(t, em), to.Ptr("s"))
		got := receiveSession(t, second, 3)
		assert.Equal(t, []string{"1", "2", "3"}, bodies(got))
		assert.Equal(t, []uint32{2, 2, 1}, deliveryCounts(got))
		requireSettleFails(t, func(ctx context.Context) error { return first.CompleteMessage(ctx, held[0], nil) })
		for _, m := range got {
			require.NoError(t, second.CompleteMessage(ctxT(t), m, nil))
		}
	})
}

// TestSDKSessionReceiverGoneWithoutSettling: a session receiver closed, or
// whose connection dropped (a crashed consumer), with messages received
// and not settled gives the session up at once; its next receiver gets
// those messages first, in order, their delivery not counted ("Session is
// accepted, the messages within the session aren't completed (even if they
// are locked), and the session is closed": not incremented,
// message-sessions.md).
func TestSDKSessionReceiverGoneWithoutSettling(t *testing.T) {
	tests := []struct {
		name string
		gone func(t *testing.T, em *Emulator, r *azservicebus.SessionReceiver)
	}{
		{"closed", func(t *testing.T, _ *Emulator, r *azservicebus.SessionReceiver) { require.NoError(t, r.Close(ctxT(t))) }},
		{"connection dropped", func(_ *testing.T, em *Emulator, _ *azservicebus.SessionReceiver) { em.DropConnections() }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			forEachSessionEntity(t, nil, func(t *testing.T, em *Emulator, ent sessionEntity) {
				client := newClient(t, em)
				sender := newSender(t, client, ent.sendTo)
				for _, b := range []string{"1", "2", "3"} {
					ent.send(t, sender, "s", b, "")
				}
				gone := ent.mustAccept(t, client, to.Ptr("s"))
				assert.Equal(t, []string{"1", "2"}, bodies(receiveSession(t, gone, 2)))
				tc.gone(t, em, gone)

				// The next available session, so the accept waits for the
				// release rather than racing the connection's teardown.
				next := ent.mustAccept(t, newClient(t, em), nil)
				assert.Equal(t, "s", next.SessionID())
				got := receiveSession(t, next, 3)
				assert.Equal(t, []string{"1", "2", "3"}, bodies(got))
				assert.Equal(t, []uint32{1, 1, 1}, deliveryCounts(got))
				for _, m := range got {
					require.NoError(t, next.CompleteMessage(ctxT(t), m, nil))
				}
			})
		})
	}
}

// TestSDKAcceptNextSessionSkipsUnavailableSessions: the next available
// session is one nobody holds that has a message to receive now; sessions
// held by another receiver, with only a state, only a deferred message or
// only a message scheduled for later are passed over. (For deferred
// messages on Service Bus: "AcceptNextSessionAsync() never goes through
// the deferred messages, but rather throws ServiceTimeout exception as
// sessions do not exist", Azure/azure-sdk-for-net#30252, answered there
// with "use the AcceptSessionAsync method and pass in the sessionId".)
func TestSDKAcceptNextSessionSkipsUnavailableSessions(t *testing.T) {
	forEachSessionEntity(t, nil, func(t *testing.T, em *Emulator, ent sessionEntity) {
		client := newClient(t, em)
		sender := newSender(t, client, ent.sendTo)
		ent.send(t, sender, "held", "h", "")
		ent.mustAccept(t, client, to.Ptr("held"))

		state := ent.mustAccept(t, client, to.Ptr("state-only"))
		require.NoError(t, state.SetSessionState(ctxT(t), []byte("x"), nil))
		require.NoError(t, state.Close(ctxT(t)))

		ent.send(t, sender, "deferred-only", "d", "")
		deferred := ent.mustAccept(t, client, to.Ptr("deferred-only"))
		require.NoError(t, deferred.DeferMessage(ctxT(t), receiveSession(t, deferred, 1)[0], nil))
		require.NoError(t, deferred.Close(ctxT(t)))

		_, err := sender.ScheduleMessages(ctxT(t), []*azservicebus.Message{{Body: []byte("s"), SessionID: to.Ptr("scheduled-only")}},
			time.Now().Add(time.Hour), nil)
		require.NoError(t, err)

		for _, want := range []string{"ready", "late"} {
			ent.send(t, sender, want, want, "")
			r := ent.mustAccept(t, client, nil)
			assert.Equal(t, want, r.SessionID())
			m := receiveSession(t, r, 1)[0]
			require.NoError(t, r.CompleteMessage(ctxT(t), m, nil))
			require.NoError(t, r.Close(ctxT(t)))
		}
	})
}

// deliveryCounts lists the messages' delivery counts.
func deliveryCounts(msgs []*azservicebus.ReceivedMessage) []uint32 {
	out := make([]uint32, len(msgs))
	for i, m := range msgs {
		out[i] = m.DeliveryCount
	}
	return out
}
