package broker

import (
	"fmt"
	"time"

	"github.com/Azure/go-amqp"
)

// beginLocked starts a call on q that holds b.mu: it refuses a closed
// broker ([ErrClosed]) and a removed entity, and brings q up to date
// (expired locks returned, due messages activated) at the returned time.
// The caller re-arms the timer with q.armTimer(now) when it is done.
func (q *Queue) beginLocked() (time.Time, error) {
	b := q.b
	if b.closed {
		return time.Time{}, ErrClosed
	}
	if q.removed {
		return time.Time{}, q.removedError()
	}
	now := b.clock.Now()
	q.advance(now)
	return now, nil
}

// locked runs op on the entry locked under token after bringing q up to
// date, or returns [ErrLockLost] when the token is unknown, expired or
// already settled. It is the shared frame of every settlement.
func (q *Queue) locked(token [16]byte, op func(e *entry, now time.Time) error) error {
	b := q.b
	b.mu.Lock()
	defer b.unlock()
	// Advancing first removes locks whose time has passed, so a late settlement
	// fails with ErrLockLost even before the timer fires (or, with a mock clock,
	// when it never does).
	now, err := q.beginLocked()
	if err != nil {
		return err
	}
	// op may drop a deadline (the settled lock) or add one (the expiry of a
	// message returned to the queue), so the timer is re-armed afterwards.
	defer q.armTimer(now)
	e, ok := q.locks[token]
	if !ok {
		return ErrLockLost
	}
	return op(e, now)
}

// Complete removes a peek-locked message for good (AMQP accepted). It fails
// with [ErrLockLost] if the lock is unknown, expired or already settled, as
// Service Bus answers message-lock-lost.
//
// On an entity whose status forbids receiving it fails with
// [ErrEntityDisabled] and the lock stays held (status.go).
func (q *Queue) Complete(token [16]byte) error {
	return q.locked(token, func(e *entry, _ time.Time) error {
		if err := q.receiveAllowed(); err != nil {
			return err
		}
		q.removeEntry(e)
		return nil
	})
}

// Abandon returns a peek-locked message to its place in the queue (AMQP
// modified). The delivery already counted when the lock was taken; a message
// that used up MaxDeliveryCount goes to the dead-letter queue with reason
// "MaxDeliveryCountExceeded".
//
// properties are the modified outcome's message-annotations, which carry the
// SDK's PropertiesToModify; like Service Bus, the broker merges them into the
// message's application properties (keys that are strings or symbols; other
// keys are ignored), so the next delivery sees them.
func (q *Queue) Abandon(token [16]byte, properties map[any]any) error {
	return q.locked(token, func(e *entry, now time.Time) error {
		// Merge before returning the message: if returnLocked dead-letters it for
		// MaxDeliveryCount, the dead-letter copy carries the modified properties.
		if err := mergeProperties(e, properties); err != nil {
			return err
		}
		q.returnLocked(e, true, now)
		return nil
	})
}

// Release returns a peek-locked message the client never processed (AMQP
// released, sent by the SDK for messages that arrived after a receive call
// returned) without counting the delivery.
func (q *Queue) Release(token [16]byte) error {
	return q.locked(token, func(e *entry, now time.Time) error {
		q.returnLocked(e, false, now)
		return nil
	})
}

// DeadLetter moves a peek-locked message to the dead-letter queue (AMQP
// rejected with condition com.microsoft:dead-letter). props (the rest of the
// error info map) are merged into the application properties; reason and
// description, when non-empty, become DeadLetterReason and
// DeadLetterErrorDescription. On a dead-letter queue it fails with
// [ErrNotSupported] and the lock stays held, because Service Bus cannot
// dead-letter out of a dead-letter queue.
func (q *Queue) DeadLetter(token [16]byte, reason, description string, props map[string]any) error {
	return q.locked(token, func(e *entry, now time.Time) error {
		// Checked inside op so that an unknown or expired token still reports
		// ErrLockLost first, as it would on any other queue.
		if q.parent != nil {
			return fmt.Errorf("%w: dead-letter from %s", ErrNotSupported, q.name)
		}
		// Dead-lettering removes the message from the entity, as a
		// completion does.
		if err := q.receiveAllowed(); err != nil {
			return err
		}
		// The properties are checked before anything changes, so that
		// one without an AMQP encoding fails the call, not the move.
		if len(props) > 0 {
			if _, err := (&amqp.Message{ApplicationProperties: props}).MarshalBinary(); err != nil {
				return fmt.Errorf("broker: encoding the dead-letter properties: %w", err)
			}
		}
		// This delivery is settled, not failed (see deadLetter).
		if e.deliveryCount > 0 {
			e.deliveryCount--
		}
		q.deadLetter(e, reason, description, props, now)
		return nil
	})
}

// RenewLock extends each lock by LockDuration from now and returns the new
// expiry times in argument order. It is all-or-nothing: if any token is
// unknown or expired it returns [ErrLockLost] and renews none, matching the
// management operation's single status code.
func (q *Queue) RenewLock(tokens ...[16]byte) ([]time.Time, error) {
	b := q.b
	b.mu.Lock()
	defer b.unlock()
	now, err := q.beginLocked()
	if err != nil {
		return nil, err
	}
	defer q.armTimer(now)
	es := make([]*entry, len(tokens))
	for i, t := range tokens {
		e, ok := q.locks[t]
		if !ok {
			return nil, ErrLockLost
		}
		es[i] = e
	}
	// An expired lock cannot be revived here: advance above already returned its
	// message to the queue and dropped the token. Renewal leaves deliveryCount
	// alone, because Service Bus counts deliveries, not renewals.
	until := now.Add(q.cfg.LockDuration)
	out := make([]time.Time, len(es))
	for i, e := range es {
		if e.lock.sessionHolder != 0 {
			// A lock under a session lock lasts as long as that one and is
			// renewed with it (session.go); the SDKs do not even send this.
			out[i] = e.lock.until
			continue
		}
		e.lock.until = until
		q.timeline.setDeadline(e, until)
		out[i] = until
	}
	return out, nil
}

// mergeApplicationProperties copies string-keyed (or symbol-keyed) entries of
// props into m's application properties.
//
// application-properties may only have string keys (part 3 section 3.2.5),
// while the modified outcome's annotations may arrive with symbol keys; keys
// of other types cannot be represented and are skipped. Values are copied so
// the stored message shares nothing with the caller's map.
func mergeApplicationProperties(m *amqp.Message, props map[any]any) {
	for k, v := range props {
		var key string
		switch k := k.(type) {
		case string:
			key = k
		case amqp.Symbol:
			key = string(k)
		default:
			continue
		}
		if m.ApplicationProperties == nil {
			m.ApplicationProperties = make(map[string]any, len(props))
		}
		m.ApplicationProperties[key] = copyValue(v)
	}
}

// mergeProperties merges props into the application properties of e's
// message ([mergeApplicationProperties]); without props e is left as it
// is. It fails, changing nothing, when a value has no AMQP encoding.
func mergeProperties(e *entry, props map[any]any) error {
	if len(props) == 0 {
		return nil
	}
	return e.rewrite(func(m *amqp.Message) { mergeApplicationProperties(m, props) })
}
