package broker

import (
	"container/heap"
	"slices"
)

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
	return q.peekLocked(smallestFrom(q.entries, fromSeq, max, nil))
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
	return q.peekLocked(smallestFrom(q.entries, fromSeq, max, func(e *entry) bool { return sessionID(e.msg) == session }))
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

// smallestFrom returns, in ascending order, the up to n smallest sequence
// numbers of entries that are at least from (and that keep accepts, when
// keep is not nil). It keeps a max-heap of n
// candidates instead of sorting every entry, so a small peek of a large
// queue costs O(entries · log n) under the broker lock, not a full sort.
func smallestFrom(entries map[int64]*entry, from int64, n int, keep func(*entry) bool) []int64 {
	if n <= 0 {
		return nil
	}
	h := make(seqMaxHeap, 0, min(n, len(entries)))
	for s, e := range entries {
		switch {
		case s < from:
		case keep != nil && !keep(e):
		case len(h) < n:
			heap.Push(&h, s)
		case s < h[0]:
			h[0] = s
			heap.Fix(&h, 0)
		}
	}
	out := []int64(h)
	slices.Sort(out)
	return out
}

// seqMaxHeap is a max-heap of sequence numbers: the root is the largest
// candidate, the first to give way to a smaller one.
type seqMaxHeap []int64

func (h seqMaxHeap) Len() int           { return len(h) }
func (h seqMaxHeap) Less(i, j int) bool { return h[i] > h[j] }
func (h seqMaxHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *seqMaxHeap) Push(x any)        { *h = append(*h, x.(int64)) }
func (h *seqMaxHeap) Pop() any {
	old := *h
	v := old[len(old)-1]
	*h = old[:len(old)-1]
	return v
}
