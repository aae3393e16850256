package retry

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// Bounds on the lock duration the processor infers when Options.LockDuration is not set. Service Bus
// grants between a few seconds and 5 minutes; an estimate outside that range means the client's clock
// disagrees with the broker's, and the bound keeps the renewal schedule sane (see grantedLockDuration).
const (
	minInferredLock = time.Second
	maxInferredLock = 5 * time.Minute
	// defaultInferredLock is used when a message carries no LockedUntil at all: the Service Bus default.
	defaultInferredLock = time.Minute
	// minRenewWait keeps a failing renewal from spinning.
	minRenewWait = 100 * time.Millisecond
)

// lockKeeper follows one delivery's lock on the local clock, from receive until the message is settled.
//
// Renewal timing never compares the broker's LockedUntil with the local clock, because the two clocks
// need not agree: a client clock behind the broker's by more than the lock would renew only after the
// lock expired, and one ahead would take a slow renewal for a lost lock. Instead the keeper knows the
// lock duration the broker grants (Options.LockDuration, or once at receive LockedUntil minus the local
// time, bounded) and counts it on the local clock from the moment each lock was taken or renewed: the
// lock is held until start + duration, and renewed every duration/2 (or LockRenewInterval).
//
// ctx is the lock's life: it is cancelled with cause [ErrLockLost] when the broker says the lock is gone,
// when renewals kept failing until the local deadline, or when a redelivery of the same message proves
// it. Lock-bound settle calls and the handler's context derive from it.
type lockKeeper struct {
	clk      Clock
	duration time.Duration
	interval time.Duration

	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	deadline time.Time // local time at which the lock runs out unless renewed

	stopRenewal context.CancelFunc
	renewDone   chan struct{}
}

// keepLock starts following msg's lock, received at now. base is the context the lock lives under:
// the processor's settle base, detached from the handler's caller so that a caller cancelling its
// context does not stop the renewal of a message still being worked on. With renewal enabled, a
// goroutine renews the lock until stop is called.
func (p *Processor) keepLock(base context.Context, settler Settler, msg *azservicebus.ReceivedMessage, env *Envelope, now time.Time) *lockKeeper {
	cfg := p.cfg
	d := grantedLockDuration(cfg.lockDuration, msg, now)
	lk := &lockKeeper{clk: cfg.clock, duration: d, interval: cfg.lockRenewInterval, deadline: now.Add(d)}
	if lk.interval <= 0 {
		lk.interval = max(d/2, minRenewWait)
	}
	lk.ctx, lk.cancel = context.WithCancelCause(base)
	if cfg.lockRenewal {
		rctx, stop := context.WithCancel(lk.ctx)
		lk.stopRenewal = stop
		lk.renewDone = make(chan struct{})
		go func() {
			defer close(lk.renewDone)
			p.renewLoop(rctx, lk, settler, msg, env)
		}()
	}
	return lk
}

// grantedLockDuration is the lock duration the broker grants: the configured one if known, else the
// lock's remaining time at receive, bounded to what Service Bus can grant.
func grantedLockDuration(configured time.Duration, msg *azservicebus.ReceivedMessage, now time.Time) time.Duration {
	if configured > 0 {
		return configured
	}
	if msg.LockedUntil == nil {
		return defaultInferredLock
	}
	return min(max(msg.LockedUntil.Sub(now), minInferredLock), maxInferredLock)
}

// stop ends the renewal and waits for its goroutine; it does not release the lock.
func (lk *lockKeeper) stop() {
	if lk.stopRenewal != nil {
		lk.stopRenewal()
		<-lk.renewDone
	}
	lk.cancel(nil)
}

// lose records that the lock is gone.
func (lk *lockKeeper) lose(cause error) { lk.cancel(cause) }

// alive reports whether the lock is still held as far as the client knows.
func (lk *lockKeeper) alive() bool {
	if lk.ctx.Err() != nil {
		return false
	}
	lk.mu.Lock()
	deadline := lk.deadline
	lk.mu.Unlock()
	if !lk.clk.Now().Before(deadline) {
		lk.lose(ErrLockLost)
		return false
	}
	return true
}

// remaining is the time until the lock runs out on the local clock.
func (lk *lockKeeper) remaining() time.Duration {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	return lk.deadline.Sub(lk.clk.Now())
}

// settleContext bounds one lock-bound settle call: by timeout, by the lock's remaining time (a settle
// after the lock expired can only fail, and waiting for it holds up the consumer), and by the lock's
// life.
func (lk *lockKeeper) settleContext(timeout time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(lk.ctx, max(min(timeout, lk.remaining()), time.Millisecond))
}

// renewLoop renews the lock every interval until ctx ends or the lock is lost. A failed renewal is
// retried sooner, and the lock counts as lost when the local deadline passes without a success.
func (p *Processor) renewLoop(ctx context.Context, lk *lockKeeper, settler Settler, msg *azservicebus.ReceivedMessage, env *Envelope) {
	wait := lk.interval
	for {
		if rem := lk.remaining(); wait > rem {
			wait = max(rem, 0)
		}
		timer := lk.clk.After(max(wait, time.Nanosecond))
		select {
		case <-ctx.Done():
			return
		case <-timer:
		}
		if !lk.alive() {
			p.log(ctx, slog.LevelWarn, "message lock expired before it could be renewed", msg, *env)
			return
		}
		sent := lk.clk.Now()
		rctx, cancel := context.WithTimeout(ctx, max(min(p.cfg.settleTimeout, lk.remaining()), time.Millisecond))
		err := settler.RenewMessageLock(rctx, msg, nil)
		cancel()
		if ctx.Err() != nil {
			return // settled (or lost) while the renewal was in flight
		}
		if err == nil {
			lk.mu.Lock()
			lk.deadline = sent.Add(lk.duration)
			lk.mu.Unlock()
			wait = lk.interval
			continue
		}
		if code, ok := sdkCode(err); ok && code == azservicebus.CodeLockLost {
			p.log(ctx, slog.LevelWarn, "lock renewal failed: lock lost", msg, *env, errAttr(err))
			lk.lose(ErrLockLost)
			return
		}
		p.log(ctx, slog.LevelWarn, "lock renewal failed; will try again", msg, *env, errAttr(err))
		wait = max(lk.remaining()/2, minRenewWait)
	}
}
