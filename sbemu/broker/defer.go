package broker

import (
	"fmt"
	"time"
)

// Deferral, as Service Bus does it (learn.microsoft.com,
// service-bus-messaging/message-deferral.md): a receiver that holds a lock
// can set the message aside. A deferred message stays in the entity, in its
// place in sequence order, but is never delivered by an ordinary receive
// again; only a receive by its sequence number
// (com.microsoft:receive-by-sequence-number) gets it back, under a new lock.
// Settling that lock works like any other: complete removes it, dead-letter
// moves it, defer sets it aside again, and abandon, release, lock expiry or
// a dropped connection return it to the deferred set, not to the receivable
// messages (the azservicebus live test TestDeferredMessages/Abandon: an
// abandoned deferred message is still there to peek, its delivery count one
// higher). Peek shows deferred messages with x-opt-message-state = 1, which
// the SDK reports as MessageStateDeferred.
//
// Expiry: "Deferred messages aren't expired and automatically moved to a
// dead-letter queue until a client app attempts to receive them using an
// API and the sequence number. [...] When a client tries to retrieve a
// deferred message, it's checked for expired condition and moved to a
// dead-letter queue if it's already expired" (message-deferral.md). So a
// deferred message has no deadline in the timeline; [Queue.ReceiveDeferred]
// checks its time-to-live and expires it (dead-lettering it with
// DeadLetterOnExpiration) instead of delivering it.

// messageStateDeferred is the x-opt-message-state value the SDK maps to
// MessageStateDeferred (azservicebus message.go).
const messageStateDeferred int64 = 1

// Defer sets a peek-locked message aside (the SDK's DeferMessage: AMQP
// modified with undeliverable-here, or update-disposition "defered"). Like
// [Queue.Abandon], properties are merged into the message's application
// properties. The delivery already counted when the lock was taken. It
// fails with [ErrLockLost] if the lock is unknown, expired or settled.
func (q *Queue) Defer(token [16]byte, properties map[any]any) error {
	return q.locked(token, func(e *entry, _ time.Time) error {
		if err := mergeProperties(e, properties); err != nil {
			return err
		}
		q.setDeferred(e)
		return nil
	})
}

// setDeferred ends e's lock, if any, and puts it among the deferred
// messages: in the queue's entries, in neither the available heap nor the
// timeline.
func (q *Queue) setDeferred(e *entry) {
	q.journalEntry(e.seq, e)
	switch e.state {
	case stateLocked:
		q.dropLock(e)
	case stateDeferred:
		q.deferredCount-- // counted again below
	}
	q.deferredCount++
	if e.availIndex >= 0 {
		q.removeAvailable(e)
	}
	q.timeline.setDeadline(e, time.Time{})
	e.deferred = true
	e.state = stateDeferred
	e.lock = nil
}

// ReceiveDeferred receives deferred messages by sequence number, in
// argument order, as com.microsoft:receive-by-sequence-number does. In
// [PeekLock] mode each is locked for LockDuration on behalf of owner and
// its delivery counts; settling the lock goes through the usual calls
// ([Queue.Complete], [Queue.Defer], ...). In [ReceiveAndDelete] mode each
// is removed as it is returned.
//
// It is all-or-nothing for numbers that are not deferred messages: if any
// is unknown, not deferred or locked by an earlier receive, it returns
// [ErrNotFound] naming it and delivers nothing. A deferred message whose
// time-to-live has passed expires now (dead-lettered with
// DeadLetterOnExpiration) and counts as not found. Duplicate numbers are
// received once.
func (q *Queue) ReceiveDeferred(mode Mode, owner uint64, seqs ...int64) ([]*Delivery, error) {
	return q.receiveDeferred(mode, owner, nil, seqs)
}

// receiveDeferred is [Queue.ReceiveDeferred], limited to the messages of
// session *session when session is not nil (a session receiver's
// management link; "" is a session id like any other), which owner must
// hold.
func (q *Queue) receiveDeferred(mode Mode, owner uint64, session *string, seqs []int64) ([]*Delivery, error) {
	b := q.b
	b.mu.Lock()
	defer b.unlock()
	now, err := q.beginLocked()
	if err != nil {
		return nil, err
	}
	defer q.armTimer(now)
	if err := q.receiveAllowed(); err != nil {
		return nil, err
	}
	var held *sessionState
	if session != nil {
		if held, _, err = q.heldByOwner(*session, owner); err != nil {
			return nil, err
		}
	}
	es := make([]*entry, 0, len(seqs))
	seen := make(map[int64]bool, len(seqs))
	var expired []*entry
	var missing int64
	found := true
	for _, s := range seqs {
		if seen[s] {
			continue
		}
		seen[s] = true
		e, ok := q.order.get(s)
		if !ok || e.state != stateDeferred || (session != nil && e.session != *session) {
			if found {
				missing, found = s, false
			}
			continue
		}
		if q.expired(e, now) {
			expired = append(expired, e)
			if found {
				missing, found = s, false
			}
			continue
		}
		es = append(es, e)
	}
	// Expiry is checked when a receive asks for the message, whether or
	// not the rest of the request succeeds.
	for _, e := range expired {
		q.expire(e, now)
	}
	if !found {
		return nil, fmt.Errorf("%w: no deferred message with sequence number %d in %s", ErrNotFound, missing, q.name)
	}
	out := make([]*Delivery, 0, len(es))
	for _, e := range es {
		d := &Delivery{SequenceNumber: e.seq, Message: q.deliveryMessage(e), storedAt: q.storedPosition(e)}
		setAnnotation(d.Message, AnnotationMessageState, messageStateDeferred)
		if mode == ReceiveAndDelete {
			q.removeEntry(e)
		} else {
			q.lockEntry(e, d, owner, now)
			if held != nil {
				q.lockUnderSession(e, d, held)
			}
		}
		out = append(out, d)
	}
	return out, nil
}
