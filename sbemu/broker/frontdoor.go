package broker

import (
	"fmt"
	"time"

	"github.com/Azure/go-amqp"
)

// The in-process front door. Package retrytest serves the same broker to
// unit tests without AMQP: it calls [Queue.Send], [Queue.TryReceive] and
// the settlements directly, the way the AMQP server does, so both doors
// share one implementation of the semantics. Unit tests create many
// brokers and never close them, and run inside testing/synctest bubbles
// that must end with no goroutine left, so that door cannot use the
// broker's wake-up goroutine (wakeup.go); it drives time itself with
// [Broker.Advance] instead.

// NewInProcess is [New] for a caller that drives time itself: the broker
// runs no goroutine, so it needs no [Broker.Close] and leaves nothing
// behind when it becomes garbage. Every call still applies what is due at
// the clock's current time first, exactly as on a broker from New; what
// is missing is only the wake-up of a [Queue.Receive] already blocked
// when a scheduled message falls due or a lock expires. Such a caller
// waits with [Queue.TryReceive] and a timer set for the deadline
// [Broker.Advance] returns.
//
// Persistence needs the journal's goroutine and a Close, so Options.DataDir
// is refused here.
func NewInProcess(opts Options, queues ...QueueConfig) (*Broker, error) {
	if opts.DataDir != "" {
		return nil, fmt.Errorf("%w: an in-process broker keeps no data directory (DataDir)", ErrInvalidConfig)
	}
	b, err := New(opts, queues...)
	if err != nil {
		return nil, err
	}
	// Stop the wake-up goroutine New started and give the broker a fresh
	// done channel, so it stays open. wakeupsDone stays closed, so a later
	// Close returns at once.
	b.mu.Lock()
	close(b.done)
	b.mu.Unlock()
	<-b.wakeupsDone
	b.mu.Lock()
	b.done = make(chan struct{})
	b.mu.Unlock()
	return b, nil
}

// Advance applies every transition due at the clock's current time in
// every entity (scheduled messages activate, expired messages expire,
// expired message and session locks return their messages, a topic fans
// out) and returns the earliest deadline still pending anywhere, session
// locks included: the next instant at which Advance would change
// something. Zero means nothing is pending, or the broker is closed.
func (b *Broker) Advance() time.Time {
	b.mu.Lock()
	defer b.unlock() // journals what the transitions changed, on a persistent broker
	if b.closed {
		return time.Time{}
	}
	now := b.clock.Now()
	for _, q := range b.mainQueues() {
		q.advance(now)
	}
	var next time.Time
	for _, q := range b.allQueues() {
		// A session lock's expiry (session.go) is a deadline too: it
		// returns the session's messages and frees it for another receiver.
		for _, t := range []time.Time{q.timeline.earliest(), q.sessionDeadline} {
			if !t.IsZero() && (next.IsZero() || t.Before(next)) {
				next = t
			}
		}
	}
	return next
}

// CompleteDelivery is [Queue.Complete] that also returns the message it
// removed, as a [Delivery] with the system annotations and with
// Header.DeliveryCount counting every delivery including the settled one.
// A test kit records completed messages with it without keeping copies of
// everything it hands out. The message is the stored one, which the broker
// no longer references, decoded once.
func (q *Queue) CompleteDelivery(token [16]byte) (*Delivery, error) {
	var d *Delivery
	err := q.locked(token, func(e *entry, _ time.Time) error {
		q.removeEntry(e)
		m := e.message()
		if m.Header == nil {
			m.Header = &amqp.MessageHeader{}
		}
		m.Header.DeliveryCount = e.deliveryCount
		setAnnotation(m, AnnotationSequenceNumber, e.seq)
		setAnnotation(m, AnnotationEnqueuedTime, e.enqueuedAt)
		d = &Delivery{Message: m, SequenceNumber: e.seq}
		return nil
	})
	return d, err
}
