package broker

import (
	"context"
	"testing"
	"time"

	"github.com/Azure/go-amqp"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestScheduledMessages(t *testing.T) {
	tests := []struct {
		name     string
		schedule func(t *testing.T, q *Queue, at time.Time) int64
	}{
		{"send with annotation", func(t *testing.T, q *Queue, at time.Time) int64 {
			m := newMsg("s", "scheduled")
			m.Annotations = amqp.Annotations{AnnotationScheduledEnqueueTime: at}
			return mustSend(t, q, m)
		}},
		{"send with symbol-keyed annotation", func(t *testing.T, q *Queue, at time.Time) int64 {
			m := newMsg("s", "scheduled")
			m.Annotations = amqp.Annotations{amqp.Symbol(AnnotationScheduledEnqueueTime): at}
			return mustSend(t, q, m)
		}},
		{"schedule", func(t *testing.T, q *Queue, at time.Time) int64 {
			seq, err := q.Schedule(newMsg("s", "scheduled"), 10, at)
			require.NoError(t, err)
			return seq
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, mock := newTestQueue(t, QueueConfig{DefaultTTL: time.Hour})
			at := mock.Now().Add(time.Minute)
			seq := tt.schedule(t, q, at)
			assert.EqualValues(t, 1, seq)
			assert.Equal(t, Stats{Scheduled: 1}, q.Stats())

			ch := receiveAsync(t, context.Background(), q, PeekLock)
			mock.Add(59 * time.Second)
			assertPending(t, ch)
			_, ok := q.TryReceive(PeekLock, 2)
			assert.False(t, ok, "not visible before its time")

			mock.Add(time.Second)
			r := await(t, ch)
			require.NoError(t, r.err)
			assert.Equal(t, "scheduled", body(r.d))
			assert.EqualValues(t, 2, r.d.SequenceNumber, "a new sequence number on activation")
			assert.Equal(t, at, r.d.Message.Annotations[AnnotationEnqueuedTime])
			gotAt, _ := scheduledEnqueueTime(r.d.Message)
			assert.Equal(t, at, gotAt)
			assert.ErrorIs(t, q.CancelScheduled(seq), ErrNotFound, "activated messages cannot be cancelled")

			// TTL counts from the scheduled time.
			require.NoError(t, q.Abandon(r.d.LockToken, nil))
			mock.Add(time.Hour - time.Millisecond)
			assert.Equal(t, Stats{Active: 1}, q.Stats())
			mock.Add(time.Millisecond)
			assert.Equal(t, Stats{}, q.Stats())
		})
	}
}

func TestScheduleInThePastEnqueuesNow(t *testing.T) {
	q, mock := newTestQueue(t, QueueConfig{})
	mock.Add(time.Hour)
	seq, err := q.Schedule(newMsg("1", "x"), 1, mock.Now().Add(-time.Minute))
	require.NoError(t, err)
	d := mustReceive(t, q, PeekLock)
	assert.Equal(t, seq, d.SequenceNumber)
}

func TestScheduledActivateInTimeOrder(t *testing.T) {
	q, mock := newTestQueue(t, QueueConfig{})
	base := mock.Now()
	late, err := q.Schedule(newMsg("late", "late"), 1, base.Add(2*time.Minute))
	require.NoError(t, err)
	early, err := q.Schedule(newMsg("early", "early"), 1, base.Add(time.Minute))
	require.NoError(t, err)
	assert.Equal(t, []Scheduled{
		{Seq: late, At: base.Add(2 * time.Minute)},
		{Seq: early, At: base.Add(time.Minute)},
	}, withoutMessages(q.ScheduledMessages()))

	mock.Add(3 * time.Minute)
	first := mustReceive(t, q, ReceiveAndDelete)
	second := mustReceive(t, q, ReceiveAndDelete)
	assert.Equal(t, "early", body(first))
	assert.Equal(t, "late", body(second))
	assert.Less(t, first.SequenceNumber, second.SequenceNumber)
}

func withoutMessages(s []Scheduled) []Scheduled {
	for i := range s {
		s[i].Message = nil
	}
	return s
}

func TestCancelScheduled(t *testing.T) {
	newScheduled := func(t *testing.T) (*Queue, *clock.Mock, []int64) {
		q, mock := newTestQueue(t, QueueConfig{})
		var seqs []int64
		for _, id := range []string{"a", "b", "c"} {
			seq, err := q.Schedule(newMsg(id, id), 1, mock.Now().Add(time.Minute))
			require.NoError(t, err)
			seqs = append(seqs, seq)
		}
		return q, mock, seqs
	}
	tests := []struct {
		name       string
		cancel     func(seqs []int64) []int64
		wantErr    error
		wantBodies []string
	}{
		{"one", func(s []int64) []int64 { return s[1:2] }, nil, []string{"a", "c"}},
		{"several, repeated", func(s []int64) []int64 { return []int64{s[0], s[2], s[0]} }, nil, []string{"b"}},
		{"none", func([]int64) []int64 { return nil }, nil, []string{"a", "b", "c"}},
		{"unknown cancels nothing", func(s []int64) []int64 { return []int64{s[0], 99} }, ErrNotFound, []string{"a", "b", "c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, mock, seqs := newScheduled(t)
			err := q.CancelScheduled(tt.cancel(seqs)...)
			if tt.wantErr != nil {
				assert.ErrorIs(t, err, tt.wantErr)
			} else {
				assert.NoError(t, err)
			}
			mock.Add(time.Minute)
			var got []string
			for {
				d, ok := q.TryReceive(ReceiveAndDelete, 1)
				if !ok {
					break
				}
				got = append(got, body(d))
			}
			assert.Equal(t, tt.wantBodies, got)
		})
	}
}

func TestCancelActiveMessageNotFound(t *testing.T) {
	q, _ := newTestQueue(t, QueueConfig{})
	seq := mustSend(t, q, newMsg("1", "x"))
	assert.ErrorIs(t, q.CancelScheduled(seq), ErrNotFound)
	assert.Equal(t, Stats{Active: 1}, q.Stats())
}
