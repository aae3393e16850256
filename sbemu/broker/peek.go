package broker

import (
	"sort"
)

// Peek returns up to max messages with sequence numbers from fromSeq on, in
// sequence order, without locking or counting them: available, locked and
// scheduled messages alike, because Service Bus peek shows every message
// still in the entity. Scheduled ones carry x-opt-message-state = 2 (int64),
// which the SDK reports as MessageStateScheduled. LockToken and LockedUntil
// are zero. max <= 0 returns nil.
func (q *Queue) Peek(fromSeq int64, max int) []*Delivery {
	if max <= 0 {
		return nil
	}
	b := q.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		now := b.clock.Now()
		q.advance(now)
		defer q.armTimer(now)
	}
	seqs := make([]int64, 0, len(q.entries))
	for s := range q.entries {
		if s >= fromSeq {
			seqs = append(seqs, s)
		}
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	if len(seqs) > max {
		seqs = seqs[:max]
	}
	out := make([]*Delivery, 0, len(seqs))
	for _, s := range seqs {
		e := q.entries[s]
		m := q.deliveryMessage(e)
		if e.state == stateScheduled {
			setAnnotation(m, AnnotationMessageState, messageStateScheduled)
		}
		out = append(out, &Delivery{Message: m, SequenceNumber: s})
	}
	return out
}
