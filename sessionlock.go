package retry

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// sessionLock keeps a session's lock from accept until the session is released: it renews it every
// renewal interval (half the lock duration by default) on the local clock, during handlers and holds
// alike. The messages received in the session are locked under the session lock, so they need no
// renewal of their own. When the lock is lost (a renewal says so, or renewals kept failing until the
// lock ran out on the local clock) ctx is cancelled with [ErrLockLost]: the handler's context, the
// hold's wait and every settle derive from it.
//
// Through the Go SDK (azservicebus v1.11) a lost session lock is not always seen here: when no other
// receiver has taken the session, the SDK's link recovery locks it again for the same receiver and the
// renewal succeeds, while the messages received under the old lock have been given back (their
// delivery counted). The consumer then learns it when the message's settle fails, bounded by
// SettleTimeout; it leaves the message unsettled and releases the session, so the order still holds
// and the handler runs again (at least once). e2e's TestSessionLockLostThroughTheSDK shows it.
type sessionLock struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when the renewing goroutine has exited
}

// errSessionReleased is the cause of a session lock's context once the consumer released the session.
var errSessionReleased = errors.New("retry: session released")

// minRenewRetry is the shortest wait before another try after a failed renewal.
const minRenewRetry = 100 * time.Millisecond

// fallbackSessionLock is the lock duration assumed when neither Options.LockDuration nor the accepted
// receiver's LockedUntil gives one: Service Bus's default. The first renewal then comes at once and
// its LockedUntil tells the real one.
const fallbackSessionLock = 30 * time.Second

// keepSessionLock starts renewing recv's session lock, accepted at acceptedAt. The lock duration is
// Options.LockDuration, else inferred from LockedUntil at accept (and after each renewal).
func (r *sessionRun) keepSessionLock(recv SessionReceiver, acceptedAt time.Time) *sessionLock {
	cfg := r.sc.cfg
	ctx, cancel := context.WithCancelCause(r.settleBase)
	lk := &sessionLock{ctx: ctx, cancel: cancel, done: make(chan struct{})}
	dur, first := cfg.lockDuration, time.Duration(-1)
	if dur <= 0 {
		dur = recv.LockedUntil().Sub(acceptedAt)
	}
	if dur <= 0 {
		dur, first = fallbackSessionLock, 0
	}
	r.workers.Add(1)
	go func() {
		defer r.workers.Done()
		defer close(lk.done)
		r.renewSessionLock(lk, recv, acceptedAt, dur, first)
	}()
	return lk
}

// renewInterval is the wait between renewals of a lock of dur: Options.LockRenewInterval, else half
// of dur, never more than two thirds of it and never less than minRenewRetry.
func (c *config) renewInterval(dur time.Duration) time.Duration {
	iv := c.lockRenewInterval
	if iv <= 0 {
		iv = dur / 2
	}
	return max(min(iv, dur*2/3), minRenewRetry)
}

// renewSessionLock is the renewing loop: it runs until the session is released or its lock lost.
// first, if not negative, is the wait before the first renewal (instead of the interval).
func (r *sessionRun) renewSessionLock(lk *sessionLock, recv SessionReceiver, since time.Time, dur, first time.Duration) {
	cfg := r.sc.cfg
	clk := cfg.clock
	deadline := since.Add(dur) // when the lock ends on the local clock unless renewed
	wait := cfg.renewInterval(dur)
	if first >= 0 {
		wait = first
	}
	for {
		ch, stopTimer := timerChan(clk, max(wait, 0))
		select {
		case <-ch:
		case <-lk.ctx.Done():
			stopTimer()
			return
		}
		now := clk.Now()
		if !now.Before(deadline) {
			r.loseSessionLock(lk, recv, errors.New("retry: the session lock ran out before a renewal succeeded"))
			return
		}
		rctx, cancel := context.WithTimeout(lk.ctx, min(cfg.settleTimeout, deadline.Sub(now)))
		err := recv.RenewSessionLock(rctx, nil)
		cancel()
		if lk.ctx.Err() != nil {
			return // released (or the shutdown gave up) meanwhile
		}
		if err == nil {
			if cfg.lockDuration <= 0 {
				// A LockedUntil that did not move (clocks that disagree) must not shrink the interval
				// towards a busy loop: a grant shorter than a second is not believed.
				if granted := recv.LockedUntil().Sub(now); granted >= time.Second {
					dur = granted
				}
			}
			deadline = now.Add(dur)
			wait = cfg.renewInterval(dur)
			continue
		}
		if code, ok := sdkCode(err); ok && code == azservicebus.CodeLockLost {
			r.loseSessionLock(lk, recv, err)
			return
		}
		// Another failure (a dropped link the SDK is recovering, a timeout): try again, sooner, while
		// the lock lasts.
		cfg.logger.Debug("session lock renewal failed; trying again", slog.String("session_id", recv.SessionID()), errAttr(err))
		wait = max(min(cfg.renewInterval(dur), deadline.Sub(clk.Now())/2), minRenewRetry)
	}
}

// loseSessionLock ends lk with ErrLockLost, which cancels the handler and stops the session.
func (r *sessionRun) loseSessionLock(lk *sessionLock, recv SessionReceiver, why error) {
	r.sc.cfg.logger.Warn("session lock lost; its messages go back to the session", slog.String("session_id", recv.SessionID()), errAttr(why))
	lk.cancel(ErrLockLost)
}

// lost reports whether the lock has ended (lost, or the shutdown gave up), and why.
func (lk *sessionLock) lost() (bool, error) {
	if lk.ctx.Err() == nil {
		return false, nil
	}
	return true, context.Cause(lk.ctx)
}

// release stops renewing and waits for the renewing goroutine to exit.
func (lk *sessionLock) release() {
	lk.cancel(errSessionReleased)
	<-lk.done
}
