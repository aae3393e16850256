package retry

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/sbretry/retry/envelope"
)

// Limits of the in-process memory of decided outcomes (see flights).
const (
	// maxRememberedOutcomes bounds how many unsettled outcomes a processor remembers at once, in all:
	// an outcome is forgotten early only while more than this many are outstanding, the oldest first.
	maxRememberedOutcomes = 10000
	// minRememberOutcome is the shortest time an unsettled outcome is remembered; the redelivery it waits
	// for comes when the lock runs out (at most 5 minutes on Service Bus), or at once after a drop.
	minRememberOutcome = 10 * time.Minute
)

// flightKey identifies a message on its entity across redeliveries: the broker's sequence number is
// unique per entity and stays the same when the message is redelivered, as do its MessageID and enqueue
// time. Those two are part of the key too, so that a processor shared by several entities without an
// EntityPath can never mistake one entity's message for another's with the same sequence number.
type flightKey struct {
	entity    string
	seq       int64
	messageID string
	enqueued  int64
}

// keyOf returns msg's flight key; ok is false for a message without a sequence number.
func keyOf(entity string, msg *azservicebus.ReceivedMessage) (flightKey, bool) {
	if msg.SequenceNumber == nil {
		return flightKey{}, false
	}
	k := flightKey{entity: entity, seq: *msg.SequenceNumber, messageID: msg.MessageID}
	if msg.EnqueuedTime != nil {
		k.enqueued = msg.EnqueuedTime.UnixNano()
	}
	return k, true
}

// flight is one delivery being handled (or, once its call returned with the outcome unsettled, the
// remembered decision for the redelivery to come).
type flight struct {
	key  flightKey
	lock *lockKeeper

	mu    sync.Mutex
	over  bool          // the delivery's handling has ended
	done  chan struct{} // closed when it has; made on demand (finished), as few deliveries are awaited
	dec   *decision
	prior *flight // the earlier delivery this one superseded, until that one is done (fs.mu)

	// The outcome memory's list, guarded by its mutex (see outcomeMemory).
	remembered   time.Time // when the remembered outcome is forgotten
	older, newer *flight
	listed       bool // in the memory's list: its outcome counts against the bound
}

// flights is the processor's registry of deliveries by message. It guarantees that one consumer never
// runs the same message in two handlers at once: a redelivery that arrives while an earlier delivery of
// the same message is still being handled (its lock died with a connection, and its settle is stuck)
// supersedes it, waits for it to end, and inherits its decision. The memory is per process; across
// processes, the deterministic retry MessageIDs and the broker's duplicate detection do the same job.
//
// It is split into shards by message, each with its own lock, so that the workers registering and
// removing deliveries do not all wait for one lock; every delivery of a message, and so every chain, is
// in one shard. The remembered outcomes are counted and aged in one list for all shards (mem), so that
// the bound holds for the total however the messages fall into shards, and only outcomes still waiting
// for their redelivery count: one that a redelivery has taken over leaves the list at once.
type flights struct {
	shards [flightShards]flightShard
	mem    outcomeMemory
}

// flightShards is how many shards the registry has.
const (
	flightShardBits = 4
	flightShards    = 1 << flightShardBits
)

// shard returns the shard of key: the top bits of a multiplicative hash of the sequence number, so that
// sequence numbers in any stride (a subscription whose filter takes every 16th message of a topic)
// spread over the shards.
func (fs *flights) shard(key flightKey) *flightShard {
	return &fs.shards[(uint64(key.seq)*0x9E3779B97F4A7C15)>>(64-flightShardBits)]
}

// enter registers f (a zero flight) as a new delivery of key and returns the earlier delivery of the
// same message, if one is still in flight or remembered.
func (fs *flights) enter(f *flight, key flightKey, lk *lockKeeper, now time.Time) (prior *flight) {
	fs.forget(fs.mem.expired(now))
	return fs.shard(key).enter(f, key, lk, &fs.mem)
}

// priorOf returns the delivery f superseded, if f still links to it.
func (fs *flights) priorOf(f *flight) *flight { return fs.shard(f.key).priorOf(f) }

// leave ends f's handling (see flightShard.leave).
func (fs *flights) leave(f *flight, unsettled bool, now time.Time, ttl time.Duration) {
	fs.forget(fs.shard(f.key).leave(f, unsettled, now, ttl, &fs.mem))
}

// forget removes the outcomes the memory let go of from their shards, unless a redelivery has taken
// their place meanwhile. It takes each one's shard lock, so it is called with none held.
func (fs *flights) forget(gone []*flight) {
	for _, old := range gone {
		sh := fs.shard(old.key)
		sh.mu.Lock()
		if sh.byKey[old.key] == old {
			delete(sh.byKey, old.key)
		}
		sh.mu.Unlock()
	}
}

// flightShard is one shard of the registry.
type flightShard struct {
	mu    sync.Mutex
	byKey map[flightKey]*flight
}

// enter registers f; a remembered outcome it supersedes leaves mem's count, as this delivery now
// carries it (it inherits it, or is itself remembered when it leaves).
func (fs *flightShard) enter(f *flight, key flightKey, lk *lockKeeper, mem *outcomeMemory) (prior *flight) {
	f.key, f.lock = key, lk
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.byKey == nil {
		fs.byKey = make(map[flightKey]*flight)
	}
	prior = fs.byKey[key]
	if prior != nil {
		mem.drop(prior)
	}
	f.prior = prior
	fs.byKey[key] = f
	return prior
}

func (fs *flightShard) priorOf(f *flight) *flight {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return f.prior
}

// leave ends f's handling. An unsettled decision is remembered in mem until now+ttl for the
// redelivery; anything else is forgotten. A delivery already superseded by a newer one leaves that one
// in place. It returns the outcomes mem let go of meanwhile, for flights.forget.
//
// A delivery that leaves without a decision of its own (it gave up waiting for its earlier delivery,
// whose lock had died, say) must not break the chain: if that earlier one is still running, the entry
// goes back to it, so its decision is remembered when it ends and the next redelivery waits for it;
// if it has ended, its decision becomes this delivery's.
func (fs *flightShard) leave(f *flight, unsettled bool, now time.Time, ttl time.Duration, mem *outcomeMemory) (gone []*flight) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	defer f.end()
	prior := f.prior
	if prior == nil && !unsettled {
		// The common case, settled with no earlier delivery: nothing to remember or hand back.
		if fs.byKey[f.key] == f {
			delete(fs.byKey, f.key)
		}
		return nil
	}
	f.mu.Lock()
	if f.dec == nil && prior != nil {
		if prior.ended() {
			f.dec = prior.decision()
			f.prior = nil
		} else if fs.byKey[f.key] == f {
			fs.byKey[f.key] = prior // the earlier delivery runs on: keep the chain
			f.mu.Unlock()
			return nil
		}
	} else {
		f.prior = nil
	}
	f.mu.Unlock()
	if fs.byKey[f.key] != f {
		return nil
	}
	f.mu.Lock()
	keep := unsettled && f.dec != nil
	f.mu.Unlock()
	if !keep {
		delete(fs.byKey, f.key)
		return nil
	}
	// Listed under the shard lock, so that a redelivery entering meanwhile finds it listed and drops it.
	return mem.remember(f, now, now.Add(ttl))
}

// outcomeMemory lists the remembered outcomes of all shards, oldest first, as an intrusive doubly
// linked list so that an outcome taken over by its redelivery leaves it at once. Its mutex is taken
// after a shard's, never before: the outcomes it lets go of are removed from their shards by the
// caller (flights.forget) once it holds no lock. Only unsettled outcomes pass through it, so the hot
// path (a delivery settled at its first try) never takes its lock.
type outcomeMemory struct {
	mu             sync.Mutex
	oldest, newest *flight
	n              int
	// listed counts the outcomes in the list, and due is when the oldest is to be forgotten (Unix
	// nanoseconds): enter reads both without the lock to tell whether anything has expired.
	listed atomic.Int64
	due    atomic.Int64
}

// remember lists f, whose outcome is forgotten at until, and returns what had to go to make room
// (beyond maxRememberedOutcomes, the oldest) or had expired by now.
func (m *outcomeMemory) remember(f *flight, now, until time.Time) (gone []*flight) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f.remembered, f.listed, f.older, f.newer = until, true, m.newest, nil
	if m.newest != nil {
		m.newest.newer = f
	} else {
		m.oldest = f
	}
	m.newest = f
	m.n++
	for m.oldest != nil && (m.n > maxRememberedOutcomes || !now.Before(m.oldest.remembered)) {
		gone = append(gone, m.unlinkLocked(m.oldest))
	}
	m.publishLocked()
	return gone
}

// drop takes f out of the list, if it is listed: its outcome is no longer waiting to be inherited.
func (m *outcomeMemory) drop(f *flight) {
	if m.listed.Load() == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if f.listed {
		m.unlinkLocked(f)
		m.publishLocked()
	}
}

// expired takes out and returns the outcomes whose time has passed at now; without taking the lock
// when none has.
func (m *outcomeMemory) expired(now time.Time) (gone []*flight) {
	if m.listed.Load() == 0 || now.UnixNano() < m.due.Load() {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for m.oldest != nil && !now.Before(m.oldest.remembered) {
		gone = append(gone, m.unlinkLocked(m.oldest))
	}
	m.publishLocked()
	return gone
}

// len is how many outcomes are listed.
func (m *outcomeMemory) len() int { return int(m.listed.Load()) }

// unlinkLocked takes f out of the list and returns it.
func (m *outcomeMemory) unlinkLocked(f *flight) *flight {
	if f.older != nil {
		f.older.newer = f.newer
	} else {
		m.oldest = f.newer
	}
	if f.newer != nil {
		f.newer.older = f.older
	} else {
		m.newest = f.older
	}
	f.older, f.newer, f.listed = nil, nil, false
	m.n--
	return f
}

// publishLocked updates the counters read without the lock.
func (m *outcomeMemory) publishLocked() {
	m.listed.Store(int64(m.n))
	if m.oldest != nil {
		m.due.Store(m.oldest.remembered.UnixNano())
	}
}

// end marks f's handling as ended.
func (f *flight) end() {
	f.mu.Lock()
	f.over = true
	if f.done != nil {
		close(f.done)
	}
	f.mu.Unlock()
}

// ended reports whether f's handling has ended.
func (f *flight) ended() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.over
}

// finished returns a channel that is closed when f's handling has ended.
func (f *flight) finished() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done == nil {
		f.done = make(chan struct{})
		if f.over {
			close(f.done)
		}
	}
	return f.done
}

// supersede tells f that a redelivery of its message has arrived: its lock is gone (the broker
// redelivers only once a lock has ended), so its handler is cancelled and its lock-bound settle calls
// are abandoned.
func (f *flight) supersede() {
	f.lock.lose()
}

// setDecision records what f decided.
func (f *flight) setDecision(d *decision) {
	f.mu.Lock()
	f.dec = d
	f.mu.Unlock()
}

// decision returns f's decision (nil if none), to be inherited once f is done.
func (f *flight) decision() *decision {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dec
}

// markScheduled records that d's copy was scheduled as seq, so that whoever inherits d only completes.
func (f *flight) markScheduled(d *decision, seq int64) {
	f.mu.Lock()
	d.scheduled, d.seq = true, seq
	f.mu.Unlock()
}

// decisionKind is what the processor decided to do with a delivery once its handler returned.
type decisionKind int

const (
	decideComplete decisionKind = iota + 1
	decideRetry
	decideDeadLetter
	decideDiscard
)

// decision is an outcome decided but perhaps not yet applied. When its settle fails (the lock died with
// a connection, a complete timed out), the broker redelivers the message; the redelivery then applies
// the same decision with its own lock instead of running the handler again. That is how finished work
// is not redone and how a scheduled retry copy stays the only successor of its attempt.
type decision struct {
	kind       decisionKind
	env        *envelope.Envelope
	handlerErr error
	// The details of a retry or a dead-letter; a success, the common case, needs neither.
	*retryPlan
	*deadLetterPlan
}

// retryPlan is a retry decision's copy, when it is due, and whether it has been scheduled yet.
type retryPlan struct {
	copyMsg   *azservicebus.Message
	nextTry   int
	delay     time.Duration
	at        time.Time
	errText   string
	scheduled bool
	seq       int64
	// held: the copy holds the message for the outage breaker, at the same attempt (see hold).
	held bool
}

// deadLetterPlan is a dead-letter decision's reason, description and the properties added to the
// dead letter.
type deadLetterPlan struct {
	reason string
	desc   string
	props  map[string]any
}
