package retry

import (
	"sync"
	"time"
)

// Clock is the source of time for everything the package schedules. The standard library is enough to
// implement it; github.com/benbjohnson/clock's clock.New() and *clock.Mock satisfy it as they are, so
// tests can drive retries, lock renewal and reconnects without real waiting.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

// SystemClock returns the clock of the time package, the default of every Clock option in this module.
// It reads the time package on each call, so it also works inside testing/synctest bubbles.
func SystemClock() Clock { return realClock{} }

// realClock reads the time package directly.
type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// stopper stops a pending afterFunc call; Stop reports whether it prevented the call.
type stopper interface{ Stop() bool }

// afterFunc calls f in its own goroutine once d has passed on clk, unless the returned stopper is
// stopped first. On the system clock this is time.AfterFunc, a runtime timer with no goroutine while it
// waits; an injected clock offers only After, so one goroutine waits on it instead. With timerChan it
// is where the two kinds of clock take different paths for a wait (lockrenewer.go and the receive loop's
// gathering also look at the clock's kind, each saying why).
func afterFunc(clk Clock, d time.Duration, f func()) stopper {
	if _, ok := clk.(realClock); ok {
		return time.AfterFunc(d, f)
	}
	w := &clockWait{cancel: make(chan struct{})}
	ch := clk.After(d)
	go func() {
		select {
		case <-ch:
			if w.claim() {
				f()
			}
		case <-w.cancel:
		}
	}()
	return w
}

// clockWait is an afterFunc call waiting on an injected clock.
type clockWait struct {
	once   sync.Once
	cancel chan struct{}
}

// claim reports whether the caller is the first to decide the call: to run f, or to stop it.
func (w *clockWait) claim() bool {
	won := false
	w.once.Do(func() { won = true })
	return won
}

func (w *clockWait) Stop() bool {
	if !w.claim() {
		return false
	}
	close(w.cancel)
	return true
}

// timerChan returns a channel that receives once d has passed on clk, and a function that stops the
// timer once the wait is over: on the system clock a time.Timer, stopped; an injected clock offers only
// After, whose timer is the clock's to drop.
func timerChan(clk Clock, d time.Duration) (<-chan time.Time, func() bool) {
	if _, ok := clk.(realClock); ok {
		t := time.NewTimer(d)
		return t.C, t.Stop
	}
	return clk.After(d), func() bool { return false }
}
