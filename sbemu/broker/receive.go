package broker

import (
	"context"
	"fmt"
	"time"

	"github.com/Azure/go-amqp"
	"github.com/google/uuid"
)

// Mode is the receive mode of a link, chosen by the client.
type Mode int

// The AMQP server takes every message in PeekLock, even for receive-and-delete
// links, and completes the lock once the transfer is queued, so a message is
// never lost between the broker and the socket; ReceiveAndDelete serves direct
// callers such as tests.
const (
	// PeekLock delivers a message under a lock; it stays in the queue until
	// completed, and comes back if abandoned, released or the lock expires.
	PeekLock Mode = iota
	// ReceiveAndDelete removes the message as it is delivered; there is no
	// lock and nothing to settle.
	ReceiveAndDelete
)

// String names the mode for logs and test output.
func (m Mode) String() string {
	switch m {
	case PeekLock:
		return "PeekLock"
	case ReceiveAndDelete:
		return "ReceiveAndDelete"
	}
	return "Mode(?)"
}

// Delivery is one message handed to a receiver (or to a peek). Message is the
// caller's own copy, ready to marshal: Header.DeliveryCount is the number of
// earlier deliveries (the SDK adds one), and the annotations carry
// x-opt-sequence-number (int64), x-opt-enqueued-time (time.Time), in
// peek-lock x-opt-locked-until (time.Time), and on dead-letter queues
// x-opt-deadletter-source (string) and x-opt-enqueue-sequence-number (int64).
type Delivery struct {
	// Message is a deep copy the caller may mutate freely.
	Message *amqp.Message
	// LockToken identifies the lock for settlement and renewal: random
	// UUID v4 bytes in RFC 4122 order (the server converts to the .NET GUID
	// order the SDK uses for delivery tags). Zero in ReceiveAndDelete mode
	// and for peeked messages.
	LockToken [16]byte
	// LockedUntil is when the lock expires; zero without a lock.
	LockedUntil time.Time
	// SequenceNumber is the message's sequence number in this queue.
	SequenceNumber int64

	// storedAt is the journal position the message is on disk after; see
	// [Broker.WaitStored].
	storedAt int64
}

// Receive returns the next message in sequence order, blocking until one is
// available (including a scheduled message falling due or a lock expiring as
// the clock advances), ctx is done (ctx.Err() is returned) or the broker is
// closed ([ErrClosed]). A ctx already done returns its error without taking
// a message, so a cancelled caller never loses one.
//
// In [PeekLock] mode the message is locked for LockDuration on behalf of
// owner, an id the server chooses per connection so [Broker.ReleaseOwner]
// can return the locks of a dropped connection. Each peek-lock delivery
// counts towards MaxDeliveryCount.
func (q *Queue) Receive(ctx context.Context, mode Mode, owner uint64) (*Delivery, error) {
	return q.receiveWith(ctx, func(now time.Time) (*Delivery, error) {
		if q.sessionful() {
			return nil, fmt.Errorf("%w: it is not possible for an entity that requires sessions to create a non-sessionful message receiver (%s)", ErrSessionRequired, q.name)
		}
		return q.take(mode, owner, now), nil
	})
}

// receiveWith is the blocking loop of [Queue.Receive] and
// [SessionLock.Receive]: take runs under b.mu with q advanced to now and
// returns a delivery, nil to wait, or an error to give up.
func (q *Queue) receiveWith(ctx context.Context, take func(now time.Time) (*Delivery, error)) (*Delivery, error) {
	b := q.b
	// Each pass starts from scratch: a wake-up only says something changed, and
	// another receiver may already have taken the message.
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		b.mu.Lock()
		if b.closed {
			b.unlock()
			return nil, ErrClosed
		}
		if q.removed {
			b.unlock()
			return nil, q.removedError()
		}
		if err := q.receiveAllowed(); err != nil {
			b.unlock()
			return nil, err
		}
		now := b.clock.Now()
		q.advance(now)
		d, err := take(now)
		if err != nil || d != nil {
			q.armTimer(now)
			b.unlock()
			return d, err
		}
		// Arm before sleeping, so a scheduled message falling due or a lock
		// expiring wakes this receiver even if no other call arrives.
		q.armTimer(now)
		q.waiters++
		// notify is read under b.mu and makeAvailable closes it before replacing
		// it, so a message that arrives after Unlock still wakes this receiver.
		wake := q.notify
		b.unlock()

		// b.done is closed by Close; the next pass then returns ErrClosed.
		select {
		case <-wake:
		case <-ctx.Done():
		case <-b.done:
		}
		// waiters only changes under b.mu, so makeAvailable closes and replaces
		// notify only while someone is actually waiting.
		b.mu.Lock()
		q.waiters--
		b.unlock()
	}
}

// TryReceive is the non-blocking [Queue.Receive]: it returns false at once
// when no message is available or the broker is closed. The server uses it to
// serve link credit without parking a goroutine.
func (q *Queue) TryReceive(mode Mode, owner uint64) (*Delivery, bool) {
	b := q.b
	b.mu.Lock()
	defer b.unlock()
	if b.closed || q.removed || q.sessionful() || q.receiveAllowed() != nil {
		return nil, false
	}
	now := b.clock.Now()
	q.advance(now)
	// Deferred: take adds a lock deadline, so the timer is armed afterwards.
	defer q.armTimer(now)
	d := q.take(mode, owner, now)
	return d, d != nil
}

// take removes the first available message and delivers it; nil if none.
// b.mu must be held and q advanced to now.
func (q *Queue) take(mode Mode, owner uint64, now time.Time) *Delivery {
	if len(q.available) == 0 {
		return nil
	}
	e := q.available[0]
	if q.parent != nil {
		q.parent.accessedAt = now
	} else {
		q.accessedAt = now
	}
	d := &Delivery{SequenceNumber: e.seq, Message: q.deliveryMessage(e), storedAt: q.storedPosition(e)}
	// Without a lock there is nothing to settle or return, so the entry goes at
	// once: at-most-once delivery, the trade-off of this mode on Service Bus.
	if mode == ReceiveAndDelete {
		q.removeEntry(e)
		return d
	}
	q.removeAvailable(e)
	q.lockEntry(e, d, owner, now)
	return d
}

// lockEntry locks e for owner and fills in d's lock; b.mu must be held and
// e out of the available heap.
func (q *Queue) lockEntry(e *entry, d *Delivery, owner uint64, now time.Time) {
	q.journalEntry(e.seq, e)
	// The delivery counts when the lock is taken, not when it is settled, so a
	// consumer that crashes still moves the message towards MaxDeliveryCount;
	// Release takes the count back. Deliveries from a dead-letter queue do not
	// count: Service Bus leaves a dead-lettered message's DeliveryCount as the
	// dead-lettering left it however often it is received, abandoned or lets
	// its lock expire there (Azure/azure-sdk-for-net#53437; the Go SDK's live
	// test TestMessageSettlementUsingReceiver reads 2 before and after an
	// abandon on the dead-letter queue). A dead-letter queue has no
	// MaxDeliveryCount for the count to approach.
	if q.countsDeliveries() {
		e.deliveryCount++
	}
	if e.state == stateDeferred {
		q.deferredCount--
	}
	e.state = stateLocked
	l := &entryLock{owner: owner, token: newLockToken()}
	// A v4 collision is practically impossible, but a duplicate key would
	// silently orphan the other lock, so draw again until the token is unique.
	for _, taken := q.locks[l.token]; taken; _, taken = q.locks[l.token] {
		l.token = newLockToken()
	}
	l.until = now.Add(q.cfg.LockDuration)
	e.lock = l
	q.locks[l.token] = e
	q.timeline.setDeadline(e, l.until)

	d.LockToken = l.token
	d.LockedUntil = l.until
	// The SDK type-asserts x-opt-locked-until to time.Time for LockedUntil;
	// any other type would panic it.
	setAnnotation(d.Message, AnnotationLockedUntil, l.until)
}

// dropLock forgets e's lock: its token, and its place among the locks of
// its session (session.go); b.mu must be held.
func (q *Queue) dropLock(e *entry) {
	l := e.lock
	if l == nil {
		return // restored from disk as locked: the lock did not survive
	}
	e.lock = nil
	delete(q.locks, l.token)
	if l.sessionHolder != 0 {
		if s, ok := q.sessions[e.session]; ok {
			delete(s.locked, e)
		}
	}
}

// removeAvailable takes e out of the receivable set without forgetting it.
func (q *Queue) removeAvailable(e *entry) {
	if e.availIndex >= 0 {
		q.popAvailable(e)
	}
	q.timeline.setDeadline(e, time.Time{})
}

// deliveryMessage builds the message handed out for e, decoded from the
// stored encoding (so the caller's own, body included), with the header
// delivery count and the system annotations the SDK reads.
func (q *Queue) deliveryMessage(e *entry) *amqp.Message {
	m := e.message()
	if m.Header == nil {
		m.Header = &amqp.MessageHeader{}
	}
	// take calls this before counting the current delivery, so the header holds
	// earlier deliveries only; the SDK adds one for ReceivedMessage.DeliveryCount.
	m.Header.DeliveryCount = e.deliveryCount
	setAnnotation(m, AnnotationSequenceNumber, e.seq)
	setAnnotation(m, AnnotationEnqueuedTime, e.enqueuedAt)
	return m
}

// newLockToken returns random UUID v4 bytes.
func newLockToken() [16]byte {
	return [16]byte(uuid.New())
}
