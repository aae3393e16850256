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
