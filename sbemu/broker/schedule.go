package broker

import (
	"fmt"
	"time"

	"github.com/Azure/go-amqp"
)

// Schedule stores m to become receivable at at, as the management operation
// com.microsoft:schedule-message does, and returns the sequence number that
// identifies it for [Queue.CancelScheduled]. When it activates it gets a new
// sequence number, like on Service Bus. The stored message is annotated with
// x-opt-scheduled-enqueue-time = at so receivers see ScheduledEnqueueTime.
// A time not in the future enqueues at once. Size limit and duplicate
// detection apply as for [Queue.Send]; a duplicate returns the original's
// sequence number and stores nothing.
func (q *Queue) Schedule(m *amqp.Message, size int, at time.Time) (int64, error) {
	seq, _, err := q.accept(m, size, at, true, false)
	return seq, err
}

// ScheduleOwned is [Queue.Schedule] for a message the caller hands over,
// as [Queue.SendOwned] is for [Queue.Send]: m is stored as it is, and the
// caller must not use it afterwards.
func (q *Queue) ScheduleOwned(m *amqp.Message, size int, at time.Time) (int64, error) {
	seq, _, err := q.accept(m, size, at, true, true)
	return seq, err
}

// CancelScheduled removes scheduled messages by the sequence numbers
// [Queue.Schedule] or [Queue.Send] returned. It is all-or-nothing: if any
// number is not a still-scheduled message (unknown, already activated or
// already cancelled) it returns [ErrNotFound] naming it and cancels nothing,
// so a caller never has to guess which part succeeded.
func (q *Queue) CancelScheduled(seqs ...int64) error {
	b := q.b
	b.mu.Lock()
	defer b.unlock()
	if b.closed {
		return ErrClosed
	}
	now := b.clock.Now()
	q.advance(now)
	defer q.armTimer(now)
	es := make([]*entry, 0, len(seqs))
	for _, s := range seqs {
		e, ok := q.order.get(s)
		if !ok || e.state != stateScheduled {
			return fmt.Errorf("%w: no scheduled message with sequence number %d", ErrNotFound, s)
		}
		es = append(es, e)
	}
	for _, e := range es {
		if e.state == stateScheduled { // the same number may be listed twice
			q.removeEntry(e)
		}
	}
	return nil
}
