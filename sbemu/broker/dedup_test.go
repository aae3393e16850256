package broker

import (
	"testing"
	"time"

	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDuplicateDetection(t *testing.T) {
	tests := []struct {
		name          string
		window        time.Duration
		firstID       any
		secondID      any
		after         time.Duration
		wantDuplicate bool
	}{
		{"same id inside window", time.Minute, "m1", "m1", 59 * time.Second, true},
		{"same id at window end", time.Minute, "m1", "m1", time.Minute, false},
		{"same id after window", time.Minute, "m1", "m1", 2 * time.Minute, false},
		{"different ids", time.Minute, "m1", "m2", 0, false},
		{"detection off", 0, "m1", "m1", 0, false},
		{"no message id", time.Minute, nil, nil, 0, false},
		{"uuid ids", time.Minute, amqp.UUID{1}, amqp.UUID{1}, 0, true},
		{"binary ids", time.Minute, []byte("id"), []byte("id"), 0, true},
		{"same text, different types", time.Minute, "1", uint64(1), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, mock := newTestQueue(t, QueueConfig{DuplicateDetectionWindow: tt.window})
			first, dup, err := q.Send(newMsg(tt.firstID, "first"), 1)
			require.NoError(t, err)
			require.False(t, dup)
			mock.Add(tt.after)
			second, dup, err := q.Send(newMsg(tt.secondID, "second"), 1)
			require.NoError(t, err)
			assert.Equal(t, tt.wantDuplicate, dup)
			if tt.wantDuplicate {
				assert.Equal(t, first, second, "a duplicate reports the original's sequence number")
				assert.Equal(t, Stats{Active: 1}, q.Stats(), "nothing stored")
				return
			}
			assert.NotEqual(t, first, second)
			assert.Equal(t, Stats{Active: 2}, q.Stats())
		})
	}
}

func TestDuplicateWindowCountsFromFirstSend(t *testing.T) {
	q, mock := newTestQueue(t, QueueConfig{DuplicateDetectionWindow: time.Minute})
	mustSend(t, q, newMsg("m", "1"))
	mock.Add(40 * time.Second)
	_, dup, err := q.Send(newMsg("m", "2"), 1)
	require.NoError(t, err)
	require.True(t, dup)
	mock.Add(20 * time.Second) // 60s after the first send, 20s after the duplicate
	_, dup, err = q.Send(newMsg("m", "3"), 1)
	require.NoError(t, err)
	assert.False(t, dup)
}

func TestDuplicateDetectionAppliesToSchedule(t *testing.T) {
	q, mock := newTestQueue(t, QueueConfig{DuplicateDetectionWindow: time.Minute})
	seq, err := q.Schedule(newMsg("m", "1"), 1, mock.Now().Add(time.Hour))
	require.NoError(t, err)
	again, err := q.Schedule(newMsg("m", "2"), 1, mock.Now().Add(time.Hour))
	require.NoError(t, err)
	assert.Equal(t, seq, again)
	assert.Equal(t, Stats{Scheduled: 1}, q.Stats())
}

func TestDuplicateDetectorPrunes(t *testing.T) {
	d := newDuplicateDetector(time.Minute)
	t0 := time.Unix(0, 0)
	d.record("a", 1, t0)
	d.record("b", 2, t0.Add(30*time.Second))
	d.prune(t0.Add(time.Minute))
	assert.NotContains(t, d.seen, "a")
	assert.Contains(t, d.seen, "b")
	assert.Len(t, d.order, 1)
}
