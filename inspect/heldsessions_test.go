package inspect

import (
	"context"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
	"github.com/sbretry/retry/sessionstate"
)

func TestListHeldSessions(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	held := h.Hold(t, "s-held", "", "a1", "a2", "a3")
	dl := h.Hold(t, "s-dead", "RetryMaxAttemptsExceeded", "b1", "b2")
	h.SetState(t, "s-foreign", []byte("another application's state"))
	h.Send(t, "s-plain", "c1") // messages, no state: not held
	h.SetState(t, "s-idle", nil)
	locked := h.Hold(t, "s-locked", "", "d1")
	consumer := h.Accept(t, "s-locked") // a consumer holds it now
	defer func() { _ = consumer.Close(sbtest.Context(t)) }()

	in := h.inspector(t, nil)
	got, err := in.ListHeldSessions(sbtest.Context(t))
	require.NoError(t, err)
	assert.Equal(t, sessionQueue, got.Entity)
	assert.False(t, got.Truncated)
	assert.Equal(t, 4, got.Listed, "the sessions with a state")
	byID := map[string]HeldSession{}
	for _, s := range got.Sessions {
		assert.Equal(t, sessionQueue, s.Entity, "every row names its entity")
		byID[s.SessionID] = s
	}
	require.Len(t, byID, 4)
	assert.NotContains(t, byID, "s-plain")

	s := byID["s-held"]
	assert.False(t, s.Locked)
	require.NoError(t, s.StateErr)
	assert.Equal(t, held.State, s.State)
	require.NotNil(t, s.HeldMessage())
	assert.Equal(t, SessionMessage{SequenceNumber: held.Held, MessageID: "a1", HeldUntil: held.Due, HeldBehind: -1, Attempt: 3, LastError: "downstream unavailable"}, *s.HeldMessage())
	require.Len(t, s.Deferred, 3)
	for i, f := range held.Followers {
		assert.Equal(t, f, s.Deferred[i+1].SequenceNumber)
		assert.Equal(t, held.Held, s.Deferred[i+1].HeldBehind)
	}
	require.NotNil(t, s.NextWakeUp())
	assert.Equal(t, WakeUp{SequenceNumber: held.WakeSeq, MessageID: held.WakeID, Scheduled: true, DueTime: held.Due, ForSequenceNumber: held.Held}, *s.NextWakeUp())

	s = byID["s-dead"]
	require.NoError(t, s.StateErr)
	require.NotNil(t, s.Hold())
	assert.Equal(t, "RetryMaxAttemptsExceeded", s.Hold().DeadLetterReason)
	assert.Nil(t, s.HeldMessage(), "the dead letter is not in the session")
	assert.Nil(t, s.NextWakeUp())
	assert.Equal(t, dl.Followers, s.State.Followers)
	require.Len(t, s.Deferred, 1)

	s = byID["s-foreign"]
	assert.ErrorIs(t, s.StateErr, sessionstate.ErrForeign)
	assert.Equal(t, len("another application's state"), s.StateSize)

	s = byID["s-locked"]
	assert.True(t, s.Locked, "held by a consumer now")
	assert.ErrorIs(t, s.LockErr, ErrSessionLocked)
	assert.Nil(t, s.Hold(), "nothing of it could be read")
	_ = locked
}

func TestListHeldSessionsBounded(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	for _, sid := range []string{"s1", "s2", "s3"} {
		h.Hold(t, sid, "", sid+"-m")
	}
	got, err := h.inspector(t, &Options{MaxSessions: 2}).ListHeldSessions(sbtest.Context(t))
	require.NoError(t, err)
	assert.True(t, got.Truncated)
	assert.Equal(t, 2, got.Listed)
	assert.Len(t, got.Sessions, 2)
	_, err = New(h.Client, sessionQueue, &Options{MaxSessions: -1})
	assert.ErrorIs(t, err, ErrInvalidOptions)
}

func TestHeldSessionNotHeld(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	h.Send(t, "s-plain", "c1")
	in := h.inspector(t, nil)
	_, err := in.HeldSession(sbtest.Context(t), "s-plain")
	assert.ErrorIs(t, err, sessionstate.ErrNotHeld)
	_, err = in.HeldSession(sbtest.Context(t), "")
	assert.ErrorIs(t, err, ErrEmptySessionID)
}

func TestPreviewReleaseChangesNothing(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	f := h.Hold(t, "s1", "", "a1", "a2")
	before := h.Snapshot(t, "s1")
	stats := h.Stats(t)
	in := h.inspector(t, nil)
	now := time.Now().UTC()
	p, err := in.PreviewRelease(sbtest.Context(t), "s1", now)
	require.NoError(t, err)
	assert.Equal(t, sessionQueue, p.Entity)
	assert.Equal(t, f.State, p.Plan.Before)
	require.NotNil(t, p.Plan.After.Hold)
	assert.Equal(t, now.Truncate(time.Millisecond), p.Plan.After.Hold.WakeAt, "the retry is made due now")
	assert.Equal(t, p.PlannedAt, p.Plan.After.Hold.WakeAt)
	assert.Equal(t, f.Followers, p.Plan.After.Followers)
	assert.False(t, p.WakeSent)
	assert.False(t, p.StateWritten)
	assert.Equal(t, before, h.Snapshot(t, "s1"), "state and messages as they were")
	assert.Equal(t, stats, h.Stats(t))
}

func TestReleaseSendsWakeThenWritesState(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, deadLetter string
	}{{name: "waiting retry"}, {name: "blocked after dead-letter", deadLetter: "RetryMaxAttemptsExceeded"}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newSessionHarness(t)
			f := h.Hold(t, "s1", tc.deadLetter, "a1", "a2")
			obs := &recordingObserver{}
			in := h.inspector(t, &Options{Observer: obs})
			ctx := sbtest.Context(t)
			p, err := in.PreviewRelease(ctx, "s1", time.Now())
			require.NoError(t, err)
			n := len(obs.snapshot())
			rel, err := in.Release(ctx, p)
			require.NoError(t, err)
			assert.True(t, rel.WakeSent)
			assert.True(t, rel.StateWritten)
			assert.Equal(t, []string{OpAcceptSession, OpGetSessionState, OpSend, OpPeek, OpSetSessionState}, operations(obs.snapshot()[n:]), "the wake-up is sent, and found in the session, before the state is written")

			r := h.Accept(t, "s1")
			defer func() { _ = r.Close(ctx) }()
			raw, err := r.GetSessionState(ctx, nil)
			require.NoError(t, err)
			state, err := sessionstate.Decode(raw)
			require.NoError(t, err)
			assert.Equal(t, p.Plan.After, state)
			if tc.deadLetter == "" {
				require.NotNil(t, state.Hold)
				assert.Equal(t, f.Held, state.Hold.SequenceNumber)
				assert.Equal(t, *p.Plan.Wake.MessageID, state.Hold.WakeID, "the state names the wake-up sent")
			} else {
				assert.Nil(t, state.Hold, "unblocked: the followers run next, after the dead-lettered one if it is still there")
				assert.Equal(t, append([]int64{f.Held}, f.Followers...), state.Followers)
			}
			msgs, err := r.ReceiveMessages(ctx, 1, nil)
			require.NoError(t, err)
			require.Len(t, msgs, 1)
			assert.Equal(t, *p.Plan.Wake.MessageID, msgs[0].MessageID, "the wake-up is receivable in the session at once")
			assert.Equal(t, sessionstate.ControlWake, msgs[0].ApplicationProperties[sessionstate.PropControl])
		})
	}
}

func TestReleaseRefuses(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	h.Hold(t, "s-locked", "", "a1")
	h.Hold(t, "s-changed", "", "b1")
	h.SetState(t, "s-foreign", []byte(`{"format":"someone-else"}`))
	h.Send(t, "s-plain", "c1")
	in := h.inspector(t, nil)
	ctx := sbtest.Context(t)
	now := time.Now()

	consumer := h.Accept(t, "s-locked")
	_, err := in.PreviewRelease(ctx, "s-locked", now)
	assert.ErrorIs(t, err, ErrSessionLocked)
	require.NoError(t, consumer.Close(ctx))
	p, err := in.PreviewRelease(ctx, "s-locked", now)
	require.NoError(t, err, "free again")
	consumer = h.Accept(t, "s-locked")
	_, err = in.Release(ctx, p)
	assert.ErrorIs(t, err, ErrSessionLocked)
	require.NoError(t, consumer.Close(ctx))

	foreign := h.Snapshot(t, "s-foreign")
	_, err = in.PreviewRelease(ctx, "s-foreign", now)
	assert.ErrorIs(t, err, sessionstate.ErrForeign)
	assert.Equal(t, foreign, h.Snapshot(t, "s-foreign"), "left alone")

	_, err = in.PreviewRelease(ctx, "s-plain", now)
	assert.ErrorIs(t, err, sessionstate.ErrNotHeld)
	_, err = in.PreviewRelease(ctx, "", now)
	assert.ErrorIs(t, err, ErrEmptySessionID)

	// The state changed between the preview and the release: nothing is sent or written.
	p, err = in.PreviewRelease(ctx, "s-changed", now)
	require.NoError(t, err)
	r := h.Accept(t, "s-changed")
	require.NoError(t, r.SetSessionState(ctx, []byte(`{"format":"sbretry/v1","followers":[99]}`), nil))
	require.NoError(t, r.Close(ctx))
	changed := h.Snapshot(t, "s-changed")
	stats := h.Stats(t)
	_, err = in.Release(ctx, p)
	assert.ErrorIs(t, err, ErrSessionChanged)
	assert.Equal(t, changed, h.Snapshot(t, "s-changed"))
	assert.Equal(t, stats, h.Stats(t), "no wake-up sent")
}

// TestReleaseStateWriteFails: the wake-up went out and the state write failed; the release says
// exactly that, and the session is still held.
func TestReleaseStateWriteFails(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	f := h.Hold(t, "s1", "", "a1")
	in := h.inspector(t, nil)
	ctx := sbtest.Context(t)
	p, err := in.PreviewRelease(ctx, "s1", time.Now())
	require.NoError(t, err)
	in.sessions = failingStateWrites{in.sessions}
	rel, err := in.Release(ctx, p)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "was sent, but writing its new state failed")
	require.NotNil(t, rel)
	assert.True(t, rel.WakeSent)
	assert.False(t, rel.StateWritten)
	s, err := h.inspector(t, nil).HeldSession(ctx, "s1")
	require.NoError(t, err)
	assert.Equal(t, f.State, s.State, "still held as before")
	assert.Len(t, s.WakeUps, 2, "the scheduled wake-up and the one sent")
}

type failingStateWrites struct{ sessionLinks }

func (l failingStateWrites) acceptSession(ctx context.Context, id string) (sessionReceiver, error) {
	r, err := l.sessionLinks.acceptSession(ctx, id)
	if err != nil {
		return nil, err
	}
	return failingSetState{r}, nil
}

type failingSetState struct{ sessionReceiver }

func (failingSetState) SetSessionState(context.Context, []byte, *azservicebus.SetSessionStateOptions) error {
	return errBoom
}

// operations are the operations of calls, in order.
func operations(calls []observed) []string {
	ops := make([]string, len(calls))
	for i, c := range calls {
		ops[i] = c.Operation
	}
	return ops
}

// Every broker call of a listing reaches the Observer, the session calls with their session id.
func TestListHeldSessionsObserved(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	h.Hold(t, "s1", "", "a1")
	obs := &recordingObserver{}
	_, err := h.inspector(t, &Options{Observer: obs}).ListHeldSessions(sbtest.Context(t))
	require.NoError(t, err)
	calls := obs.snapshot()
	assert.Equal(t, []string{OpListSessions, OpAcceptSession, OpGetSessionState, OpPeek, OpPeek}, operations(calls), "one page of sessions; the session read until an empty peek")
	assert.Equal(t, 1, calls[0].Messages, "the page held one session")
	for _, c := range calls {
		assert.Equal(t, sessionQueue, c.Entity)
		assert.NoError(t, c.Err)
		if c.Operation != OpListSessions {
			assert.Equal(t, "s1", c.SessionID, c.Operation)
		}
	}
	assert.Equal(t, 2, calls[3].Messages, "the held message and its wake-up")
}

// A session-enabled subscription is listed like a queue; it cannot be released, since the wake-up would
// have to go to its topic, and so to every subscription.
func TestHeldSessionsOfASubscription(t *testing.T) {
	t.Parallel()
	em := sbemu.StartT(t, sbemu.Config{Topics: []broker.TopicConfig{{Name: "ev", Subscriptions: []broker.SubscriptionConfig{{Name: "sub", RequiresSession: true}}}}})
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), &azservicebus.ClientOptions{RetryOptions: sbtest.FastRetries})
	require.NoError(t, err)
	ctx := sbtest.Context(t)
	defer func() { _ = client.Close(ctx) }()
	s, err := client.NewSender("ev", nil)
	require.NoError(t, err)
	m := sbtest.Message("e1")
	sid := "s1"
	m.SessionID = &sid
	require.NoError(t, s.SendMessage(ctx, m, nil))
	require.NoError(t, s.Close(ctx))
	r, err := client.AcceptSessionForSubscription(ctx, "ev", "sub", sid, nil)
	require.NoError(t, err)
	state := sessionstate.State{Followers: []int64{1}}
	raw, err := sessionstate.Marshal(state)
	require.NoError(t, err)
	require.NoError(t, r.SetSessionState(ctx, raw, nil))
	require.NoError(t, r.Close(ctx))

	in, err := New(client, "ev/Subscriptions/sub", &Options{RetryQueue: "ev-retry"})
	require.NoError(t, err)
	got, err := in.ListHeldSessions(ctx)
	require.NoError(t, err)
	require.Len(t, got.Sessions, 1)
	assert.Equal(t, "ev/Subscriptions/sub", got.Sessions[0].Entity)
	assert.Equal(t, state, got.Sessions[0].State)
	_, err = in.PreviewRelease(ctx, sid, time.Now())
	assert.ErrorIs(t, err, ErrUnknownEntity)
}

// relockingLinks hands out receivers whose LockedUntil moves during the wake-up's send, or during the
// state write: as after azservicebus took the session again, its lock lost (it retries a call whose
// session lock was lost by accepting the session anew).
type relockingLinks struct {
	sessionLinks
	duringWrite bool
	moved       *bool
}

func (l relockingLinks) acceptSession(ctx context.Context, id string) (sessionReceiver, error) {
	r, err := l.sessionLinks.acceptSession(ctx, id)
	if err != nil {
		return nil, err
	}
	return relockingReceiver{sessionReceiver: r, l: l}, nil
}

func (l relockingLinks) entitySender() (sender, error) {
	s, err := l.sessionLinks.entitySender()
	return relockingSender{sender: s, l: l}, err
}

type relockingReceiver struct {
	sessionReceiver
	l relockingLinks
}

func (r relockingReceiver) SetSessionState(ctx context.Context, b []byte, o *azservicebus.SetSessionStateOptions) error {
	err := r.sessionReceiver.SetSessionState(ctx, b, o)
	if r.l.duringWrite {
		*r.l.moved = true
	}
	return err
}

func (r relockingReceiver) LockedUntil() time.Time {
	if *r.l.moved {
		return r.sessionReceiver.LockedUntil().Add(time.Hour)
	}
	return r.sessionReceiver.LockedUntil()
}

type relockingSender struct {
	sender
	l relockingLinks
}

func (s relockingSender) SendMessage(ctx context.Context, m *azservicebus.Message, o *azservicebus.SendMessageOptions) error {
	err := s.sender.SendMessage(ctx, m, o)
	if !s.l.duringWrite {
		*s.l.moved = true
	}
	return err
}

// A session lock lost and taken again by the SDK during a release is never reported as a success:
// during the send, the state is not written; during the write, the release says the state written may
// have replaced a newer record.
func TestReleaseLockTakenAgain(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	ctx := sbtest.Context(t)
	for _, duringWrite := range []bool{false, true} {
		id, msgID := "s-relock-send", "r1"
		if duringWrite {
			id, msgID = "s-relock-write", "r2"
		}
		f := h.Hold(t, id, "", msgID)
		in := h.inspector(t, nil)
		p, err := in.PreviewRelease(ctx, id, time.Now())
		require.NoError(t, err)
		in.sessions = relockingLinks{sessionLinks: in.sessions, duringWrite: duringWrite, moved: new(bool)}
		rel, err := in.Release(ctx, p)
		require.ErrorIs(t, err, ErrSessionChanged, id)
		require.NotNil(t, rel)
		assert.True(t, rel.WakeSent, id)
		assert.Equal(t, duringWrite, rel.StateWritten, "%s: what was done is said", id)
		if !duringWrite {
			s, err := h.inspector(t, nil).HeldSession(ctx, id)
			require.NoError(t, err)
			assert.Equal(t, f.State, s.State, "not written once the lock moved")
		}
	}
}

// unreadableLinks fails the state read of one session.
type unreadableLinks struct {
	sessionLinks
	id string
}

func (l unreadableLinks) acceptSession(ctx context.Context, id string) (sessionReceiver, error) {
	r, err := l.sessionLinks.acceptSession(ctx, id)
	if err != nil || id != l.id {
		return r, err
	}
	return failingGetState{r}, nil
}

type failingGetState struct{ sessionReceiver }

func (failingGetState) GetSessionState(context.Context, *azservicebus.GetSessionStateOptions) ([]byte, error) {
	return nil, errBoom
}

// One session that cannot be read does not hide the others: it is listed as unreadable, with why.
func TestListHeldSessionsGoesOnPastAnUnreadableSession(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	h.Hold(t, "u1", "", "u1-a")
	h.Hold(t, "u2", "", "u2-a")
	h.Hold(t, "u3", "", "u3-a")
	in := h.inspector(t, nil)
	in.sessions = unreadableLinks{sessionLinks: in.sessions, id: "u2"}
	held, err := in.ListHeldSessions(sbtest.Context(t))
	require.NoError(t, err)
	require.Len(t, held.Sessions, 3)
	for _, s := range held.Sessions {
		if s.SessionID == "u2" {
			assert.ErrorIs(t, s.ReadErr, errBoom)
		} else {
			assert.NoError(t, s.ReadErr, s.SessionID)
			assert.NotNil(t, s.Hold(), s.SessionID)
		}
	}
}

// Two sessions blocked after a dead-letter, released for one planned time (a script that passes one
// now): each gets its own wake-up, which the broker keeps, and both are released.
func TestReleaseSessionsAtOnePlannedTime(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	h.Hold(t, "s1", "RetryMaxAttemptsExceeded", "a1", "a2")
	h.Hold(t, "s2", "RetryMaxAttemptsExceeded", "b1", "b2")
	in := h.inspector(t, nil)
	ctx := sbtest.Context(t)
	now := time.Now()
	for _, sid := range []string{"s1", "s2"} {
		p, err := in.PreviewRelease(ctx, sid, now)
		require.NoError(t, err)
		rel, err := in.Release(ctx, p)
		require.NoError(t, err, sid)
		assert.True(t, rel.WakeSent && rel.StateWritten, sid)
	}
	for _, sid := range []string{"s1", "s2"} {
		r := h.Accept(t, sid)
		msgs, err := r.ReceiveMessages(ctx, 1, nil)
		require.NoError(t, err)
		require.Len(t, msgs, 1, "the wake-up of %s is in its session", sid)
		assert.Equal(t, sessionstate.ControlWake, msgs[0].ApplicationProperties[sessionstate.PropControl])
		require.NoError(t, r.Close(ctx))
	}
}

// A wake-up that duplicate detection drops is not reported sent, and the state is not written to name
// it: the release did nothing, and says so.
func TestReleaseWakeUpDroppedByDuplicateDetection(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	h.Hold(t, "s1", "RetryMaxAttemptsExceeded", "a1")
	in := h.inspector(t, nil)
	ctx := sbtest.Context(t)
	p, err := in.PreviewRelease(ctx, "s1", time.Now())
	require.NoError(t, err)
	// A message with the wake-up's id, sent and consumed within the duplicate detection window.
	h.Send(t, "other", *p.Plan.Wake.MessageID)
	r := h.Accept(t, "other")
	msgs, err := r.ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.NoError(t, r.CompleteMessage(ctx, msgs[0], nil))
	require.NoError(t, r.Close(ctx))
	before := h.Snapshot(t, "s1")

	rel, err := in.Release(ctx, p)
	require.ErrorIs(t, err, ErrWakeUpDropped)
	assert.False(t, rel.WakeSent, "the broker did not keep it")
	assert.False(t, rel.StateWritten)
	assert.Equal(t, before, h.Snapshot(t, "s1"), "the state is as it was")
}

// TestWakeToOptions: WakeTo names the topic of a session subscription's wake-ups; a queue's go to the
// queue itself, and a path is no topic.
func TestWakeToOptions(t *testing.T) {
	t.Parallel()
	client, err := azservicebus.NewClientFromConnectionString("Endpoint=sb://localhost:1;SharedAccessKeyName=k;SharedAccessKey=a2V5;UseDevelopmentEmulator=true", nil)
	require.NoError(t, err)
	_, err = New(client, "ev/Subscriptions/sub", &Options{SessionConsumer: true, WakeTo: "ev"})
	assert.NoError(t, err)
	for name, tc := range map[string]struct {
		entity string
		opts   Options
	}{
		"a queue":              {"jobs", Options{SessionConsumer: true, WakeTo: "ev"}},
		"a path":               {"ev/Subscriptions/sub", Options{SessionConsumer: true, WakeTo: "ev/Subscriptions/other"}},
		"not a session entity": {"ev/Subscriptions/sub", Options{RetryQueue: "r", WakeTo: "ev"}},
	} {
		_, err := New(client, tc.entity, &tc.opts)
		assert.ErrorIs(t, err, ErrInvalidOptions, name)
	}
}
