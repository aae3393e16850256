package retry_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/retrytest"
)

// The session lock is renewed while the session is held, so a hold longer than the lock duration
// keeps the message: it is completed on its first delivery.
func TestSessionLockRenewedDuringHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, &retrytest.BrokerOptions{LockDuration: 10 * time.Second})
		sendSession(t, b, "s", 2)
		rec := newSessionRecorder()
		failed := false
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.ID == "s-1" && !failed {
				failed = true
				return errBoom
			}
			return nil
		})
		sc := newSessionConsumer(t, b, h, rec, &retry.Options{Backoff: backoff.Constant{Interval: time.Minute}}, &retry.SessionOptions{SessionIdleTimeout: time.Minute})
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 2 })
		sessions := b.Sessions()
		require.NoError(t, stop())

		assert.Equal(t, ids("s", 1, 2), rec.successesOf("s"))
		calls := rec.callsOf("s")
		require.Len(t, calls, 3)
		assert.Equal(t, time.Minute, calls[1].At-calls[0].At, "a one-minute hold under a ten-second lock")
		for _, m := range b.Completed() {
			assert.Equal(t, uint32(1), m.DeliveryCount, "the lock held through the hold: %s", m.MessageID)
		}
		require.Len(t, sessions, 1, "the session is still held after its last message")
		assert.False(t, sessions[0].LockedUntil.IsZero())
	})
}

// A lost session lock cancels the handler with ErrLockLost, settles nothing, and releases the session:
// its messages come back in order and are handled again.
func TestSessionLockLostCancelsHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, &retrytest.BrokerOptions{LockDuration: 10 * time.Second})
		sendSession(t, b, "s", 2)
		rec := newSessionRecorder()
		started := make(chan struct{})
		var cause error
		h := rec.handler(func(ctx context.Context, c sessionCall) error {
			if c.ID == "s-1" && cause == nil {
				close(started)
				<-ctx.Done()
				cause = context.Cause(ctx)
				return cause
			}
			return nil
		})
		sc := newSessionConsumer(t, b, h, rec, nil, &retry.SessionOptions{MaxConcurrentSessions: 1})
		stop := runSessionConsumer(t, sc)
		<-started
		b.ExpireLocks()
		waitFor(t, b, func() bool { return len(b.Completed()) == 2 })
		require.NoError(t, stop())

		assert.ErrorIs(t, cause, retry.ErrLockLost)
		assert.Equal(t, ids("s", 1, 2), rec.successesOf("s"))
		require.Len(t, rec.processed, 3)
		assert.Equal(t, retry.OutcomeLeftForRedelivery, rec.processed[0].Result.Outcome)
		assert.ErrorIs(t, rec.processed[0].Result.SettleErr, retry.ErrLockLost)
		assert.Equal(t, "s-1", rec.processed[1].Message.MessageID, "the lost message comes back first")
		assert.Equal(t, 1, rec.processed[1].Result.Attempt, "a lost lock spends no attempt")
		assert.Equal(t, uint64(1), sc.Health().LeftForRedelivery)
	})
}

// A session lock lost during a hold ends the hold: nothing is settled, and the message comes back
// first, its attempts starting again (they are counted in memory only).
func TestSessionLockLostDuringHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, &retrytest.BrokerOptions{LockDuration: 10 * time.Second})
		sendSession(t, b, "s", 2)
		rec := newSessionRecorder()
		failed := make(chan struct{})
		first := true
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.ID == "s-1" && first {
				first = false
				close(failed)
				return errBoom
			}
			return nil
		})
		sc := newSessionConsumer(t, b, h, rec, &retry.Options{Backoff: backoff.Constant{Interval: time.Minute}}, &retry.SessionOptions{MaxConcurrentSessions: 1})
		stop := runSessionConsumer(t, sc)
		<-failed
		synctest.Wait() // holding
		b.ExpireLocks()
		waitFor(t, b, func() bool { return len(b.Completed()) == 2 })
		require.NoError(t, stop())

		require.Len(t, rec.processed, 3)
		assert.Equal(t, retry.OutcomeLeftForRedelivery, rec.processed[0].Result.Outcome)
		assert.ErrorIs(t, rec.processed[0].Result.SettleErr, retry.ErrLockLost)
		assert.Equal(t, ids("s", 1, 2), rec.successesOf("s"))
		calls := rec.callsOf("s")
		require.Len(t, calls, 3)
		assert.Equal(t, "s-1", calls[1].ID)
		assert.Equal(t, 1, calls[1].Attempt)
		assert.Less(t, calls[1].At, time.Minute, "the hold ended with the lock, not with its delay")
	})
}

// A renewal that fails for another reason than a lost lock is tried again, sooner, while the lock
// lasts: the hold goes on and the message is completed on its first delivery.
func TestSessionRenewalRetriedAfterTransientFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, &retrytest.BrokerOptions{LockDuration: 10 * time.Second})
		sendSession(t, b, "s", 1)
		b.Fail(retrytest.OpRenew, 2, &azservicebus.Error{Code: azservicebus.CodeConnectionLost})
		rec := newSessionRecorder()
		failed := false
		h := rec.handler(func(context.Context, sessionCall) error {
			if !failed {
				failed = true
				return errBoom
			}
			return nil
		})
		sc := newSessionConsumer(t, b, h, rec, &retry.Options{Backoff: backoff.Constant{Interval: 30 * time.Second}}, nil)
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 1 })
		require.NoError(t, stop())
		require.Len(t, rec.processed, 1)
		assert.Equal(t, retry.OutcomeCompleted, rec.processed[0].Result.Outcome)
		assert.Equal(t, 2, rec.processed[0].Result.Attempt)
		assert.Equal(t, uint32(1), b.Completed()[0].DeliveryCount)
	})
}

// lenientComplete is a session receiver whose CompleteMessage reports success whatever the broker
// said, as the SDK can after its link recovery: only the consumer's own check of the lock stands
// between a lost lock and a success reported for a message that goes back to its session.
type lenientComplete struct{ retry.SessionReceiver }

func (l lenientComplete) CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.CompleteMessageOptions) error {
	_ = l.SessionReceiver.CompleteMessage(ctx, m, o)
	return nil
}

// A handler that succeeds after the session lock was lost is not completed: the message goes back
// first, whatever a complete call would claim.
func TestSessionSuccessAfterALostLockIsNotSettled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 2)
		inner := b.SessionConnector()
		connect := wrapAccepted(inner, func(r retry.SessionReceiver, _ int) retry.SessionReceiver {
			return lenientComplete{r}
		})
		rec := newSessionRecorder()
		started := make(chan struct{})
		first := true
		h := rec.handler(func(ctx context.Context, c sessionCall) error {
			if c.ID == "s-1" && first {
				first = false
				close(started)
				<-ctx.Done() // the lock is lost; the handler finishes its work anyway
			}
			return nil
		})
		sc, err := retry.NewSessionConsumer(connect, h, &retry.Options{Logger: discardLogger(), Hooks: retry.Hooks{OnProcessed: rec.onProcessed}},
			&retry.SessionOptions{MaxConcurrentSessions: 1})
		require.NoError(t, err)
		stop := runSessionConsumer(t, sc)
		<-started
		b.ExpireLocks()
		waitFor(t, b, func() bool { return len(b.Completed()) == 2 })
		require.NoError(t, stop())
		require.Len(t, rec.processed, 3)
		assert.Equal(t, retry.OutcomeLeftForRedelivery, rec.processed[0].Result.Outcome, "not reported completed")
		assert.ErrorIs(t, rec.processed[0].Result.SettleErr, retry.ErrLockLost)
		assert.Equal(t, "s-1", rec.processed[1].Message.MessageID, "it comes back first")
	})
}

// overlapReceiver records whether two of its calls ever overlapped.
type overlapReceiver struct {
	retry.SessionReceiver
	in, overlapped *atomic.Int32
}

func (o overlapReceiver) enter() func() {
	if o.in.Add(1) > 1 {
		o.overlapped.Add(1)
	}
	time.Sleep(50 * time.Millisecond) // every call takes a while, so that overlaps would show
	return func() { o.in.Add(-1) }
}

func (o overlapReceiver) ReceiveMessages(ctx context.Context, n int, opts *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	defer o.enter()()
	return o.SessionReceiver.ReceiveMessages(ctx, n, opts)
}

func (o overlapReceiver) CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, opts *azservicebus.CompleteMessageOptions) error {
	defer o.enter()()
	return o.SessionReceiver.CompleteMessage(ctx, m, opts)
}

func (o overlapReceiver) RenewSessionLock(ctx context.Context, opts *azservicebus.RenewSessionLockOptions) error {
	defer o.enter()()
	return o.SessionReceiver.RenewSessionLock(ctx, opts)
}

func (o overlapReceiver) LockedUntil() time.Time {
	defer o.enter()()
	return o.SessionReceiver.LockedUntil()
}

// The session lock's renewals never run at the same time as the worker's calls on the receiver:
// azservicebus v1.11 rewrites a session receiver's fields without a lock when a call recovers its link
// (soak/README.md finding 4). Each waits for the other, and a wait for the next message is cut into
// slices, so renewals still come on time.
func TestSessionReceiverCallsNeverOverlap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, &retrytest.BrokerOptions{LockDuration: 4 * time.Second})
		sendSession(t, b, "s", 3)
		var in, overlapped atomic.Int32
		base := b.SessionConnector()
		connect := wrapAccepted(base, func(r retry.SessionReceiver, _ int) retry.SessionReceiver {
			return overlapReceiver{SessionReceiver: r, in: &in, overlapped: &overlapped}
		})
		slow := func(context.Context, *azservicebus.ReceivedMessage) error { time.Sleep(10 * time.Second); return nil }
		sc, err := retry.NewSessionConsumer(connect, slow, &retry.Options{Logger: discardLogger()}, &retry.SessionOptions{SessionIdleTimeout: 20 * time.Second})
		require.NoError(t, err)
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 3 })
		time.Sleep(30 * time.Second) // an idle wait, renewed meanwhile
		require.NoError(t, stop())
		assert.Zero(t, overlapped.Load(), "calls on the session receiver overlapped")
		assert.Equal(t, uint64(3), sc.Health().Completed)
		assert.Zero(t, sc.Health().LeftForRedelivery, "the lock held: 10 s handlers under a 4 s lock, and a 20 s idle wait")
	})
}

// relinkingReceiver makes its first receive after each renewal find the session taken again by the
// SDK (LockedUntil moves during the call, which ends the lock), with renewals that take a while: the
// renewal and the worker's call end in either order.
type relinkingReceiver struct {
	retry.SessionReceiver
	bump    atomic.Int64
	renewed atomic.Bool
}

func (r *relinkingReceiver) LockedUntil() time.Time {
	return r.SessionReceiver.LockedUntil().Add(time.Duration(r.bump.Load()))
}

func (r *relinkingReceiver) RenewSessionLock(ctx context.Context, o *azservicebus.RenewSessionLockOptions) error {
	time.Sleep(300 * time.Millisecond)
	err := r.SessionReceiver.RenewSessionLock(ctx, o)
	r.renewed.Store(true)
	return err
}

func (r *relinkingReceiver) ReceiveMessages(ctx context.Context, n int, o *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	relink := r.renewed.Swap(false)
	msgs, err := r.SessionReceiver.ReceiveMessages(ctx, n, o)
	if relink {
		time.Sleep(50 * time.Millisecond)
		r.bump.Add(int64(time.Millisecond))
	}
	return msgs, err
}

// A session taken again by the SDK while its lock's renewal is in flight ends the lock from the
// worker's call; the renewal, reading the new expiry, must not wait for the worker meanwhile (they
// deadlocked once: the keeper read LockedUntil through the worker's turn while holding its mutex, and
// the worker's call waited for that mutex to end the lock). Run stops cleanly and every goroutine ends.
func TestSessionLockRetakenDuringARenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, &retrytest.BrokerOptions{LockDuration: 6 * time.Second})
		sendSession(t, b, "a", 1)
		conn := wrapAccepted(b.SessionConnector(), func(r retry.SessionReceiver, _ int) retry.SessionReceiver {
			return &relinkingReceiver{SessionReceiver: r}
		})
		sc, err := retry.NewSessionConsumer(conn, func(context.Context, *azservicebus.ReceivedMessage) error { return nil },
			&retry.Options{Logger: discardLogger(), ShutdownGrace: time.Second, SettleTimeout: 2 * time.Second},
			&retry.SessionOptions{MaxConcurrentSessions: 2, SessionIdleTimeout: time.Minute})
		require.NoError(t, err)
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 1 })
		time.Sleep(12 * time.Second) // several renewals, each followed by a retaken session
		synctest.Wait()
		require.NoError(t, stop(), "Run stops without a shutdown timeout: no worker is stuck")
	})
}
