package retry

import (
	"context"
	"sync"
	"time"
)

// expirer is what a reusableTimer ends when it fires.
type expirer interface{ expire() }

// reusableTimer is one runtime timer that bounds one thing at a time (a receive, a settle call) and is
// re-armed for the next, so that a busy loop or worker makes no timer per call. A firing that could not
// be stopped before its call ended is counted as late and ignored, so it can never end a later call,
// however many late firings are on their way at once.
type reusableTimer struct {
	t    *time.Timer
	mu   sync.Mutex
	cur  expirer // what the armed timer ends (mu)
	late int     // firings for calls that already ended, still on their way (mu)
}

// arm makes the timer end e after d.
func (rt *reusableTimer) arm(d time.Duration, e expirer) {
	rt.mu.Lock()
	rt.cur = e
	rt.mu.Unlock()
	if rt.t == nil {
		rt.t = time.AfterFunc(d, rt.fire)
		return
	}
	rt.t.Reset(d)
}

// disarm stops the timer once the call it bounds has ended.
func (rt *reusableTimer) disarm() {
	if rt.t == nil {
		return
	}
	stopped := rt.t.Stop()
	rt.mu.Lock()
	if !stopped && rt.cur != nil {
		rt.late++
	}
	rt.cur = nil
	rt.mu.Unlock()
}

func (rt *reusableTimer) fire() {
	rt.mu.Lock()
	if rt.late > 0 {
		rt.late--
		rt.mu.Unlock()
		return
	}
	e := rt.cur
	rt.cur = nil
	rt.mu.Unlock()
	if e != nil {
		e.expire()
	}
}

// settleCall is the context of one lock-bound settle call: it ends at its deadline (the settle timeout,
// cut to what is left of the lock) or when the lock is lost, and carries the settle base's values. It
// lives in the delivery and is bounded by a pooled reusable timer, so a settle costs neither a context
// nor a timer of its own, and no registration with a context every message shares.
type settleCall struct {
	values   context.Context
	deadline time.Time // zero until the call starts

	mu   sync.Mutex
	done chan struct{} // made on demand (Done)
	err  error
}

var _ context.Context = (*settleCall)(nil)

func (c *settleCall) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *settleCall) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil {
			close(c.done)
		}
	}
	return c.done
}

func (c *settleCall) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *settleCall) Value(key any) any { return c.values.Value(key) }

func (c *settleCall) String() string { return "retry.settleCall" }

// expire ends the call at its deadline.
func (c *settleCall) expire() { c.end(context.DeadlineExceeded) }

// end ends the call with err (once).
func (c *settleCall) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	if c.done != nil {
		close(c.done)
	}
}
