package retry_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/outage"
)

var errDependencyDown = errors.New("billing is down")

// Outage mode on a session consumer: two failures in a row trip the breaker; while it is open nothing
// runs and no other session is accepted, the messages in hand wait in their sessions without spending
// an attempt, and once the dependency is back the probe closes the breaker and everything runs, in
// order.
func TestSessionOutageHoldsInPlaceWithoutSpendingAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		for _, s := range []string{"a", "b", "c"} {
			sendSession(t, b, s, 3)
		}
		var down atomic.Bool
		down.Store(true)
		rec := newSessionRecorder()
		h := rec.handler(func(context.Context, sessionCall) error {
			if down.Load() {
				return errDependencyDown
			}
			return nil
		})
		sc := newSessionConsumer(t, b, h, rec, &retry.Options{Outage: &outage.Options{ConsecutiveFailures: 2, OpenFor: time.Minute}},
			&retry.SessionOptions{MaxConcurrentSessions: 2})
		stop := runSessionConsumer(t, sc)

		// Both workers' first messages fail at once: the second failure trips the breaker. The first
		// one's retry in place comes due at 10 s and waits, the breaker being open.
		time.Sleep(30 * time.Second)
		synctest.Wait()
		out := sc.Health().Outage
		assert.Equal(t, outage.Open, out.State)
		assert.Equal(t, uint64(1), out.Trips)
		assert.Len(t, rec.calls, 2, "nothing runs while the breaker is open")
		assert.Empty(t, rec.callsOf("c"), "no session is accepted while the breaker is open")

		down.Store(false)
		waitFor(t, b, func() bool { return len(b.Completed()) == 9 })
		require.NoError(t, stop())
		assert.Equal(t, outage.Closed, sc.Health().Outage.State)
		for _, s := range []string{"a", "b", "c"} {
			assert.Equal(t, ids(s, 1, 2, 3), rec.successesOf(s), "session %s in order", s)
		}
		attempts := map[string]int{}
		for _, p := range rec.processed {
			attempts[p.Message.MessageID] = p.Result.Attempt
			assert.Equal(t, retry.OutcomeCompleted, p.Result.Outcome, p.Message.MessageID)
		}
		held, retried := "a-1", "b-1"
		if attempts["a-1"] != 1 {
			held, retried = retried, held
		}
		assert.Equal(t, 1, attempts[held], "the failure that tripped the breaker spent no attempt")
		assert.Equal(t, 2, attempts[retried], "the failure before the trip was retried in place, and its retry waited out the outage")
		for _, c := range rec.calls {
			if c.ID != "a-1" && c.ID != "b-1" {
				assert.GreaterOrEqual(t, c.At, time.Minute, "%s ran only after the probe", c.ID)
			}
		}
	})
}

// With a HealthCheck the breaker probes the dependency instead of a message: while the check fails no
// handler runs at all; once it passes, the held messages run at the attempt they were held at.
func TestSessionOutageHealthCheckProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "a", 2)
		sendSession(t, b, "b", 2)
		var down atomic.Bool
		down.Store(true)
		var checks atomic.Int32
		rec := newSessionRecorder()
		h := rec.handler(func(context.Context, sessionCall) error {
			if down.Load() {
				return errDependencyDown
			}
			return nil
		})
		check := func(context.Context) error {
			checks.Add(1)
			if down.Load() {
				return errDependencyDown
			}
			return nil
		}
		sc := newSessionConsumer(t, b, h, rec, &retry.Options{Outage: &outage.Options{ConsecutiveFailures: 1, OpenFor: time.Minute, HealthCheck: check}},
			&retry.SessionOptions{MaxConcurrentSessions: 2})
		stop := runSessionConsumer(t, sc)

		time.Sleep(3 * time.Minute)
		synctest.Wait()
		calls := len(rec.calls)
		assert.LessOrEqual(t, calls, 2, "the first failure trips the breaker; then no handler runs")
		assert.GreaterOrEqual(t, checks.Load(), int32(1), "the health check probes")
		assert.Equal(t, outage.Open, sc.Health().Outage.State)

		down.Store(false)
		waitFor(t, b, func() bool { return len(b.Completed()) == 4 })
		require.NoError(t, stop())
		assert.Equal(t, ids("a", 1, 2), rec.successesOf("a"))
		assert.Equal(t, ids("b", 1, 2), rec.successesOf("b"))
		for _, p := range rec.processed {
			assert.Equal(t, 1, p.Result.Attempt, "%s: no attempt spent by the outage", p.Message.MessageID)
		}
	})
}

// A probe that fails in a way that does not count (a bad message, Permanent) gives no verdict: the
// message is dead-lettered and the next message probes, from the same session, until one decides.
func TestSessionOutageProbeWithoutVerdictGoesOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "a", 3)
		var calls atomic.Int32
		rec := newSessionRecorder()
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.ID == "a-1" {
				if calls.Add(1) == 1 {
					return errDependencyDown // trips the breaker
				}
				return retry.Permanent(errDependencyDown) // the probe: a bad message, no verdict
			}
			return nil
		})
		sc := newSessionConsumer(t, b, h, rec, &retry.Options{Outage: &outage.Options{ConsecutiveFailures: 1, OpenFor: time.Minute}},
			&retry.SessionOptions{MaxConcurrentSessions: 2})
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 2 })
		require.NoError(t, stop())
		assert.Len(t, b.DeadLettered(), 1)
		assert.Equal(t, ids("a", 2, 3), rec.successesOf("a"))
		assert.Equal(t, outage.Closed, sc.Health().Outage.State, "a-2, the next probe, closed it")
	})
}

// A breaker still open when a Run starts (the last Run stopped during the outage, and gave its held
// message back) has nothing held in place: a worker accepts a session to probe with, and its first
// message is the probe.
func TestSessionOutageProbesFromAnAcceptedSession(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "a", 2)
		var down atomic.Bool
		down.Store(true)
		rec := newSessionRecorder()
		h := rec.handler(func(context.Context, sessionCall) error {
			if down.Load() {
				return errDependencyDown
			}
			return nil
		})
		sc := newSessionConsumer(t, b, h, rec, &retry.Options{Outage: &outage.Options{ConsecutiveFailures: 1, OpenFor: time.Minute}},
			&retry.SessionOptions{MaxConcurrentSessions: 2})
		stop := runSessionConsumer(t, sc)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		require.Equal(t, outage.Open, sc.Health().Outage.State)
		require.NoError(t, stop()) // the held message goes back to its session
		down.Store(false)
		stop = runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 2 })
		require.NoError(t, stop())
		assert.Equal(t, ids("a", 1, 2), rec.successesOf("a"))
		assert.Equal(t, outage.Closed, sc.Health().Outage.State)
	})
}

// A health check cut short (the session lock of the message that ran it was lost, or the consumer
// stops) gives no verdict and is not called again at once with a dead context: another waiter runs it
// at its time, and a shutdown returns.
func TestSessionOutageHealthCheckCutShort(t *testing.T) {
	for _, cut := range []string{"lock lost", "shutdown"} {
		t.Run(cut, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newSessionBroker(t, nil)
				sendSession(t, b, "a", 1)
				var lose atomic.Bool
				var checks atomic.Int32
				check := func(ctx context.Context) error {
					checks.Add(1)
					lose.Store(cut == "lock lost")
					<-ctx.Done()
					return ctx.Err()
				}
				rec := newSessionRecorder()
				h := rec.handler(func(context.Context, sessionCall) error { return errDependencyDown })
				conn := wrapAccepted(b.SessionConnector(), func(r retry.SessionReceiver, _ int) retry.SessionReceiver {
					return &lockLosingReceiver{SessionReceiver: r, lose: &lose}
				})
				sc, err := retry.NewSessionConsumer(conn, h, &retry.Options{Logger: discardLogger(), ShutdownGrace: time.Second,
					Outage: &outage.Options{ConsecutiveFailures: 1, OpenFor: time.Minute, HealthCheck: check, HealthCheckTimeout: time.Hour}},
					&retry.SessionOptions{MaxConcurrentSessions: 1})
				require.NoError(t, err)
				stop := runSessionConsumer(t, sc)
				time.Sleep(5 * time.Minute)
				synctest.Wait()
				n := checks.Load()
				require.NoError(t, stop())
				assert.LessOrEqual(t, n, int32(10), "a cut-short check is run again at the breaker's pace, not at once")
				assert.LessOrEqual(t, checks.Load()-n, int32(1), "stopping calls it at most once more")
			})
		})
	}
}

// lockLosingReceiver answers every renewal with a lost lock once lose is set.
type lockLosingReceiver struct {
	retry.SessionReceiver
	lose *atomic.Bool
}

func (r *lockLosingReceiver) RenewSessionLock(ctx context.Context, o *azservicebus.RenewSessionLockOptions) error {
	if r.lose.Load() {
		return &azservicebus.Error{Code: azservicebus.CodeLockLost}
	}
	return r.SessionReceiver.RenewSessionLock(ctx, o)
}

// Pause is the kill switch with or without outage mode: a message retrying in place when the consumer is
// paused waits in its session, its next attempt not run until Resume.
func TestSessionPauseHoldsARetryInPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "a", 1)
		rec := newSessionRecorder()
		var sc *retry.SessionConsumer
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.Attempt == 1 {
				sc.Pause("deploying billing")
				return errDependencyDown
			}
			return nil
		})
		sc = newSessionConsumer(t, b, h, rec, &retry.Options{}, &retry.SessionOptions{MaxConcurrentSessions: 1})
		stop := runSessionConsumer(t, sc)
		time.Sleep(2 * time.Minute) // the retry in place was due after 10 s
		synctest.Wait()
		assert.Len(t, rec.calls, 1, "no attempt runs while paused")
		sc.Resume()
		waitFor(t, b, func() bool { return len(b.Completed()) == 1 })
		require.NoError(t, stop())
		require.Len(t, rec.calls, 2)
		assert.Equal(t, 2, rec.calls[1].Attempt)
		assert.GreaterOrEqual(t, rec.calls[1].At, 2*time.Minute, "it ran after Resume")
	})
}
