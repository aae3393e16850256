package sbemu

import (
	"context"
	"errors"
	"sync"

	"github.com/Azure/go-amqp"

	"github.com/sbretry/retry/sbemu/broker"
)

// outgoing is one message ready to be transferred to a client.
type outgoing struct {
	// payload is the encoded message, already marshalled so its size is
	// known before any frame is sent; tag is the delivery tag.
	payload []byte
	tag     []byte
	// lock is set for queue deliveries: the broker lock behind the message.
	lock *broker.Delivery
}

// deliverySource feeds a sending link: the broker queue for receivers, the
// reply outbox for request/response nodes.
type deliverySource interface {
	// next blocks until a message is available or ctx is done.
	next(ctx context.Context) (*outgoing, error)
	// tryNext returns a message only if one is available now (drain).
	tryNext() (*outgoing, bool)
	// putBack returns a message that could not be sent.
	putBack(o *outgoing)
}

// startDelivering starts the link's delivery goroutine.
func (l *link) startDelivering() {
	var src deliverySource
	switch l.kind {
	case kindQueueOut:
		src = &queueSource{l: l, q: l.queue, owner: l.s.c.id, session: l.sessionLock}
	case kindReplyOut:
		src = l.replies
	default:
		return
	}
	// The goroutine is counted in the connection's wait group, so teardown
	// waits for it (and for the putBack of its pending message) before the
	// broker releases the connection's locks.
	c := l.s.c
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		l.deliverLoop(src)
		// After deliverLoop put its pending message back, so the session's
		// next receiver finds it.
		if l.sessionLock != nil {
			l.sessionLock.Release()
		}
	}()
}

// deliverLoop sends messages while the client grants credit. It is the only
// code that consumes credit, so the reader never blocks on the broker or on
// the client's window. On drain it sends what is available right now and
// then spends the remaining credit by advancing the delivery count.
func (l *link) deliverLoop(src deliverySource) {
	// pending is a message taken from the source but not yet transferred;
	// whatever path ends the loop, the deferred putBack returns it.
	var pending *outgoing
	defer func() {
		if pending != nil {
			src.putBack(pending)
		}
	}()
	// A session receiver's link ends with its session lock (sessions.go);
	// nil, never ready, for other links.
	var sessionLost <-chan struct{}
	if l.sessionLock != nil {
		sessionLost = l.sessionLock.Lost()
	}
	for {
		l.mu.Lock()
		if l.txCredit == 0 && !l.drain && pending != nil {
			// Credit was withdrawn after the message was taken. Hand it
			// back rather than hold its lock while nobody may receive it.
			l.mu.Unlock()
			src.putBack(pending)
			pending = nil
			l.mu.Lock()
		}
		for l.txCredit == 0 && !l.drain {
			l.mu.Unlock()
			select {
			case <-l.wake:
			case <-l.ctx.Done():
				return
			case <-sessionLost:
				if l.ctx.Err() == nil {
					l.forceDetach(condSessionLockLost, "sbemu: the session lock of "+l.sessionLock.SessionID()+" was lost")
				}
				return
			}
			l.mu.Lock()
		}
		if l.drain {
			l.mu.Unlock()
			var ok bool
			if pending, ok = l.drainNow(src, pending); !ok {
				return
			}
			continue
		}
		if pending == nil {
			// recvCancel is published under l.mu so handleFlow can interrupt this
			// receive when credit is withdrawn or a drain arrives.
			rctx, cancel := context.WithCancel(l.ctx)
			l.recvCancel = cancel
			l.mu.Unlock()
			o, err := src.next(rctx)
			l.mu.Lock()
			l.recvCancel = nil
			l.mu.Unlock()
			cancel()
			if err != nil {
				if l.ctx.Err() != nil {
					return
				}
				if errors.Is(err, context.Canceled) {
					continue // credit withdrawn or drain requested
				}
				// A source that failed (a broker whose journal stopped, a closed broker) delivers
				// nothing more: detach with the error, so the client sees it and can reconnect,
				// instead of leaving the link attached and silent.
				l.log.Info("sbemu: delivery source failed", "err", err)
				l.forceDetach(deliveryFailure(err))
				return
			}
			if o == nil {
				continue
			}
			pending = o
			continue // re-check credit: it may have been withdrawn meanwhile
		}
		// Credit is positive and a message is waiting: spend one credit.
		l.txCredit--
		l.txDeliveryCount++
		l.mu.Unlock()
		if err := l.sendOne(pending); err != nil {
			return
		}
		pending = nil
	}
}

// drainNow serves a drain request: it sends pending and whatever the source
// has right now while credit lasts, then advances the delivery count by the
// unused credit and tells the client with a drain flow. It returns the
// message still pending (if the link stopped) and false when the link is
// gone.
func (l *link) drainNow(src deliverySource, pending *outgoing) (*outgoing, bool) {
	for {
		l.mu.Lock()
		hasCredit := l.txCredit > 0
		l.mu.Unlock()
		if !hasCredit {
			break // never take a message that cannot be sent
		}
		if pending == nil {
			o, ok := src.tryNext()
			if !ok {
				break
			}
			pending = o
		}
		l.mu.Lock()
		if l.txCredit == 0 {
			l.mu.Unlock()
			break // credit withdrawn meanwhile; pending waits for more
		}
		l.txCredit--
		l.txDeliveryCount++
		l.mu.Unlock()
		if err := l.sendOne(pending); err != nil {
			return nil, false
		}
		pending = nil
	}
	l.s.mu.Lock()
	l.mu.Lock()
	// Section 2.6.7: a drain consumes all remaining credit by advancing the
	// delivery count; the flow below with drain=true tells the client the
	// drain is complete, which is what the SDK waits for.
	l.txDeliveryCount += l.txCredit
	l.txCredit = 0
	l.drain = false
	dc := l.txDeliveryCount
	l.mu.Unlock()
	l.flowLocked(dc, 0, true)
	l.s.mu.Unlock()
	return pending, l.ctx.Err() == nil
}

// sendOne transfers o. Queue deliveries in peek-lock mode are tracked for
// the client's disposition; in receive-and-delete mode (pre-settled) the
// emulator completes the lock itself once the transfer is queued, so a
// message is never lost between the broker and the socket.
func (l *link) sendOne(o *outgoing) error {
	// For peek-lock the delivery is tracked before its first frame is queued
	// (see transmit), so a disposition can never race ahead of the record.
	settled := l.preSettled()
	var track *sentDelivery
	if o.lock != nil && !settled {
		track = &sentDelivery{link: l, queue: l.queue, token: o.lock.LockToken}
	}
	if err := l.s.transmit(l.ctx, l, o.payload, o.tag, settled, track); err != nil {
		if o.lock != nil {
			// The message never reached the socket queue: release it without
			// counting the delivery, since the client never saw it.
			_ = l.queue.Release(o.lock.LockToken)
		}
		return err
	}
	if o.lock != nil && settled {
		if err := l.queue.Complete(o.lock.LockToken); err != nil {
			l.log.Info("sbemu: completing receive-and-delete delivery", "err", err)
		}
	}
	return nil
}

// queueSource takes messages from a broker queue. Every message is taken in
// peek-lock mode under the connection's owner id, even for
// receive-and-delete links, so that a message is only removed once its
// transfer has been handed to the writer.
type queueSource struct {
	l       *link
	q       *broker.Queue
	owner   uint64
	session *broker.SessionLock // a session receiver's lock; nil otherwise
}

// next blocks in the broker until a message is due; ctx is canceled by
// link teardown or by handleFlow when credit is withdrawn.
func (s *queueSource) next(ctx context.Context) (*outgoing, error) {
	d, err := s.receive(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.waitStored(ctx, d); err != nil {
		return nil, err
	}
	return s.wrap(d), nil
}

// waitStored holds a delivery back until its message is on disk
// ([Config.DataDir]; at once otherwise), so no client sees a message that
// a crash would take back. If that fails the message goes back uncounted.
func (s *queueSource) waitStored(ctx context.Context, d *broker.Delivery) error {
	if !s.l.s.c.em.persistent {
		return nil
	}
	err := s.l.s.c.em.broker.WaitStored(ctx, d)
	if err != nil {
		_ = s.q.Release(d.LockToken)
	}
	return err
}

// tryNext serves drain: a message that fails to encode was dead-lettered
// by wrap and counts as "nothing available".
func (s *queueSource) tryNext() (*outgoing, bool) {
	d, ok := s.tryReceive()
	if !ok {
		return nil, false
	}
	if err := s.waitStored(s.l.ctx, d); err != nil {
		return nil, false
	}
	o := s.wrap(d)
	return o, o != nil
}

// putBack releases the lock uncounted (AMQP released semantics): the
// message was never transferred, so it must not move closer to
// MaxDeliveryCount.
func (s *queueSource) putBack(o *outgoing) {
	if o.lock != nil {
		_ = s.q.Release(o.lock.LockToken)
	}
}

// wrap encodes a broker delivery. The SDK only fills DeliveryCount and TTL
// when the message has a properties section, so one is always present. A
// message that cannot be encoded is dead-lettered rather than retried
// forever.
func (s *queueSource) wrap(d *broker.Delivery) *outgoing {
	m := d.Message
	if m.Properties == nil {
		m.Properties = &amqp.MessageProperties{}
	}
	if d.LockToken != ([16]byte{}) {
		// Service Bus also names the lock token in the delivery annotation
		// x-opt-lock-token (a uuid), which the SDKs prefer to the delivery tag
		// (azservicebus message.go, lockTokenDeliveryAnnotation; its live test
		// TestSender_SendAMQPMessageWithMultipleByteSlicesInData expects it).
		if m.DeliveryAnnotations == nil {
			m.DeliveryAnnotations = amqp.Annotations{}
		}
		m.DeliveryAnnotations[lockTokenAnnotation] = amqp.UUID(d.LockToken)
	}
	payload, err := marshalDelivery(m)
	if err != nil {
		s.l.log.Error("sbemu: encoding delivery", "seq", d.SequenceNumber, "err", err)
		_ = s.q.DeadLetter(d.LockToken, "sbemu:EncodingFailed", err.Error(), nil)
		return nil
	}
	return &outgoing{payload: payload, tag: lockTokenToDeliveryTag(d.LockToken), lock: d}
}

// lockTokenAnnotation is the delivery annotation that carries a peek-lock
// delivery's lock token.
const lockTokenAnnotation = "x-opt-lock-token"

// lockTokenToDeliveryTag converts an RFC 4122 lock token to the .NET GUID
// byte order Service Bus uses for delivery tags: the first three fields are
// little-endian. The SDK swaps them back to get ReceivedMessage.LockToken
// (message.go lockTokenFromMessageTag), so the swap is its own inverse.
func lockTokenToDeliveryTag(token [16]byte) []byte {
	t := token
	t[0], t[1], t[2], t[3] = t[3], t[2], t[1], t[0]
	t[4], t[5] = t[5], t[4]
	t[6], t[7] = t[7], t[6]
	return t[:]
}

// replyOutbox queues encoded replies for a request/response node's reply
// link. Pushing never blocks the reader.
type replyOutbox struct {
	// mu guards the fields below. items is FIFO so replies go out in
	// request order; tag numbers replies so each has a distinct delivery
	// tag (8 bytes, big-endian counter).
	mu     sync.Mutex
	items  []*outgoing
	notify chan struct{}
	tag    uint64
}

// newReplyOutbox creates an empty outbox; notify has capacity 1 so push
// never blocks and repeated pushes coalesce into one wakeup.
func newReplyOutbox() *replyOutbox {
	return &replyOutbox{notify: make(chan struct{}, 1)}
}

// push queues one encoded reply message.
func (r *replyOutbox) push(payload []byte) {
	r.mu.Lock()
	r.tag++
	tag := []byte{byte(r.tag >> 56), byte(r.tag >> 48), byte(r.tag >> 40), byte(r.tag >> 32),
		byte(r.tag >> 24), byte(r.tag >> 16), byte(r.tag >> 8), byte(r.tag)}
	r.items = append(r.items, &outgoing{payload: payload, tag: tag})
	r.mu.Unlock()
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// tryNext pops the oldest reply without blocking.
func (r *replyOutbox) tryNext() (*outgoing, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.items) == 0 {
		return nil, false
	}
	o := r.items[0]
	r.items = r.items[1:]
	return o, true
}

// next blocks until a reply is queued or ctx is done; it re-checks the
// items after every wakeup because notify only says "maybe non-empty".
func (r *replyOutbox) next(ctx context.Context) (*outgoing, error) {
	for {
		if o, ok := r.tryNext(); ok {
			return o, nil
		}
		select {
		case <-r.notify:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// putBack requeues a reply at the front.
func (r *replyOutbox) putBack(o *outgoing) {
	r.mu.Lock()
	// At the front, so a reply held back by missing credit keeps its place
	// ahead of later replies.
	r.items = append([]*outgoing{o}, r.items...)
	r.mu.Unlock()
}
