package retry

import (
	"context"
	"log/slog"
	"time"
)

// sessionLock keeps a session's lock from accept until the session is released, with the lock keeper
// of message locks (lockrenewer.go) on the processor's renewal schedule: renewed every renewal interval
// (half the lock duration by default) on the local clock, during handlers and holds alike. The messages
// received in the session are locked under the session lock, so they need no renewal of their own.
// ctx is what the session's calls derive from: the handler's context, the hold's wait and every settle.
// When the lock ends, ctx is cancelled with the keeper's cause: [ErrLockLost] when it was lost (a
// renewal said so, or renewals kept failing until the lock ran out on the local clock), errSettled
// once the session is released.
//
// Through the Go SDK (azservicebus v1.11) a lost session lock is not always seen here: when no other
// receiver has taken the session, the SDK's link recovery locks it again for the same receiver and the
// renewal succeeds, while the messages received under the old lock have been given back (their
// delivery counted). The consumer then learns it when the message's settle fails, bounded by
// SettleTimeout; it leaves the message unsettled and releases the session, so the order still holds.
// When this consumer takes the session back, the message's decided outcome is applied without running
// the handler again (flights.go); another process runs it again (at least once). e2e's
// TestSessionLockLostThroughTheSDK shows it.
type sessionLock struct {
	ctx    context.Context
	keeper lockKeeper
}

// fallbackSessionLock is the lock duration assumed when neither Options.LockDuration nor the accepted
// receiver's LockedUntil gives one: Service Bus's default. The first renewal then comes at once and
// its LockedUntil tells the real one.
const fallbackSessionLock = 30 * time.Second

// keepSessionLock starts keeping recv's session lock, accepted at acceptedAt. The lock duration is
// Options.LockDuration, else inferred from LockedUntil at accept (and after each renewal).
func (r *sessionRun) keepSessionLock(recv *serialReceiver, acceptedAt time.Time) *sessionLock {
	cfg := r.sc.cfg
	ctx, cancel := context.WithCancelCause(r.settleBase)
	lk := &sessionLock{ctx: ctx}
	k := &lk.keeper
	k.base, k.values, k.cfg, k.sched = r.settleBase, context.WithoutCancel(r.settleBase), cfg, &r.sc.proc.renewals
	k.session = recv.SessionID()
	// The lock's expiry after a renewal is read in the renewal's own turn on the receiver (and handed to
	// granted on the same goroutine): the keeper asks for the grant while it holds its mutex, and
	// waiting there for the worker's turn could deadlock with a worker whose call ends the lock.
	var renewedUntil time.Time
	k.renewCall = func(ctx context.Context) error {
		until, err := recv.renewSessionLock(ctx)
		renewedUntil = until
		return err
	}
	first := time.Duration(-1)
	k.dur = cfg.lockDuration
	if k.dur <= 0 {
		// As for a message lock (grantedLockDuration): an estimate outside what Service Bus grants
		// means clocks that disagree, and a grant shorter than a second is not believed, so that a
		// LockedUntil that did not move cannot shrink the interval towards a busy loop.
		k.granted = func(now time.Time) time.Duration {
			if g := renewedUntil.Sub(now); g >= minInferredLock {
				return min(g, maxInferredLock)
			}
			return 0
		}
		if d := recv.LockedUntil().Sub(acceptedAt); d > 0 {
			k.dur = min(max(d, minInferredLock), maxInferredLock)
		}
	}
	if k.dur <= 0 {
		k.dur, first = fallbackSessionLock, 0
	}
	k.deadline = acceptedAt.Add(k.dur)
	k.each = cfg.renewInterval(k.dur)
	if first < 0 {
		first = k.each
	}
	k.followHandler(cancel) // the lock's end cancels ctx, with its cause
	k.sched.add(k, acceptedAt.Add(first), true)
	return lk
}

// loseSessionLock ends lk with ErrLockLost, which cancels the handler and stops the session.
func (r *sessionRun) loseSessionLock(lk *sessionLock, recv SessionReceiver, why error) {
	r.sc.cfg.logger.Warn("session lock lost; its messages go back to the session", slog.String("session_id", recv.SessionID()), errAttr(why))
	lk.keeper.lose()
}

// lost reports whether the lock has ended (lost, released, or the shutdown gave up), and why.
func (lk *sessionLock) lost() (bool, error) {
	if lk.ctx.Err() == nil {
		return false, nil
	}
	return true, context.Cause(lk.ctx)
}

// release stops renewing (waiting for a renewal in flight) and ends ctx.
func (lk *sessionLock) release() { lk.keeper.stop() }
