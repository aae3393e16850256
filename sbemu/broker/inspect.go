package broker

import (
	"time"

	"github.com/Azure/go-amqp"
)

// Stats counts a queue's messages by state, for tests and diagnostics. On
// Service Bus, ActiveMessageCount is Active + Locked.
type Stats struct {
	Active       int // receivable now
	Scheduled    int // waiting for their scheduled enqueue time
	Locked       int // delivered in peek-lock mode, not yet settled (deferred ones included)
	Deferred     int // set aside by Defer and not locked (defer.go)
	DeadLettered int // messages in this queue's dead-letter queue (0 on a dead-letter queue)
}

// Scheduled describes one scheduled message in [Queue.ScheduledMessages].
type Scheduled struct {
	Seq     int64     // the number Schedule returned; cancel with it
	At      time.Time // when it becomes receivable
	Message *amqp.Message
}

// Stats returns a snapshot of the message counts, after applying everything
// due at the current clock time.
func (q *Queue) Stats() Stats {
	b := q.b
	b.mu.Lock()
	defer b.unlock()
	q.refresh()
	s := Stats{Active: q.availableLen(), Locked: len(q.locks), Deferred: q.deferredCount}
	s.Scheduled = len(q.entries) - s.Active - s.Locked - s.Deferred
	if q.dlq != nil {
		s.DeadLettered = len(q.dlq.entries)
	}
	return s
}

// ActiveMessages returns copies of the receivable (not locked, not
// scheduled) messages in delivery order, with the system annotations a
// receiver would see.
func (q *Queue) ActiveMessages() []*amqp.Message {
	b := q.b
	b.mu.Lock()
	defer b.unlock()
	q.refresh()
	es := q.availableEntries()
	sortBySeq(es)
	out := make([]*amqp.Message, len(es))
	for i, e := range es {
		out[i] = q.deliveryMessage(e)
	}
	return out
}

// ScheduledMessages returns the still-scheduled messages in sequence order.
func (q *Queue) ScheduledMessages() []Scheduled {
	b := q.b
	b.mu.Lock()
	defer b.unlock()
	q.refresh()
	var es []*entry
	for _, e := range q.entries {
		if e.state == stateScheduled {
			es = append(es, e)
		}
	}
	sortBySeq(es)
	out := make([]Scheduled, len(es))
	for i, e := range es {
		out[i] = Scheduled{Seq: e.seq, At: e.scheduledAt, Message: CopyMessage(e.msg)}
	}
	return out
}

// refresh applies due transitions unless the broker is closed (a closed
// broker's state is frozen). b.mu must be held.
func (q *Queue) refresh() {
	if q.b.closed {
		return
	}
	now := q.b.clock.Now()
	q.advance(now)
	q.armTimer(now)
}
