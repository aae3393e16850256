package inspect

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// The session fixtures are built by hand through the SDK, the way retry.SessionConsumer's durable
// holds leave a session (sessionstate.go): the failed message deferred with sbretry-held-until, the
// later ones deferred behind it, the record in the session state, a wake-up scheduled into the session.

// sessionQueue is the session-enabled queue of the session tests.
const sessionQueue = "jobs"

// sessionHarness is an emulator with the session-enabled queue [sessionQueue] and a client on it.
type sessionHarness struct {
	em     *sbemu.Emulator
	client *azservicebus.Client
}

func newSessionHarness(tb testing.TB) *sessionHarness {
	tb.Helper()
	em := sbemu.StartT(tb, sbemu.Config{Queues: []broker.QueueConfig{{Name: sessionQueue, RequiresSession: true, DuplicateDetectionWindow: 10 * time.Minute}}})
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), &azservicebus.ClientOptions{RetryOptions: sbtest.FastRetries})
	require.NoError(tb, err)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), sbtest.Timeout)
		defer cancel()
		_ = client.Close(ctx)
	})
	return &sessionHarness{em: em, client: client}
}

func (h *sessionHarness) inspector(tb testing.TB, opts *Options) *Inspector {
	tb.Helper()
	in, err := New(h.client, sessionQueue, opts)
	require.NoError(tb, err)
	return in
}

func (h *sessionHarness) stats(tb testing.TB) broker.Stats {
	tb.Helper()
	q, ok := h.em.Broker().Queue(sessionQueue)
	require.True(tb, ok)
	return q.Stats()
}

// send sends one message with id into session sid.
func (h *sessionHarness) send(tb testing.TB, sid string, ids ...string) {
	tb.Helper()
	ctx := sbtest.Context(tb)
	s, err := h.client.NewSender(sessionQueue, nil)
	require.NoError(tb, err)
	defer func() { _ = s.Close(ctx) }()
	for _, id := range ids {
		m := sbtest.Message(id)
		m.SessionID = &sid
		require.NoError(tb, s.SendMessage(ctx, m, nil))
	}
}

// accept locks session sid; the caller closes it.
func (h *sessionHarness) accept(tb testing.TB, sid string) *azservicebus.SessionReceiver {
	tb.Helper()
	r, err := h.client.AcceptSessionForQueue(sbtest.Context(tb), sessionQueue, sid, nil)
	require.NoError(tb, err)
	return r
}

// heldFixture is a session held by hand.
type heldFixture struct {
	sid       string
	held      int64 // the held (or dead-lettered) message's sequence number
	followers []int64
	due       time.Time
	wakeID    string
	wakeSeq   int64 // the scheduled wake-up's sequence number; 0 for none
	state     retry.SessionState
}

// holdSession sends ids[0] and the followers ids[1:] into session sid and holds the session as a
// durable hold does: ids[0] deferred until due at attempt 3 (or, with deadLetter set, dead-lettered
// with that reason and the session blocked), the others deferred behind it, the record written, and,
// for a retry, a wake-up scheduled for due.
func (h *sessionHarness) holdSession(tb testing.TB, sid, deadLetter string, ids ...string) heldFixture {
	tb.Helper()
	ctx := sbtest.Context(tb)
	h.send(tb, sid, ids...)
	r := h.accept(tb, sid)
	defer func() { _ = r.Close(ctx) }()
	msgs, err := r.ReceiveMessages(ctx, len(ids), nil)
	require.NoError(tb, err)
	require.Len(tb, msgs, len(ids))
	f := heldFixture{sid: sid, held: *msgs[0].SequenceNumber, due: time.Now().Add(time.Hour).Truncate(time.Millisecond).UTC()}
	first := time.Now().Add(-time.Minute).Truncate(time.Millisecond).UTC()
	hold := &retry.SessionHold{SequenceNumber: f.held, MessageID: ids[0], Attempt: 3, FirstFailure: first, LastError: "downstream unavailable"}
	if deadLetter != "" {
		require.NoError(tb, r.DeadLetterMessage(ctx, msgs[0], &azservicebus.DeadLetterOptions{Reason: &deadLetter}))
		hold.DeadLetterReason, hold.DeadLetteredAt = deadLetter, time.Now().Truncate(time.Millisecond).UTC()
	} else {
		require.NoError(tb, r.DeferMessage(ctx, msgs[0], &azservicebus.DeferMessageOptions{PropertiesToModify: map[string]any{
			retry.PropHeldUntil: f.due, retry.PropAttempt: int64(3), retry.PropLastError: "downstream unavailable",
		}}))
		f.wakeID = "sbretry-wake-" + sid
		hold.WakeAt, hold.WakeID = f.due, f.wakeID
	}
	for _, m := range msgs[1:] {
		require.NoError(tb, r.DeferMessage(ctx, m, &azservicebus.DeferMessageOptions{PropertiesToModify: map[string]any{retry.PropHeldBehind: f.held}}))
		f.followers = append(f.followers, *m.SequenceNumber)
	}
	f.state = retry.SessionState{Hold: hold, Followers: f.followers}
	raw, err := retry.MarshalSessionState(f.state)
	require.NoError(tb, err)
	require.NoError(tb, r.SetSessionState(ctx, raw, nil))
	if f.wakeID != "" {
		s, err := h.client.NewSender(sessionQueue, nil)
		require.NoError(tb, err)
		defer func() { _ = s.Close(ctx) }()
		id := f.wakeID
		seqs, err := s.ScheduleMessages(ctx, []*azservicebus.Message{{
			MessageID: &id, SessionID: &sid,
			ApplicationProperties: map[string]any{retry.PropControl: retry.ControlWake, retry.PropWakeSequenceNumber: f.held},
		}}, f.due, nil)
		require.NoError(tb, err)
		f.wakeSeq = seqs[0]
	}
	return f
}

// setState writes raw as the state of session sid, which gets one message so that it exists.
func (h *sessionHarness) setState(tb testing.TB, sid string, raw []byte) {
	tb.Helper()
	h.send(tb, sid, sid+"-msg")
	r := h.accept(tb, sid)
	defer func() { _ = r.Close(sbtest.Context(tb)) }()
	require.NoError(tb, r.SetSessionState(sbtest.Context(tb), raw, nil))
}

// snapshot is what a session holds: its state and its messages as a peek shows them.
type snapshot struct {
	state []byte
	msgs  []string
}

func (h *sessionHarness) snapshot(tb testing.TB, sid string) snapshot {
	tb.Helper()
	ctx := sbtest.Context(tb)
	r := h.accept(tb, sid)
	defer func() { _ = r.Close(ctx) }()
	state, err := r.GetSessionState(ctx, nil)
	require.NoError(tb, err)
	from := int64(0)
	peeked, err := r.PeekMessages(ctx, 100, &azservicebus.PeekMessagesOptions{FromSequenceNumber: &from})
	require.NoError(tb, err)
	s := snapshot{state: state}
	for _, m := range peeked {
		// fmt prints maps sorted by key.
		s.msgs = append(s.msgs, fmt.Sprintf("%d %s state %d %v", *m.SequenceNumber, m.MessageID, m.State, m.ApplicationProperties))
	}
	return s
}
