package retry

import (
	"context"
	"sync"
	"time"
)

// idleWatch keeps one receive loop's idle window (see idleProbeInterval) with one timer that a busy
// loop never touches: a message restarts the window by moving its start (touch), and the timer, when it
// fires early, re-arms itself for what is left. When the window has passed it ends the receive in
// flight (errIdle), or, when none is, signals due for the loop waiting for a slot. It stays because the
// paired benchmark showed a timer per receive (and per wait for a slot) among the dearest things the
// consumer did next to the SDK (BENCHMARKS.md, "Primitives kept"); with it a busy loop makes about one
// timer operation per idle window.
type idleWatch struct {
	clk    Clock
	due    chan struct{} // the window passed while no receive was in flight
	mu     sync.Mutex
	quiet  time.Time               // the start of the window: the last message or successful probe
	cancel context.CancelCauseFunc // ends the receive in flight; nil when none is
	timer  stopper                 // nil when not armed
}

func newIdleWatch(clk Clock, now time.Time) *idleWatch {
	w := &idleWatch{clk: clk, due: make(chan struct{}, 1)}
	w.touch(now)
	return w
}

// touch restarts the window at now.
func (w *idleWatch) touch(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.quiet = now
	if w.timer == nil {
		w.timer = afterFunc(w.clk, idleProbeInterval, w.fire)
	}
}

// passed reports whether the window has passed at now.
func (w *idleWatch) passed(now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return now.Sub(w.quiet) >= idleProbeInterval
}

// left is what is left of the window at now.
func (w *idleWatch) left(now time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return max(idleProbeInterval-now.Sub(w.quiet), 0)
}

func (w *idleWatch) fire() {
	w.mu.Lock()
	if left := idleProbeInterval - w.clk.Now().Sub(w.quiet); left > 0 {
		w.timer = afterFunc(w.clk, left, w.fire) // a message restarted the window meanwhile
		w.mu.Unlock()
		return
	}
	w.timer = nil
	cancel := w.cancel
	w.cancel = nil
	if cancel == nil {
		select {
		case w.due <- struct{}{}:
		default:
		}
	}
	w.mu.Unlock()
	if cancel != nil {
		cancel(errIdle)
	}
}

// begin makes the end of the window end the receive that cancel cancels; false if the window has
// already passed (a signal for it is then dropped).
func (w *idleWatch) begin(cancel context.CancelCauseFunc) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.clk.Now().Sub(w.quiet) >= idleProbeInterval {
		select {
		case <-w.due:
		default:
		}
		return false
	}
	w.cancel = cancel
	return true
}

// end says that the receive has returned.
func (w *idleWatch) end() {
	w.mu.Lock()
	w.cancel = nil
	w.mu.Unlock()
}

// stop stops the timer when the loop ends.
func (w *idleWatch) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
}
