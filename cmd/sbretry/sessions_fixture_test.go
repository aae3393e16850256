package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// The held sessions of these tests are built by hand through the SDK, as retry.SessionConsumer's
// durable holds leave them (sessionstate.go); package inspect's tests build the same ones.

// sessionQueue is the session-enabled queue of the sessions commands' tests.
const sessionQueue = "jobs"

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

// cli runs the command on the session queue; stdin feeds prompts.
func (h *sessionHarness) cli(tb testing.TB, stdin string, args ...string) (code int, stdout, stderr string) {
	tb.Helper()
	var out, errOut bytes.Buffer
	a := &app{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }, now: time.Now}
	full := append([]string{"--connection-string", h.em.ConnectionString(), "--queue", sessionQueue}, args...)
	code = a.run(sbtest.Context(tb), full)
	tb.Logf("sbretry %s -> %d\nstdout:\n%sstderr:\n%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return code, out.String(), errOut.String()
}

func (h *sessionHarness) stats(tb testing.TB) broker.Stats {
	tb.Helper()
	q, ok := h.em.Broker().Queue(sessionQueue)
	require.True(tb, ok)
	return q.Stats()
}

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

func (h *sessionHarness) accept(tb testing.TB, sid string) *azservicebus.SessionReceiver {
	tb.Helper()
	r, err := h.client.AcceptSessionForQueue(sbtest.Context(tb), sessionQueue, sid, nil)
	require.NoError(tb, err)
	return r
}

type heldFixture struct {
	held      int64
	followers []int64
	due       time.Time
	wakeID    string
	state     retry.SessionState
}

// holdSession holds session sid as a durable hold does: ids[0] deferred until due at attempt 3 (or,
// with deadLetter, dead-lettered and the session blocked), ids[1:] deferred behind it, the record
// written and, for a retry, the wake-up scheduled.
func (h *sessionHarness) holdSession(tb testing.TB, sid, deadLetter string, ids ...string) heldFixture {
	tb.Helper()
	ctx := sbtest.Context(tb)
	h.send(tb, sid, ids...)
	r := h.accept(tb, sid)
	defer func() { _ = r.Close(ctx) }()
	msgs, err := r.ReceiveMessages(ctx, len(ids), nil)
	require.NoError(tb, err)
	require.Len(tb, msgs, len(ids))
	f := heldFixture{held: *msgs[0].SequenceNumber, due: time.Now().Add(time.Hour).Truncate(time.Millisecond).UTC()}
	hold := &retry.SessionHold{SequenceNumber: f.held, MessageID: ids[0], Attempt: 3, FirstFailure: time.Now().Add(-time.Minute).Truncate(time.Millisecond).UTC(), LastError: "downstream unavailable"}
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
		_, err = s.ScheduleMessages(ctx, []*azservicebus.Message{{
			MessageID: &id, SessionID: &sid,
			ApplicationProperties: map[string]any{retry.PropControl: retry.ControlWake, retry.PropWakeSequenceNumber: f.held},
		}}, f.due, nil)
		require.NoError(tb, err)
	}
	return f
}

// setState writes raw as the state of session sid, which gets one message.
func (h *sessionHarness) setState(tb testing.TB, sid string, raw []byte) {
	tb.Helper()
	h.send(tb, sid, sid+"-msg")
	r := h.accept(tb, sid)
	defer func() { _ = r.Close(sbtest.Context(tb)) }()
	require.NoError(tb, r.SetSessionState(sbtest.Context(tb), raw, nil))
}

// sessionSnapshot is what a session holds: its state and its messages as a peek shows them.
type sessionSnapshot struct {
	state []byte
	msgs  []string
}

func (h *sessionHarness) snapshot(tb testing.TB, sid string) sessionSnapshot {
	tb.Helper()
	ctx := sbtest.Context(tb)
	r := h.accept(tb, sid)
	defer func() { _ = r.Close(ctx) }()
	state, err := r.GetSessionState(ctx, nil)
	require.NoError(tb, err)
	from := int64(0)
	peeked, err := r.PeekMessages(ctx, 100, &azservicebus.PeekMessagesOptions{FromSequenceNumber: &from})
	require.NoError(tb, err)
	s := sessionSnapshot{state: state}
	for _, m := range peeked {
		s.msgs = append(s.msgs, fmt.Sprintf("%d %s state %d %v", *m.SequenceNumber, m.MessageID, m.State, m.ApplicationProperties))
	}
	return s
}
