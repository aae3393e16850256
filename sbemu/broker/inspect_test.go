package broker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestInspection(t *testing.T) {
	q, mock := newTestQueue(t, QueueConfig{})
	mustSend(t, q, newMsg("1", "one"))
	mustSend(t, q, newMsg("2", "two"))
	mustSend(t, q, newMsg("3", "three"))
	at := mock.Now().Add(time.Minute)
	seq, err := q.Schedule(newMsg("4", "later"), 1, at)
	require.NoError(t, err)
	locked := mustReceive(t, q, PeekLock)
	require.NoError(t, q.DeadLetter(mustReceive(t, q, PeekLock).LockToken, "r", "", nil))

	assert.Equal(t, Stats{Active: 1, Scheduled: 1, Locked: 1, DeadLettered: 1}, q.Stats())
	active := q.ActiveMessages()
	require.Len(t, active, 1)
	assert.Equal(t, "three", string(active[0].GetData()))
	active[0].Data[0][0] = 'X'
	assert.Equal(t, "three", string(q.ActiveMessages()[0].GetData()), "copies")

	sched := q.ScheduledMessages()
	require.Len(t, sched, 1)
	assert.Equal(t, seq, sched[0].Seq)
	assert.Equal(t, at, sched[0].At)
	assert.Equal(t, "later", string(sched[0].Message.GetData()))

	assert.Equal(t, Stats{Active: 1}, q.dlq.Stats())
	require.NoError(t, q.Complete(locked.LockToken))
}

// SessionSnapshots sees every session without holding it: messages in each
// state, the holder's expiry and the state.
func TestSessionSnapshots(t *testing.T) {
	q, mock := newTestQueue(t, QueueConfig{RequiresSession: true, LockDuration: 30 * time.Second})
	mustSend(t, q, sessionMsg("a", "a1"))
	mustSend(t, q, sessionMsg("a", "a2"))
	mustSend(t, q, sessionMsg("b", "b1"))
	_, err := q.Schedule(sessionMsg("c", "c1"), 10, mock.Now().Add(time.Hour))
	require.NoError(t, err)
	l, until, err := q.AcceptSession("a", 1)
	require.NoError(t, err)
	d, ok := l.TryReceive(PeekLock)
	require.True(t, ok)
	require.NoError(t, q.Defer(d.LockToken, nil))
	_, ok = l.TryReceive(PeekLock)
	require.True(t, ok)
	require.NoError(t, q.SetSessionState("a", 1, []byte("st")))
	_, _, err = q.AcceptSession("empty", 1)
	require.NoError(t, err)

	snaps := q.SessionSnapshots()
	require.Len(t, snaps, 4)
	assert.Equal(t, SessionSnapshot{ID: "a", Locked: 1, Deferred: 1, LockedUntil: until, State: []byte("st"), StateUpdated: mock.Now()}, snaps[0])
	assert.Equal(t, SessionSnapshot{ID: "b", Active: 1}, snaps[1])
	assert.Equal(t, SessionSnapshot{ID: "c", Scheduled: 1}, snaps[2])
	assert.Equal(t, SessionSnapshot{ID: "empty", LockedUntil: until}, snaps[3])

	plain, _ := newTestQueue(t, QueueConfig{})
	assert.Nil(t, plain.SessionSnapshots())
}
