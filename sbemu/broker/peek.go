package broker

// Peek returns up to max messages with sequence numbers from fromSeq on, in
// sequence order, without locking or counting them: available, locked and
// scheduled messages alike, because Service Bus peek shows every message
// still in the entity. Scheduled ones carry x-opt-message-state = 2 (int64),
// which the SDK reports as MessageStateScheduled, deferred ones 1
// (MessageStateDeferred), locked or not. LockToken and LockedUntil
// are zero. max <= 0 returns nil.
func (q *Queue) Peek(fromSeq int64, max int) []*Delivery {
	if max <= 0 {
		return nil
	}
	b := q.b
	b.mu.Lock()
	defer b.unlock()
	if !b.closed {
		now := b.clock.Now()
		q.advance(now)
		defer q.armTimer(now)
	}
	es := make([]*entry, 0, min(max, q.order.len()))
	q.order.ascend(fromSeq, func(e *entry) bool {
		es = append(es, e)
		return len(es) < max
	})
	return q.peekLocked(es)
}

// PeekSession is [Queue.Peek] within one session of a session-aware
// entity: only messages whose session id is session (a session receiver's
// peek on Service Bus).
func (q *Queue) PeekSession(session string, fromSeq int64, max int) []*Delivery {
	if max <= 0 {
		return nil
	}
	b := q.b
	b.mu.Lock()
	defer b.unlock()
	if !b.closed {
		now := b.clock.Now()
		q.advance(now)
		defer q.armTimer(now)
	}
	var es []*entry
	q.order.ascendSession(session, fromSeq, func(e *entry) bool {
		es = append(es, e)
		return len(es) < max
	})
	return q.peekLocked(es)
}

// peekLocked builds the peek deliveries of es; b.mu must be held.
func (q *Queue) peekLocked(es []*entry) []*Delivery {
	out := make([]*Delivery, 0, len(es))
	for _, e := range es {
		m := q.deliveryMessage(e)
		switch {
		case e.state == stateScheduled:
			setAnnotation(m, AnnotationMessageState, messageStateScheduled)
		case e.deferred:
			setAnnotation(m, AnnotationMessageState, messageStateDeferred)
		}
		out = append(out, &Delivery{Message: m, SequenceNumber: e.seq})
	}
	return out
}
