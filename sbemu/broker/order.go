package broker

import (
	"iter"
	"math"

	"github.com/google/btree"
)

// entryOrder holds a queue's stored messages in sequence-number order,
// and on a session-aware entity each session's messages in
// sequence-number order too, so that a peek from a sequence number costs
// O(log n + batch) instead of a walk over every stored message, and a
// session's peek does not look at the other sessions' messages: Service
// Bus answers a peek from a sequence number without walking the entity
// (issue 31 measured 103 s for a 250-message peek of 1M messages with the
// walk).
//
// Why a B-tree (github.com/google/btree) rather than a sorted slice:
// sequence numbers are always added at the top (a queue hands them out in
// increasing order, and a restore adds them sorted), but messages leave
// from anywhere (settled, expired, activated under a new number), so a
// slice needs either an O(n) removal or tombstones that a peek has to
// step over, and a burst of settlements in front of the peek's start
// makes that walk as long as the old one. The B-tree has neither
// worst case.
//
// It is also the only index of the entries by number: each item carries
// its entry, so a lookup by number is a descent of the tree (O(log n))
// and a peek reads the entries straight from the leaves. With a map by
// number beside it, a peek at 1M messages spent about a fifth of its time
// in the map's lookups, a cache miss per message (a CPU profile of
// BenchmarkScalePeek); the peek's CPU time fell by about a fifth at 10k
// and at 1M without the map. Memory stays about even: the map's slots
// (16 bytes each, at the 44 to 88 % load a growing map keeps) are gone,
// and the tree's items grew by the entry pointer, 8 bytes, at the half
// fill that appending at the top leaves in its nodes.
//
// b.mu guards it, as it guards the entries.
type entryOrder struct {
	all *btree.BTreeG[seqEntry]
	// sessions orders (session id, sequence number) pairs; nil on an
	// entity that is not session-aware, where PeekSession is never asked
	// for and a walk would do.
	sessions *btree.BTreeG[sessionSeq]
}

// seqEntry is one stored message under its current sequence number; the
// tree orders by seq alone, so a probe needs no entry.
type seqEntry struct {
	seq int64
	e   *entry
}

// sessionSeq is one message's place in its session, with its entry
// (the order is by session and seq alone).
type sessionSeq struct {
	session string
	seq     int64
	e       *entry
}

// orderDegree is the B-trees' degree: nodes of up to 63 items (about
// 1 KB), a common choice for small keys.
const orderDegree = 32

func newEntryOrder(sessionful bool) entryOrder {
	o := entryOrder{all: btree.NewG(orderDegree, func(a, b seqEntry) bool { return a.seq < b.seq })}
	if sessionful {
		o.sessions = btree.NewG(orderDegree, func(a, b sessionSeq) bool {
			if a.session != b.session {
				return a.session < b.session
			}
			return a.seq < b.seq
		})
	}
	return o
}

// add records e under its current sequence number.
func (o *entryOrder) add(e *entry) {
	o.all.ReplaceOrInsert(seqEntry{e.seq, e})
	if o.sessions != nil {
		o.sessions.ReplaceOrInsert(sessionSeq{e.session, e.seq, e})
	}
}

// remove forgets e's current sequence number. A message's session id
// never changes while it is stored (rule actions apply to the copy a
// subscription gets, before it is stored), so it finds the same pair add
// recorded.
func (o *entryOrder) remove(e *entry) {
	o.all.Delete(seqEntry{seq: e.seq})
	if o.sessions != nil {
		o.sessions.Delete(sessionSeq{session: e.session, seq: e.seq})
	}
}

// get is the entry stored under seq.
func (o *entryOrder) get(seq int64) (*entry, bool) {
	if o.all == nil {
		return nil, false // nothing was ever stored
	}
	it, ok := o.all.Get(seqEntry{seq: seq})
	return it.e, ok
}

// len is the number of stored entries.
func (o *entryOrder) len() int {
	if o.all == nil {
		return 0
	}
	return o.all.Len()
}

// ascend calls fn with the stored entries from sequence number from on,
// in order, until fn returns false.
func (o *entryOrder) ascend(from int64, fn func(e *entry) bool) {
	if o.all == nil {
		return // nothing was ever stored
	}
	o.all.AscendGreaterOrEqual(seqEntry{seq: from}, func(it seqEntry) bool { return fn(it.e) })
}

// entries yields every stored entry in sequence order.
func (o *entryOrder) entries() iter.Seq[*entry] {
	return func(yield func(*entry) bool) { o.ascend(math.MinInt64, yield) }
}

// ascendSession is ascend within one session. On an entity that keeps no
// session order (not session-aware) it walks every message and keeps
// those of session.
func (o *entryOrder) ascendSession(session string, from int64, fn func(e *entry) bool) {
	switch {
	case o.all == nil:
		return // nothing was ever stored
	case o.sessions == nil:
		o.ascend(from, func(e *entry) bool {
			return e.session != session || fn(e)
		})
		return
	}
	o.sessions.AscendRange(sessionSeq{session: session, seq: from}, sessionSeq{session: session, seq: math.MaxInt64},
		func(k sessionSeq) bool { return fn(k.e) })
}

// storeEntry stores e under its current sequence number; b.mu must be
// held. Every message is stored through here, so the order stays
// complete.
func (q *Queue) storeEntry(e *entry) {
	if q.order.all == nil {
		// Made here rather than in newQueue, which runs before the queue
		// knows whether it is a dead-letter queue or a topic.
		q.order = newEntryOrder(q.sessionful())
	}
	q.order.add(e)
}

// storedAs reports whether e is the entry stored under seq; b.mu must be
// held.
func (q *Queue) storedAs(seq int64, e *entry) bool {
	got, ok := q.order.get(seq)
	return ok && got == e
}

// forgetEntry is the reverse of storeEntry, for e's current sequence
// number; b.mu must be held.
func (q *Queue) forgetEntry(e *entry) {
	q.order.remove(e)
}
