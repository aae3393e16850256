package broker

import "time"

// The broker wakes itself for the deadlines nobody asks about: a scheduled
// message falling due, a lock expiring or a message expiring while every
// receiver is parked in [Queue.Receive]. Every other call applies what is
// due lazily (each one advances its queue to Clock.Now first), so the
// wake-up is only there for receivers that are already waiting.
//
// One goroutine per broker waits on one Clock.After channel set for the
// earliest deadline of all queues. The armed instant only ever moves
// earlier between wake-ups: a later deadline, or a deadline that went away
// (a completed lock), leaves it alone, and the goroutine then wakes at most
// once too early and re-arms for what is really next. That keeps the hot
// path (receive, complete) free of timer churn.

// armSlack is how far the clock may move while a wake-up is being armed
// before the broker re-arms from the new time. After takes a duration, so
// a fake clock advanced by a test between Now and After would otherwise
// fire late by the step; a real clock moves by far less than this.
const armSlack = time.Millisecond

// armAt makes sure the wake-up fires no later than next (zero: no
// deadline); b.mu must be held. now is the time the caller advanced to.
func (b *Broker) armAt(next, now time.Time) {
	if next.IsZero() || b.closed {
		return
	}
	if !b.wakeAt.IsZero() && !next.Before(b.wakeAt) {
		return // an earlier or equal wake-up is already armed
	}
	b.wakeAt = next
	// Bounded: a fake clock is moved by a test a handful of times at most
	// while this runs, a real one never by armSlack.
	for range 8 {
		b.wakeC = b.clock.After(max(next.Sub(now), 0))
		later := b.clock.Now()
		if later.Sub(now) <= armSlack {
			break
		}
		now = later
	}
	// The goroutine may be waiting on an older, later channel: make it pick
	// up the new one.
	select {
	case b.rearm <- struct{}{}:
	default:
	}
}

// runWakeups is the broker's wake-up goroutine; it returns when the broker
// closes.
func (b *Broker) runWakeups() {
	defer close(b.wakeupsDone)
	for {
		b.mu.Lock()
		c := b.wakeC
		b.unlock()
		// A nil channel (nothing armed) blocks until re-armed or closed.
		select {
		case <-c:
			b.wake()
		case <-b.rearm:
		case <-b.done:
			return
		}
	}
}

// wake applies everything due in every queue, which hands newly available
// messages to parked receivers, and arms the next wake-up.
func (b *Broker) wake() {
	b.mu.Lock()
	defer b.unlock()
	if b.closed {
		return
	}
	b.wakeC, b.wakeAt = nil, time.Time{}
	now := b.clock.Now()
	for _, q := range b.mainQueues() {
		q.advance(now)
	}
	b.armAll(now)
}
