package broker

import (
	"sort"
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
	s.Scheduled = q.order.len() - s.Active - s.Locked - s.Deferred
	if q.dlq != nil {
		s.DeadLettered = q.dlq.order.len()
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
	for e := range q.order.entries() {
		if e.state == stateScheduled {
			es = append(es, e) // in sequence order
		}
	}
	out := make([]Scheduled, len(es))
	for i, e := range es {
		out[i] = Scheduled{Seq: e.seq, At: e.scheduledAt(), Message: e.message()}
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

// SessionSnapshot describes one session of a session-aware entity in
// [Queue.SessionSnapshots].
type SessionSnapshot struct {
	ID string
	// Active, Locked, Deferred and Scheduled count the session's messages
	// in each state, as [Stats] does for the entity.
	Active, Locked, Deferred, Scheduled int
	// LockedUntil is when the receiver holding the session loses it; zero
	// when no receiver holds it.
	LockedUntil time.Time
	// State is a copy of the session state; nil when none is set.
	State []byte
	// StateUpdated is when State was last set; zero without a state.
	StateUpdated time.Time
}

// SessionSnapshots describes, sorted by id, every session that has a
// message in any state, a receiver holding it or a state, after applying
// everything due at the current clock time. Unlike [Queue.SessionState] it
// needs no session lock: it is for tests and diagnostics, which look at a
// session without taking it from its receiver. An entity that is not
// session-aware has none.
func (q *Queue) SessionSnapshots() []SessionSnapshot {
	b := q.b
	b.mu.Lock()
	defer b.unlock()
	if !q.sessionful() {
		return nil
	}
	q.refresh()
	now := b.clock.Now()
	byID := map[string]*SessionSnapshot{}
	get := func(id string) *SessionSnapshot {
		s, ok := byID[id]
		if !ok {
			s = &SessionSnapshot{ID: id}
			byID[id] = s
		}
		return s
	}
	for id, s := range q.sessions {
		snap := get(id)
		if s.holder != 0 && now.Before(s.lockedUntil) {
			snap.LockedUntil = s.lockedUntil
		}
		if s.state != nil {
			snap.State, snap.StateUpdated = copyBytes(s.state), s.stateUpdated
		}
		if len(s.available) == 0 && s.holder == 0 && s.state == nil {
			delete(byID, id) // nothing yet: the entries below may add it back
		}
	}
	for e := range q.order.entries() {
		snap := get(e.session)
		switch e.state {
		case stateAvailable:
			snap.Active++
		case stateLocked:
			snap.Locked++
		case stateDeferred:
			snap.Deferred++
		case stateScheduled:
			snap.Scheduled++
		}
	}
	out := make([]SessionSnapshot, 0, len(byID))
	for _, s := range byID {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
