package broker

import (
	"testing"
	"time"

	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPeek(t *testing.T) {
	q, mock := newTestQueue(t, QueueConfig{})
	mustSend(t, q, newMsg("1", "active"))
	mustSend(t, q, newMsg("2", "locked"))
	_, err := q.Schedule(newMsg("3", "scheduled"), 1, mock.Now().Add(time.Hour))
	require.NoError(t, err)
	mustSend(t, q, newMsg("4", "tail"))
	// Lock "active" then put it back, keep "locked" locked, complete "tail".
	d := mustReceive(t, q, PeekLock)
	_ = mustReceive(t, q, PeekLock)
	require.NoError(t, q.Complete(mustReceive(t, q, PeekLock).LockToken))
	require.NoError(t, q.Release(d.LockToken))

	tests := []struct {
		name     string
		from     int64
		max      int
		wantSeqs []int64
	}{
		{"all", 0, 10, []int64{1, 2, 3}},
		{"from the middle", 2, 10, []int64{2, 3}},
		{"limited", 1, 2, []int64{1, 2}},
		{"past the end", 4, 10, []int64{}},
		{"zero max", 0, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := q.Peek(tt.from, tt.max)
			seqs := []int64{}
			if got == nil {
				seqs = nil
			}
			for _, p := range got {
				seqs = append(seqs, p.SequenceNumber)
				assert.Equal(t, p.SequenceNumber, p.Message.Annotations[AnnotationSequenceNumber])
				assert.Zero(t, p.LockToken)
				assert.NotContains(t, p.Message.Annotations, AnnotationLockedUntil)
			}
			assert.Equal(t, tt.wantSeqs, seqs)
		})
	}
	all := q.Peek(0, 10)
	assert.Equal(t, messageStateScheduled, all[2].Message.Annotations[AnnotationMessageState])
	assert.NotContains(t, all[0].Message.Annotations, AnnotationMessageState)
	assert.Equal(t, Stats{Active: 1, Locked: 1, Scheduled: 1}, q.Stats(), "peek takes no locks")
}

// TestPeekSessionShowsOnlyItsSession: a session receiver's peek sees its
// session's messages, received or not, and no other session's.
func TestPeekSessionShowsOnlyItsSession(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{RequiresSession: true})
	for _, m := range []*amqp.Message{sessionMsg("a", "a1"), sessionMsg("b", "b1"), sessionMsg("", "e1"), sessionMsg("a", "a2")} {
		mustSend(t, q, m)
	}
	lock, _, err := q.AcceptSession("a", 1)
	require.NoError(t, err)
	_, ok := lock.TryReceive(PeekLock)
	require.True(t, ok)

	tests := []struct {
		session string
		from    int64
		max     int
		want    []string
	}{
		{"a", 1, 10, []string{"a1", "a2"}},
		{"a", 2, 10, []string{"a2"}},
		{"a", 1, 1, []string{"a1"}},
		{"", 1, 10, []string{"e1"}},
		{"none", 1, 10, nil},
		{"a", 1, 0, nil},
	}
	for _, tc := range tests {
		var got []string
		for _, d := range q.PeekSession(tc.session, tc.from, tc.max) {
			got = append(got, body(d))
		}
		assert.Equal(t, tc.want, got, "session %q from %d max %d", tc.session, tc.from, tc.max)
	}
}
