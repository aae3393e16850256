package retry

import (
	"sync"
	"time"
)

// renewals is a processor's schedule of lock renewals: the locks being kept in one list, oldest first
// (each from keepLock to stop, except while its renewal call is in flight), and one timer for all of
// them, armed for the earliest renewal due. A lock with renewal disabled, or over, is listed without a
// renewal, so that a shutdown that gives up finds every call in flight (abandon). It stays for its measured
// gain: with a runtime timer per lock (time.AfterFunc at receive, Stop at settle), arming and stopping
// the timers took 4.4 % of the consumer's CPU in BenchmarkPaired's success case, the SDK's many timers
// making each timer operation a heap update; with the schedule, 0.5 % (BENCHMARKS.md, "Primitives kept
// and removed"). A message settled within its first renewal interval, nearly every one, costs two list
// updates under one mutex and no timer operation.
//
// The timer is not moved when a lock leaves the list (its message was settled) while others remain: it
// fires at the time it was armed for, finds nothing due, and re-arms for the earliest lock then listed,
// so that a busy processor touches it about once per renewal interval. Locks mostly enter in the order they come due,
// but not always (lock durations and renewal retries differ), so a firing looks at every listed lock.
type renewals struct {
	clk        Clock
	mu         sync.Mutex
	head, tail *lockKeeper
	renewing   int       // how many listed locks renew
	timer      stopper   // armed for armedAt; nil when not armed
	armedAt    time.Time // zero when not armed
	// gen counts the armings: a firing that was already on its way when its timer was replaced or
	// stopped sees a newer generation and does nothing, so that only one timer is ever live.
	gen uint64
}

// add lists lk: for a renewal at due if renews, else only so that abandon finds it (renewal is
// disabled, or the lock is over).
func (s *renewals) add(lk *lockKeeper, due time.Time, renews bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	lk.due, lk.renews, lk.prev, lk.next, lk.listed = due, renews, s.tail, nil, true
	if s.tail != nil {
		s.tail.next = lk
	} else {
		s.head = lk
	}
	s.tail = lk
	if renews {
		s.renewing++
	}
	if renews && (s.armedAt.IsZero() || due.Before(s.armedAt)) {
		s.armLocked(due)
	}
}

// abandon ends the broker calls in flight of every listed lock (lockKeeper.cancelCalls): the settle
// base ended, a shutdown gave up. The consumer calls it then, once, instead of every call registering
// with that context, which all messages share: that
// registration cost 3 to 4 % of CPU per message in BenchmarkPaired (BENCHMARKS.md, "Primitives kept
// and removed"). A lock off the list meanwhile, for a renewal call, does the same when that call
// returns (lockKeeper.renew).
func (s *renewals) abandon() {
	s.mu.Lock()
	var listed []*lockKeeper
	for lk := s.head; lk != nil; lk = lk.next {
		listed = append(listed, lk)
	}
	s.mu.Unlock()
	for _, lk := range listed {
		lk.cancelCalls()
	}
}

// remove takes lk out of the list, if it is listed. On an injected clock the timer is stopped once
// no listed lock renews, so that an idle processor leaves no goroutine waiting on that clock; on the system
// clock it is left to fire (a runtime timer costs nothing while it waits), so that a processor whose
// list keeps emptying between messages does not re-arm it for each.
func (s *renewals) remove(lk *lockKeeper) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if lk.listed {
		s.unlinkLocked(lk)
	}
	if _, system := s.clk.(realClock); !system && s.renewing == 0 && s.timer != nil {
		s.timer.Stop()
		s.timer, s.armedAt = nil, time.Time{}
		s.gen++
	}
}

// armLocked points the timer at due.
func (s *renewals) armLocked(due time.Time) {
	if s.timer != nil {
		s.timer.Stop()
	}
	s.armedAt = due
	s.gen++
	gen := s.gen
	s.timer = afterFunc(s.clk, max(due.Sub(s.clk.Now()), 0), func() { s.fire(gen) })
}

// fire starts the renewals that are due, each in a goroutine of its own for its one broker call, and
// re-arms the timer for the earliest lock still listed.
func (s *renewals) fire(gen uint64) {
	s.mu.Lock()
	if gen != s.gen {
		s.mu.Unlock() // replaced or stopped while this firing was on its way
		return
	}
	s.timer, s.armedAt = nil, time.Time{}
	now := s.clk.Now()
	var due []*lockKeeper
	var next time.Time
	for lk := s.head; lk != nil; {
		following := lk.next
		switch {
		case !lk.renews:
		case !lk.due.After(now):
			s.unlinkLocked(lk)
			lk.calls.Add(1) // under the list's mutex: stop, which removes lk first, then waits for it
			due = append(due, lk)
		case next.IsZero() || lk.due.Before(next):
			next = lk.due
		}
		lk = following
	}
	if !next.IsZero() {
		s.armLocked(next)
	}
	s.mu.Unlock()
	for _, lk := range due {
		go lk.renew()
	}
}

func (s *renewals) unlinkLocked(lk *lockKeeper) {
	if lk.renews {
		s.renewing--
	}
	if lk.prev != nil {
		lk.prev.next = lk.next
	} else {
		s.head = lk.next
	}
	if lk.next != nil {
		lk.next.prev = lk.prev
	} else {
		s.tail = lk.prev
	}
	lk.prev, lk.next, lk.listed = nil, nil, false
}
