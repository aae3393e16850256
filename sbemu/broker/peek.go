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
	seqs := make([]int64, 0, min(max, len(q.entries)))
	q.order.ascend(fromSeq, func(seq int64) bool {
		seqs = append(seqs, seq)
		return len(seqs) < max
	})
	return q.peekLocked(seqs)
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
	var seqs []int64
	keep := func(seq int64) bool { return sessionID(q.entries[seq].msg) == session }
	q.order.ascendSession(session, fromSeq, keep, func(seq int64) bool {
		seqs = append(seqs, seq)
		return len(seqs) < max
	})
	return q.peekLocked(seqs)
}

// peekLocked builds the peek deliveries of seqs; b.mu must be held.
func (q *Queue) peekLocked(seqs []int64) []*Delivery {
	out := make([]*Delivery, 0, len(seqs))
	for _, s := range seqs {
		e := q.entries[s]
		m := q.deliveryMessage(e)
		switch {
		case e.state == stateScheduled:
			setAnnotation(m, AnnotationMessageState, messageStateScheduled)
		case e.deferred:
			setAnnotation(m, AnnotationMessageState, messageStateDeferred)
		}
		out = append(out, &Delivery{Message: m, SequenceNumber: s})
	}
	return out
}
