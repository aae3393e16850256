package broker

import (
	"container/heap"
	"time"
)

// entryState is where a stored message is in its life cycle. A byte, so
// it packs with the entry's other small fields (see entry).
type entryState uint8

const (
	// stateScheduled: waiting for its scheduled enqueue time; invisible to
	// receivers, visible to Peek.
	stateScheduled entryState = iota + 1
	// stateAvailable: can be received.
	stateAvailable
	// stateLocked: delivered in peek-lock mode and waiting for settlement or
	// lock expiry.
	stateLocked
	// stateDeferred: set aside by [Queue.Defer]; only a receive by
	// sequence number delivers it (defer.go). Never in the timeline.
	stateDeferred
)

// entry is one stored message plus the bookkeeping the broker needs. Entries
// never leave the package; callers get copies in [Delivery] values.
//
// A million stored messages hold a million entries, so the field order
// keeps the small fields together, what only a locked message needs
// lives in lock, allocated while it is locked, a scheduled message's
// activation time is its deadline, and the heap positions are 32-bit:
// the struct is 192 bytes, in the 192 size class (160 while it held a
// pointer to the decoded message instead of the encoding and the session
// id). With the lock's fields and a scheduledAt of its own it took 80
// bytes more (BenchmarkScaleBytesPerMessage); a lock costs 64 bytes more
// while it lasts, and few messages of a large backlog are locked at once.
// Add a field next to ones of its size.
type entry struct {
	// data is the message, AMQP-encoded (encoded.go); never handed out,
	// and replaced, never changed in place, when the message changes.
	data []byte
	// session is the message's session id (its group-id), empty without
	// one; it never changes while the message is stored.
	session string
	// size is the encoded size reported by the sender, in bytes; it is
	// carried over to the dead-letter copy.
	size int

	seq        int64     // current sequence number (scheduled number while scheduled)
	enqueuedAt time.Time // acceptance time, replaced by the activation time for scheduled messages
	expiresAt  time.Time // zero: never expires
	expiryCap  time.Time // the latest expiry inherited from a topic or a forwarding source; zero: none

	// lock is the peek-lock on the message while it is in stateLocked;
	// nil otherwise (and for a locked message restored from disk, whose
	// lock did not survive the restart).
	lock *entryLock

	// deadline is when the next time-driven transition happens (activation,
	// expiry or lock loss); it is only meaningful while timeIndex >= 0,
	// but a scheduled message's stays its activation time until it
	// activates (see scheduledAt).
	deadline time.Time
	// The positions in the queue's timeline and available heaps, -1 if
	// absent; 32 bits are two billion messages a queue.
	timeIndex  int32
	availIndex int32

	// With persistence (persist.go): journaledAt is the sequence number
	// under which the journal holds this message in full (0: nowhere), and
	// msgChanged says its content changed since, so the next record must
	// carry it in full again rather than only its state.
	journaledAt int64
	// storedAt is the journal position after the record that last wrote
	// the message in full: it is on disk once that position is.
	storedAt int64

	deliveryCount uint32 // number of peek-lock deliveries so far
	state         entryState
	// deferred is set once the message was deferred: a lock on it that
	// ends without settlement returns it to stateDeferred, not to the
	// receivable messages.
	deferred   bool
	msgChanged bool
}

// scheduledAt is a scheduled message's activation time, zero for any
// other. A scheduled message waits in the timeline for exactly that
// instant (Queue.accept, the restore), and nothing else moves its
// deadline before it activates, so the deadline holds it.
func (e *entry) scheduledAt() time.Time {
	if e.state != stateScheduled {
		return time.Time{}
	}
	return e.deadline
}

// entryLock is a locked message's lock.
type entryLock struct {
	token [16]byte
	until time.Time
	// owner is the connection id passed to Receive, used by ReleaseOwner.
	owner uint64
	// sessionHolder is the session lock the message lock lives under on a
	// session-aware entity (session.go); 0 otherwise.
	sessionHolder uint64
}

// newEntry returns an entry for the encoded message data with session id
// session; encodeEntry encodes a decoded one.
func newEntry(data []byte, session string, size int) *entry {
	return &entry{data: data, session: session, size: size, timeIndex: -1, availIndex: -1}
}

// availableHeap orders receivable entries by sequence number, which is the
// FIFO order Service Bus delivers in; an abandoned message goes back to its
// original position.
type availableHeap []*entry

func (h availableHeap) Len() int           { return len(h) }
func (h availableHeap) Less(i, j int) bool { return h[i].seq < h[j].seq }
func (h availableHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].availIndex = int32(i)
	h[j].availIndex = int32(j)
}
func (h *availableHeap) Push(x any) {
	e := x.(*entry)
	e.availIndex = int32(len(*h))
	*h = append(*h, e)
}
func (h *availableHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.availIndex = -1
	return e
}

// timelineHeap orders entries by their next deadline so the queue can process
// everything that is due and arm a single timer for the earliest remainder.
type timelineHeap []*entry

func (h timelineHeap) Len() int { return len(h) }
func (h timelineHeap) Less(i, j int) bool {
	// Ties break by sequence number so messages scheduled for the same
	// instant activate in the order they were scheduled.
	if h[i].deadline.Equal(h[j].deadline) {
		return h[i].seq < h[j].seq
	}
	return h[i].deadline.Before(h[j].deadline)
}
func (h timelineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].timeIndex = int32(i)
	h[j].timeIndex = int32(j)
}
func (h *timelineHeap) Push(x any) {
	e := x.(*entry)
	e.timeIndex = int32(len(*h))
	*h = append(*h, e)
}
func (h *timelineHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.timeIndex = -1
	return e
}

// setDeadline schedules e's next time-driven transition at t; a zero t
// removes any pending one.
func (h *timelineHeap) setDeadline(e *entry, t time.Time) {
	switch {
	case t.IsZero():
		if e.timeIndex >= 0 {
			heap.Remove(h, int(e.timeIndex))
		}
	case e.timeIndex >= 0:
		e.deadline = t
		heap.Fix(h, int(e.timeIndex))
	default:
		e.deadline = t
		heap.Push(h, e)
	}
}

// earliest is the first deadline in the heap, zero when it is empty.
func (h timelineHeap) earliest() time.Time {
	if len(h) == 0 {
		return time.Time{}
	}
	return h[0].deadline
}
