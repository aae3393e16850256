package sbtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
	"github.com/sbretry/retry/sessionstate"
)

// The held-session fixtures of inspect's and cmd/sbretry's tests, built by hand through the SDK the
// way retry.SessionConsumer's durable holds leave a session (sessionstate.go): the failed message
// deferred with sbretry-held-until, the later ones deferred behind it, the record in the session
// state, a wake-up scheduled into the session.

// SessionQueue is the session-enabled queue of [NewSessions].
const SessionQueue = "jobs"

// Sessions is an emulator with the session-enabled queue [SessionQueue] (duplicate detection on) and
// a client on it.
type Sessions struct {
	Em     *sbemu.Emulator
	Client *azservicebus.Client
}

// NewSessions starts the emulator and the client; both are closed at the test's cleanup.
func NewSessions(tb testing.TB) *Sessions {
	tb.Helper()
	em := sbemu.StartT(tb, sbemu.Config{Queues: []broker.QueueConfig{{Name: SessionQueue, RequiresSession: true, DuplicateDetectionWindow: 10 * time.Minute}}})
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), &azservicebus.ClientOptions{RetryOptions: FastRetries})
	require.NoError(tb, err)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), Timeout)
		defer cancel()
		_ = client.Close(ctx)
	})
	return &Sessions{Em: em, Client: client}
}

// Stats are the session queue's counters.
func (h *Sessions) Stats(tb testing.TB) broker.Stats {
	tb.Helper()
	q, ok := h.Em.Broker().Queue(SessionQueue)
	require.True(tb, ok)
	return q.Stats()
}

// Send sends one message per id into session sid.
func (h *Sessions) Send(tb testing.TB, sid string, ids ...string) {
	tb.Helper()
	ctx := Context(tb)
	s, err := h.Client.NewSender(SessionQueue, nil)
	require.NoError(tb, err)
	defer func() { _ = s.Close(ctx) }()
	for _, id := range ids {
		m := Message(id)
		m.SessionID = &sid
		require.NoError(tb, s.SendMessage(ctx, m, nil))
	}
}

// Accept locks session sid; the caller closes it.
func (h *Sessions) Accept(tb testing.TB, sid string) *azservicebus.SessionReceiver {
	tb.Helper()
	r, err := h.Client.AcceptSessionForQueue(Context(tb), SessionQueue, sid, nil)
	require.NoError(tb, err)
	return r
}

// HeldSession is a session held by [Sessions.Hold].
type HeldSession struct {
	SID       string
	Held      int64 // the held (or dead-lettered) message's sequence number
	Followers []int64
	Due       time.Time
	WakeID    string
	WakeSeq   int64 // the scheduled wake-up's sequence number; 0 for none
	State     sessionstate.State
}

// Hold sends ids[0] and the followers ids[1:] into session sid and holds the session as a durable hold
// does: ids[0] deferred until Due at attempt 3 (or, with deadLetter set, dead-lettered with that
// reason and the session blocked), the others deferred behind it, the record written, and, for a
// retry, a wake-up scheduled for Due.
func (h *Sessions) Hold(tb testing.TB, sid, deadLetter string, ids ...string) HeldSession {
	tb.Helper()
	ctx := Context(tb)
	h.Send(tb, sid, ids...)
	r := h.Accept(tb, sid)
	defer func() { _ = r.Close(ctx) }()
	msgs, err := r.ReceiveMessages(ctx, len(ids), nil)
	require.NoError(tb, err)
	require.Len(tb, msgs, len(ids))
	f := HeldSession{SID: sid, Held: *msgs[0].SequenceNumber, Due: time.Now().Add(time.Hour).Truncate(time.Millisecond).UTC()}
	first := time.Now().Add(-time.Minute).Truncate(time.Millisecond).UTC()
	hold := &sessionstate.Hold{SequenceNumber: f.Held, MessageID: ids[0], Attempt: 3, FirstFailure: first, LastError: "downstream unavailable"}
	if deadLetter != "" {
		require.NoError(tb, r.DeadLetterMessage(ctx, msgs[0], &azservicebus.DeadLetterOptions{Reason: &deadLetter}))
		hold.DeadLetterReason, hold.DeadLetteredAt = deadLetter, time.Now().Truncate(time.Millisecond).UTC()
	} else {
		require.NoError(tb, r.DeferMessage(ctx, msgs[0], &azservicebus.DeferMessageOptions{PropertiesToModify: map[string]any{
			sessionstate.PropHeldUntil: f.Due, envelope.PropAttempt: int64(3), envelope.PropLastError: "downstream unavailable",
		}}))
		f.WakeID = "sbretry-wake-" + sid
		hold.WakeAt, hold.WakeID = f.Due, f.WakeID
	}
	for _, m := range msgs[1:] {
		require.NoError(tb, r.DeferMessage(ctx, m, &azservicebus.DeferMessageOptions{PropertiesToModify: map[string]any{sessionstate.PropHeldBehind: f.Held}}))
		f.Followers = append(f.Followers, *m.SequenceNumber)
	}
	f.State = sessionstate.State{Hold: hold, Followers: f.Followers}
	raw, err := sessionstate.Marshal(f.State)
	require.NoError(tb, err)
	require.NoError(tb, r.SetSessionState(ctx, raw, nil))
	if f.WakeID != "" {
		s, err := h.Client.NewSender(SessionQueue, nil)
		require.NoError(tb, err)
		defer func() { _ = s.Close(ctx) }()
		id := f.WakeID
		seqs, err := s.ScheduleMessages(ctx, []*azservicebus.Message{{
			MessageID: &id, SessionID: &sid,
			ApplicationProperties: map[string]any{sessionstate.PropControl: sessionstate.ControlWake, sessionstate.PropWakeSequenceNumber: f.Held},
		}}, f.Due, nil)
		require.NoError(tb, err)
		f.WakeSeq = seqs[0]
	}
	return f
}

// SetState writes raw as the state of session sid, which gets one message so that it exists.
func (h *Sessions) SetState(tb testing.TB, sid string, raw []byte) {
	tb.Helper()
	h.Send(tb, sid, sid+"-msg")
	r := h.Accept(tb, sid)
	defer func() { _ = r.Close(Context(tb)) }()
	require.NoError(tb, r.SetSessionState(Context(tb), raw, nil))
}

// SessionSnapshot is what a session holds: its state and its messages as a peek shows them.
type SessionSnapshot struct {
	State []byte
	Msgs  []string
}

// Snapshot reads session sid without changing it, for a test to compare before and after.
func (h *Sessions) Snapshot(tb testing.TB, sid string) SessionSnapshot {
	tb.Helper()
	ctx := Context(tb)
	r := h.Accept(tb, sid)
	defer func() { _ = r.Close(ctx) }()
	state, err := r.GetSessionState(ctx, nil)
	require.NoError(tb, err)
	from := int64(0)
	peeked, err := r.PeekMessages(ctx, 100, &azservicebus.PeekMessagesOptions{FromSequenceNumber: &from})
	require.NoError(tb, err)
	s := SessionSnapshot{State: state}
	for _, m := range peeked {
		// fmt prints maps sorted by key.
		s.Msgs = append(s.Msgs, fmt.Sprintf("%d %s state %d %v", *m.SequenceNumber, m.MessageID, m.State, m.ApplicationProperties))
	}
	return s
}
