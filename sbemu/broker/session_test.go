package broker

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sessionMsg(session, body string) *amqp.Message {
	m := newMsg(nil, body)
	m.Properties.GroupID = &session
	return m
}

func TestSessionReceiveIsPerSessionFIFO(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{RequiresSession: true})
	for _, m := range []*amqp.Message{sessionMsg("a", "a1"), sessionMsg("b", "b1"), sessionMsg("a", "a2")} {
		mustSend(t, q, m)
	}
	_, ok := q.TryReceive(PeekLock, 1)
	assert.False(t, ok, "no receive without a session")
	_, err := q.Receive(context.Background(), PeekLock, 1)
	assert.ErrorIs(t, err, ErrSessionRequired)

	lock, until, err := q.AcceptSession("a", 1)
	require.NoError(t, err)
	assert.False(t, until.IsZero())
	d1, ok := lock.TryReceive(PeekLock)
	require.True(t, ok)
	d2, ok := lock.TryReceive(PeekLock)
	require.True(t, ok)
	assert.Equal(t, []string{"a1", "a2"}, []string{body(d1), body(d2)})
	_, ok = lock.TryReceive(PeekLock)
	assert.False(t, ok, "b1 belongs to another session")
	assert.Equal(t, Stats{Active: 1, Locked: 2}, q.Stats())
}

func TestSessionLockIsExclusiveAndExpires(t *testing.T) {
	q, mock := newTestQueue(t, QueueConfig{RequiresSession: true, LockDuration: 10 * time.Second})
	lock, _, err := q.AcceptSession("s", 1)
	require.NoError(t, err)
	_, _, err = q.AcceptSession("s", 2)
	assert.ErrorIs(t, err, ErrSessionCannotBeLocked)

	mock.Add(5 * time.Second)
	until, err := q.RenewSessionLock("s", 1)
	require.NoError(t, err)
	assert.Equal(t, mock.Now().Add(10*time.Second), until)
	_, err = q.RenewSessionLock("s", 2)
	assert.ErrorIs(t, err, ErrSessionLockLost, "renewal by another connection")

	mock.Add(11 * time.Second)
	assert.False(t, lock.Held())
	_, err = q.RenewSessionLock("s", 1)
	assert.ErrorIs(t, err, ErrSessionLockLost)
	_, err = lock.Receive(context.Background(), PeekLock)
	assert.ErrorIs(t, err, ErrSessionLockLost)
	_, _, err = q.AcceptSession("s", 2)
	require.NoError(t, err, "an expired lock lets another receiver in")
}

func TestSessionReleaseAndReleaseOwner(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{RequiresSession: true})
	lock, _, err := q.AcceptSession("s", 1)
	require.NoError(t, err)
	lock.Release()
	lock2, _, err := q.AcceptSession("s", 2)
	require.NoError(t, err)
	lock.Release() // a released lock does not release its successor
	assert.True(t, lock2.Held())
	q.b.ReleaseOwner(2)
	assert.False(t, lock2.Held())
	_, _, err = q.AcceptSession("s", 3)
	require.NoError(t, err)
}

func TestAcceptNextSession(t *testing.T) {
	q, mock := newTestQueue(t, QueueConfig{RequiresSession: true})
	mustSend(t, q, sessionMsg("late", "x"))
	mustSend(t, q, sessionMsg("early", "y")) // later message, but...
	_, _, err := q.AcceptSession("late", 9)
	require.NoError(t, err)

	lock, _, err := q.AcceptNextSession(context.Background(), 1, time.Minute)
	require.NoError(t, err)
	assert.Equal(t, "early", lock.SessionID(), "the only unlocked session with messages")

	done := make(chan error, 1)
	go func() {
		_, _, err := q.AcceptNextSession(context.Background(), 1, time.Minute)
		done <- err
	}()
	waitFor(t, func() bool { return waiters(q) == 1 })
	mustSend(t, q, sessionMsg("new", "z"))
	require.NoError(t, <-done, "a message in a new session wakes the waiter")

	go func() {
		_, _, err := q.AcceptNextSession(context.Background(), 1, 30*time.Second)
		done <- err
	}()
	waitFor(t, func() bool { return waiters(q) == 1 })
	mock.Add(30 * time.Second) // before the session locks (60 s) run out
	assert.ErrorIs(t, <-done, ErrSessionTimeout)
}

func TestSessionStateAndBounds(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{RequiresSession: true, MaxMessageSize: 1024})
	_, _, err := q.Send(newMsg("x", "no session"), 10)
	assert.ErrorIs(t, err, ErrSessionRequired)
	long := strings.Repeat("é", MaxSessionIDLength+1)
	_, _, err = q.Send(sessionMsg(long, "x"), 10)
	assert.ErrorIs(t, err, ErrInvalidSessionID)
	_, _, err = q.AcceptSession(long, 1)
	assert.ErrorIs(t, err, ErrInvalidSessionID)
	_, _, err = q.AcceptSession(strings.Repeat("é", MaxSessionIDLength), 1)
	require.NoError(t, err, "the limit counts characters, not bytes")

	_, _, err = q.AcceptSession("s", 1)
	require.NoError(t, err)
	_, err = q.SessionState("s", 2)
	assert.ErrorIs(t, err, ErrSessionLockLost, "only the holder's connection")
	assert.ErrorIs(t, q.SetSessionState("s", 1, make([]byte, 1025)), ErrMessageTooLarge)
	require.NoError(t, q.SetSessionState("s", 1, []byte("st")))
	st, err := q.SessionState("s", 1)
	require.NoError(t, err)
	assert.Equal(t, "st", string(st))
	ids, err := q.Sessions(0, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{"s"}, ids, "a session with state is listed")

	plain, _ := newTestQueue(t, QueueConfig{})
	_, _, err = plain.AcceptSession("s", 1)
	assert.ErrorIs(t, err, ErrSessionRequired)
}

func TestPersistSessionState(t *testing.T) {
	dir := t.TempDir()
	mock := newPersistClock()
	queues := []QueueConfig{{Name: "sq", RequiresSession: true}}
	open := func() *Broker {
		b, err := New(Options{Clock: mock, DataDir: dir}, queues...)
		require.NoError(t, err)
		t.Cleanup(b.Close)
		return b
	}
	b := open()
	q, _ := b.Queue("sq")
	mustSend(t, q, sessionMsg("m", "kept"))
	_, _, err := q.AcceptSession("a", 1)
	require.NoError(t, err)
	setAt := mock.Now()
	require.NoError(t, q.SetSessionState("a", 1, []byte("one")))
	mock.Add(time.Minute)
	_, _, err = q.AcceptSession("b", 1)
	require.NoError(t, err)
	require.NoError(t, q.SetSessionState("b", 1, []byte("two")))
	require.NoError(t, q.SetSessionState("b", 1, nil))
	b.Close()

	b2 := open()
	q2, _ := b2.Queue("sq")
	ids, err := q2.Sessions(0, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "m"}, ids, "locks do not survive; state and messages do")
	ids, err = q2.SessionsUpdatedAfter(setAt.Add(-time.Second), 0, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{"a"}, ids, "the time the state was set survives")
	ids, err = q2.SessionsUpdatedAfter(setAt, 0, 0)
	require.NoError(t, err)
	assert.Empty(t, ids)
	_, _, err = q2.AcceptSession("a", 5)
	require.NoError(t, err, "the lock did not survive the restart")
	st, err := q2.SessionState("a", 5)
	require.NoError(t, err)
	assert.Equal(t, "one", string(st))
	b2.Close()

	b3 := open() // from the snapshot written at the second open
	q3, _ := b3.Queue("sq")
	_, _, err = q3.AcceptSession("a", 5)
	require.NoError(t, err)
	st, err = q3.SessionState("a", 5)
	require.NoError(t, err)
	assert.Equal(t, "one", string(st))
	ids, err = q3.SessionsUpdatedAfter(setAt.Add(-time.Second), 0, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{"a"}, ids, "and the snapshot keeps it")
}

// TestSessionsUpdatedAfter: the second mode of get-message-sessions lists
// the sessions whose state was set after a time, never one that only has
// messages or whose state was cleared.
func TestSessionsUpdatedAfter(t *testing.T) {
	q, mock := newTestQueue(t, QueueConfig{RequiresSession: true})
	mustSend(t, q, sessionMsg("messages-only", "m"))
	setState := func(id string, state []byte) {
		t.Helper()
		lock, _, err := q.AcceptSession(id, 1)
		require.NoError(t, err)
		require.NoError(t, q.SetSessionState(id, 1, state))
		lock.Release()
	}
	start := mock.Now()
	setState("a", []byte("1"))
	mock.Add(time.Minute)
	setState("b", []byte("2"))
	setState("cleared", []byte("3"))
	setState("cleared", nil)
	mock.Add(time.Minute)

	tests := []struct {
		name      string
		after     time.Time
		skip, top int
		want      []string
	}{
		{"before both", start.Add(-time.Second), 0, 0, []string{"a", "b"}},
		{"between", start.Add(30 * time.Second), 0, 0, []string{"b"}},
		{"at the last update", start.Add(time.Minute), 0, 0, nil},
		{"in the future", mock.Now().Add(time.Hour), 0, 0, nil},
		{"paged", start.Add(-time.Second), 1, 1, []string{"b"}},
		{"skipped past the end", start.Add(-time.Second), 5, 0, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ids, err := q.SessionsUpdatedAfter(tc.after, tc.skip, tc.top)
			require.NoError(t, err)
			assert.Equal(t, tc.want, ids)
		})
	}
	all, err := q.Sessions(0, 0)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b", "messages-only"}, all, "the default mode still lists messages and states")

	plain, _ := newTestQueue(t, QueueConfig{})
	_, err = plain.SessionsUpdatedAfter(start, 0, 0)
	assert.ErrorIs(t, err, ErrSessionRequired)
}

// waitFor yields until cond holds (it never sleeps), failing after 5 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "condition never held")
		runtime.Gosched()
	}
}

func TestExpireAllLocksExpiresSessionLocks(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{RequiresSession: true})
	lock, _, err := q.AcceptSession("s", 1)
	require.NoError(t, err)
	q.b.ExpireAllLocks()
	assert.False(t, lock.Held())
	_, err = q.RenewSessionLock("s", 1)
	assert.ErrorIs(t, err, ErrSessionLockLost)
	_, _, err = q.AcceptSession("s", 2)
	require.NoError(t, err)
}

// A receiver parked in its session wakes with ErrSessionLockLost when the
// lock runs out, so the server can detach its link.
func TestParkedSessionReceiverLosesTheLock(t *testing.T) {
	q, mock := newTestQueue(t, QueueConfig{RequiresSession: true, LockDuration: 10 * time.Second})
	lock, _, err := q.AcceptSession("s", 1)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := lock.Receive(context.Background(), PeekLock)
		done <- err
	}()
	waitFor(t, func() bool { return waiters(q) == 1 })
	mock.Add(11 * time.Second)
	select {
	case err := <-done:
		assert.ErrorIs(t, err, ErrSessionLockLost)
	case <-time.After(5 * time.Second):
		t.Fatal("the parked receiver was not woken")
	}
}

// TestReplayOlderSessionStateRecord: a journal written before session
// states were dated (opSessionState, no time) still replays, its state
// dated zero, next to the dated form the broker writes now.
func TestReplayOlderSessionStateRecord(t *testing.T) {
	img := newImage()
	img.setEntities(storedEntities{Queues: []QueueConfig{{Name: "sq", RequiresSession: true}}})
	old := &recordEncoder{}
	old.byte(opSessionState)
	old.string("sq")
	old.string("legacy")
	old.byte(1)
	old.bytes([]byte("before"))
	at := time.Unix(1_700_000_000, 0)
	old.sessionState("sq", "dated", []byte("now"), at)
	require.NoError(t, img.apply(old.buf))
	s := img.stored["sq"]
	require.NotNil(t, s)
	assert.Equal(t, storedSessionState{state: []byte("before")}, s.sessions["legacy"])
	assert.Equal(t, []byte("now"), s.sessions["dated"].state)
	assert.True(t, at.Equal(s.sessions["dated"].updated))
}

// TestSessionLockIsTheUmbrellaOfMessageLocks: a message received in a
// session stays locked while the session lock is renewed, and goes back to
// the session, first in line, when the session lock ends: counted when it
// expired, not counted when the receiver closed (message-sessions.md,
// "Impact of delivery count").
func TestSessionLockIsTheUmbrellaOfMessageLocks(t *testing.T) {
	tests := []struct {
		name      string
		end       func(q *Queue, lock *SessionLock, advance func(time.Duration))
		wantCount uint32
	}{
		{"expired", func(_ *Queue, _ *SessionLock, advance func(time.Duration)) { advance(11 * time.Second) }, 1},
		{"released", func(_ *Queue, lock *SessionLock, _ func(time.Duration)) { lock.Release() }, 0},
		{"connection dropped", func(q *Queue, _ *SessionLock, _ func(time.Duration)) { q.b.ReleaseOwner(1) }, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q, mock := newTestQueue(t, QueueConfig{RequiresSession: true, LockDuration: 10 * time.Second})
			mustSend(t, q, sessionMsg("s", "1"))
			mustSend(t, q, sessionMsg("s", "2"))
			lock, _, err := q.AcceptSession("s", 1)
			require.NoError(t, err)
			d1, ok := lock.TryReceive(PeekLock)
			require.True(t, ok)
			assert.Equal(t, lock.LockedUntil(), d1.LockedUntil, "the message lock is the session's")

			// Twice the lock duration, renewing the session lock only.
			for range 4 {
				mock.Add(5 * time.Second)
				_, err := q.RenewSessionLock("s", 1)
				require.NoError(t, err)
			}
			until, err := q.RenewLock(d1.LockToken)
			require.NoError(t, err, "still locked under the renewed session lock")
			assert.Equal(t, lock.LockedUntil(), until[0])

			tc.end(q, lock, mock.Add)
			assert.ErrorIs(t, q.Complete(d1.LockToken), ErrLockLost, "the lock ended with the session's")
			next, _, err := q.AcceptSession("s", 2)
			require.NoError(t, err)
			again, ok := next.TryReceive(PeekLock)
			require.True(t, ok)
			assert.Equal(t, "1", body(again), "back first in its session")
			assert.Equal(t, tc.wantCount, again.Message.Header.DeliveryCount)
		})
	}
}

// TestReceiveDeferredInSessionIsLimitedToIt: the receive by sequence
// number of a session receiver sees only its session's deferred messages,
// the empty session id included.
func TestReceiveDeferredInSessionIsLimitedToIt(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{RequiresSession: true})
	mustSend(t, q, sessionMsg("a", "a1"))
	mustSend(t, q, sessionMsg("", "empty"))
	la, _, err := q.AcceptSession("a", 1)
	require.NoError(t, err)
	da, ok := la.TryReceive(PeekLock)
	require.True(t, ok)
	require.NoError(t, q.Defer(da.LockToken, nil))
	le, _, err := q.AcceptSession("", 1)
	require.NoError(t, err)

	_, err = q.ReceiveDeferredInSession(PeekLock, 1, "", da.SequenceNumber)
	assert.ErrorIs(t, err, ErrNotFound, "another session's deferred message")
	_, err = q.ReceiveDeferredInSession(PeekLock, 2, "a", da.SequenceNumber)
	assert.ErrorIs(t, err, ErrSessionLockLost, "a connection that does not hold the session")
	got, err := q.ReceiveDeferredInSession(PeekLock, 1, "a", da.SequenceNumber)
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, la.LockedUntil(), got[0].LockedUntil, "locked under the session lock")

	la.Release()
	assert.ErrorIs(t, q.Complete(got[0].LockToken), ErrLockLost)
	le.Release()
	la2, _, err := q.AcceptSession("a", 3)
	require.NoError(t, err)
	_, ok = la2.TryReceive(PeekLock)
	assert.False(t, ok, "still deferred, not receivable")
	again, err := q.ReceiveDeferredInSession(PeekLock, 3, "a", da.SequenceNumber)
	require.NoError(t, err)
	require.NoError(t, q.Complete(again[0].LockToken))
}
