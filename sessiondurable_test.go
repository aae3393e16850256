package retry_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/retrytest"
	"github.com/sbretry/retry/sbemu/broker"
	"github.com/sbretry/retry/sessionstate"
)

// durableOnly makes every delayed retry a durable hold: no wait fits a MaxHold of 1 ns.
var durableOnly = &retry.SessionOptions{MaxHold: time.Nanosecond, DurableHolds: true}

// sessionState reads the record of session sid on b.
func sessionState(t *testing.T, b *retrytest.Broker, sid string) sessionstate.State {
	t.Helper()
	for _, s := range b.Sessions() {
		if s.ID == sid {
			st, err := sessionstate.Decode(s.State)
			require.NoError(t, err)
			return st
		}
	}
	return sessionstate.State{}
}

// wakeUpsPending counts the wake-ups scheduled into session sid and not yet receivable.
func wakeUpsPending(b *retrytest.Broker, sid string) int {
	for _, s := range b.Sessions() {
		if s.ID == sid {
			return s.Scheduled
		}
	}
	return 0
}

// successes counts the successes of session sid.
func successCount(rec *sessionRecorder, sid string) int { return len(rec.successesOf(sid)) }

// A held message is deferred with its hold in the session state and a wake-up scheduled; the session's
// later messages are deferred behind it; at the wake-up it runs again, then its followers, in order.
func TestSessionDurableHoldKeepsOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 2)
		rec := newSessionRecorder()
		var seenHeld sessionstate.State
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.ID == "s-1" && c.Attempt < 3 {
				return errBoom
			}
			if c.ID == "s-1" {
				seenHeld = sessionState(t, b, "s")
			}
			return nil
		})
		sc := newSessionConsumer(t, b, h, rec, &retry.Options{Backoff: backoff.Constant{Interval: time.Minute}}, durableOnly)
		stop := runSessionConsumer(t, sc)
		// The first failure holds s-1 durably; s-2 (and a message sent during the hold) wait behind it.
		waitFor(t, b, func() bool { return len(b.Deferred()) == 2 })
		st := sessionState(t, b, "s")
		require.NotNil(t, st.Hold)
		assert.Equal(t, "s-1", st.Hold.MessageID)
		assert.Equal(t, 2, st.Hold.Attempt)
		assert.Equal(t, errBoom.Error(), st.Hold.LastError)
		assert.Len(t, st.Followers, 1)
		sched := b.Scheduled()
		require.Len(t, sched, 1, "one wake-up")
		assert.Equal(t, sessionstate.ControlWake, sched[0].Message.ApplicationProperties[sessionstate.PropControl])
		assert.True(t, st.Hold.WakeAt.Equal(sched[0].At), "the wake-up is due with the hold")
		assert.Equal(t, st.Hold.WakeID, *sched[0].Message.MessageID)
		sendSession3(t, b, "s", 3)

		waitFor(t, b, func() bool { return successCount(rec, "s") == 3 })
		waitFor(t, b, func() bool { return !sessionState(t, b, "s").Blocked() && wakeUpsPending(b, "s") == 0 })
		require.NoError(t, stop())

		assert.Equal(t, ids("s", 1, 2, 3), rec.successesOf("s"))
		var order []string
		for _, c := range rec.callsOf("s") {
			order = append(order, fmt.Sprintf("%s#%d", c.ID, c.Attempt))
		}
		assert.Equal(t, []string{"s-1#1", "s-1#2", "s-1#3", "s-2#1", "s-3#1"}, order, "wake-ups never reach the handler")
		calls := rec.callsOf("s")
		assert.Equal(t, time.Minute, calls[1].At-calls[0].At, "the retry runs at its wake-up")
		assert.Equal(t, time.Minute, calls[2].At-calls[1].At)
		require.NotNil(t, seenHeld.Hold, "the record holds s-1 while its third attempt runs")
		assert.Equal(t, 3, seenHeld.Hold.Attempt)
		assert.Empty(t, b.Deferred())
		hh := sc.Health()
		assert.Equal(t, uint64(3), hh.Completed)
		assert.Equal(t, uint64(4), hh.Deferred, "two holds of s-1, s-2 and s-3 behind it")
		assert.Equal(t, 0, hh.InFlight)
		assert.Empty(t, b.DeadLettered())
		assert.Len(t, rec.processed, int(hh.Received), "OnProcessed once per delivery, deferrals included")
		var outcomes []string
		for _, p := range rec.processed {
			outcomes = append(outcomes, p.Message.MessageID+":"+p.Result.Outcome.String())
		}
		assert.Equal(t, []string{"s-1:deferred", "s-2:deferred", "s-3:deferred", "s-1:deferred", "s-1:completed", "s-2:completed", "s-3:completed"}, outcomes)
	})
}

// sendSession3 sends the message "<session>-<i>" to session.
func sendSession3(t *testing.T, b *retrytest.Broker, session string, i int) {
	t.Helper()
	_, err := b.Send(&azservicebus.Message{MessageID: strPtr(fmt.Sprintf("%s-%d", session, i)), SessionID: strPtr(session), Body: []byte("x")})
	require.NoError(t, err)
}

// A durably held session gives its place up: with one session at a time, another session runs
// during the hold, which hold in place could not do.
func TestSessionDurableHoldFreesTheSession(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "held", 2)
		rec := newSessionRecorder()
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.ID == "held-1" && c.Attempt == 1 {
				return errBoom
			}
			return nil
		})
		so := *durableOnly
		so.MaxConcurrentSessions = 1
		sc := newSessionConsumer(t, b, h, rec, &retry.Options{Backoff: backoff.Constant{Interval: time.Hour}}, &so)
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Deferred()) == 2 })
		sendSession(t, b, "free", 2)
		waitFor(t, b, func() bool { return successCount(rec, "free") == 2 })
		assert.Empty(t, rec.successesOf("held"))
		waitFor(t, b, func() bool { return successCount(rec, "held") == 2 })
		require.NoError(t, stop())
		assert.Equal(t, ids("held", 1, 2), rec.successesOf("held"))
		free, held := rec.callsOf("free"), rec.callsOf("held")
		assert.Less(t, free[1].At, held[1].At)
		assert.Equal(t, time.Hour, held[1].At-held[0].At)
	})
}

// The hold survives its consumer: a consumer stopped during the hold, and a new one started after
// it, resume the session in order, with the attempt count kept.
func TestSessionDurableHoldSurvivesTheConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 3)
		rec := newSessionRecorder()
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.ID == "s-2" && c.Attempt < 3 {
				return errBoom
			}
			return nil
		})
		opts := func() *retry.Options { return &retry.Options{Backoff: backoff.Constant{Interval: time.Minute}} }
		first := newSessionConsumer(t, b, h, rec, opts(), durableOnly)
		stop := runSessionConsumer(t, first)
		waitFor(t, b, func() bool { return len(b.Deferred()) == 2 })
		require.NoError(t, stop())

		time.Sleep(10 * time.Minute) // the bubble's clock: the wake-up falls due with no consumer running
		second := newSessionConsumer(t, b, h, rec, opts(), durableOnly)
		stop = runSessionConsumer(t, second)
		waitFor(t, b, func() bool { return successCount(rec, "s") == 3 })
		require.NoError(t, stop())

		assert.Equal(t, ids("s", 1, 2, 3), rec.successesOf("s"))
		var order []string
		for _, c := range rec.callsOf("s") {
			order = append(order, fmt.Sprintf("%s#%d", c.ID, c.Attempt))
		}
		assert.Equal(t, []string{"s-1#1", "s-2#1", "s-2#2", "s-2#3", "s-3#1"}, order)
		assert.False(t, sessionState(t, b, "s").Blocked())
	})
}

// A consumer may stop between any two steps of a hold or a deferral. Each step is failed in turn: the
// message then comes back to the session, and the order, the attempts and the count of successes
// hold; nothing is left deferred, and no wake-up reaches the handler.
func TestSessionDurableHoldInterruptedAtEachStep(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   retrytest.Op
		// when the fault is set: at the failure of s-1's first attempt (its hold), or while s-1's
		// second attempt runs (s-2 and s-3 are then deferred behind it).
		atHold bool
	}{
		{"wake-up not scheduled", retrytest.OpSchedule, true},
		{"record not written", retrytest.OpSessionState, true},
		{"held message not deferred", retrytest.OpDefer, true},
		{"follower not deferred", retrytest.OpDefer, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newSessionBroker(t, nil)
				sendSession(t, b, "s", 3)
				rec := newSessionRecorder()
				injected := false
				h := rec.handler(func(_ context.Context, c sessionCall) error {
					if c.ID != "s-1" {
						return nil
					}
					if !injected && tc.atHold {
						injected = true
						b.Fail(tc.op, 1, errors.New("injected"))
					}
					if c.Attempt < 3 {
						return errBoom
					}
					return nil
				})
				opts := &retry.Options{Backoff: backoff.Constant{Interval: time.Minute}}
				if !tc.atHold {
					// Armed once the hold's own deferral is done: the next deferral is s-2's.
					opts.Hooks.OnSettle = func(p retry.SettleParams) {
						if p.Operation == retry.SettleDefer && !injected {
							injected = true
							b.Fail(tc.op, 1, errors.New("injected"))
						}
					}
				}
				sc := newSessionConsumer(t, b, h, rec, opts, durableOnly)
				stop := runSessionConsumer(t, sc)
				waitFor(t, b, func() bool { return successCount(rec, "s") == 3 })
				waitFor(t, b, func() bool { return !sessionState(t, b, "s").Blocked() && len(b.Deferred()) == 0 })
				require.NoError(t, stop())
				assert.Equal(t, ids("s", 1, 2, 3), rec.successesOf("s"))
				for _, c := range rec.callsOf("s") {
					assert.NotContains(t, c.ID, "wake", "a wake-up reached the handler")
				}
				assert.Empty(t, b.DeadLettered())
				assert.True(t, injected)
				assert.Positive(t, sc.Health().LeftForRedelivery+sc.Health().SendFailures, "the fault was met")
			})
		})
	}
}

// A session state that is not our record is never written; that session's retries are held in place
// only, and one past MaxHold is dead-lettered as without durable holds.
func TestSessionDurableForeignStateLeftAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 2)
		r, err := b.AcceptSession(t.Context(), "s")
		require.NoError(t, err)
		require.NoError(t, r.SetSessionState(t.Context(), []byte(`{"cart":42}`), nil))
		require.NoError(t, r.Close(t.Context()))
		rec := newSessionRecorder()
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.ID == "s-1" {
				return errBoom
			}
			return nil
		})
		sc := newSessionConsumer(t, b, h, rec, &retry.Options{Backoff: backoff.Constant{Interval: time.Minute}}, durableOnly)
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return successCount(rec, "s") == 1 && len(b.DeadLettered()) == 1 })
		require.NoError(t, stop())
		assert.Equal(t, "RetrySessionHoldExceeded", b.DeadLettered()[0].Reason)
		for _, s := range b.Sessions() {
			if s.ID == "s" {
				assert.JSONEq(t, `{"cart":42}`, string(s.State))
			}
		}
		assert.Empty(t, b.Deferred())
		assert.Zero(t, wakeUpsPending(b, "s"))
	})
}

// A deferred message that expired during its hold is gone at the wake-up: the consumer says so and
// goes on with the followers, in order.
func TestSessionDurableHeldMessageExpired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		ttl := 30 * time.Second
		_, err := b.Send(&azservicebus.Message{MessageID: strPtr("s-1"), SessionID: strPtr("s"), Body: []byte("x"), TimeToLive: &ttl})
		require.NoError(t, err)
		sendSession3(t, b, "s", 2)
		rec := newSessionRecorder()
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.ID == "s-1" {
				return errBoom
			}
			return nil
		})
		// IgnoreExpiry: the hold is made although it ends after the producer's expiry.
		sc := newSessionConsumer(t, b, h, rec, &retry.Options{Backoff: backoff.Constant{Interval: time.Minute}, IgnoreExpiry: true}, durableOnly)
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return successCount(rec, "s") == 1 })
		waitFor(t, b, func() bool { return !sessionState(t, b, "s").Blocked() })
		require.NoError(t, stop())
		assert.Equal(t, []string{"s-2"}, rec.successesOf("s"))
		assert.Len(t, rec.callsOf("s"), 2, "s-1 ran once: it expired during its hold")
		assert.Empty(t, b.Deferred())
	})
}

// A wake-up that comes twice, or after its hold is over, is completed and ignored.
func TestSessionDurableWakeUpTwice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 2)
		rec := newSessionRecorder()
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.ID == "s-1" && c.Attempt == 1 {
				return errBoom
			}
			return nil
		})
		sc := newSessionConsumer(t, b, h, rec, &retry.Options{Backoff: backoff.Constant{Interval: time.Minute}}, durableOnly)
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Scheduled()) == 1 })
		wake := b.Scheduled()[0].Message
		waitFor(t, b, func() bool { return successCount(rec, "s") == 2 })
		// The same wake-up again, as a second schedule would deliver it.
		_, err := b.Send(&azservicebus.Message{MessageID: wake.MessageID, SessionID: strPtr("s"), ApplicationProperties: wake.ApplicationProperties})
		require.NoError(t, err)
		sendSession3(t, b, "s", 3)
		waitFor(t, b, func() bool { return successCount(rec, "s") == 3 })
		require.NoError(t, stop())
		assert.Equal(t, ids("s", 1, 2, 3), rec.successesOf("s"))
		assert.Len(t, rec.callsOf("s"), 4)
		assert.False(t, sessionState(t, b, "s").Blocked())
	})
}

// With BlockAfterDeadLetter a dead-letter blocks the session: its later messages are deferred until
// an operator releases it (PlanRelease, applied as the operator tools do); then they run in order.
func TestSessionBlockAfterDeadLetterUntilReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 3)
		rec := newSessionRecorder()
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.ID == "s-1" {
				return retry.Permanent(errors.New("malformed order"))
			}
			return nil
		})
		sc := newSessionConsumer(t, b, h, rec, nil, &retry.SessionOptions{BlockAfterDeadLetter: true})
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.DeadLettered()) == 1 && len(b.Deferred()) == 2 })
		st := sessionState(t, b, "s")
		require.NotNil(t, st.Hold)
		assert.Equal(t, "RetryPermanentFailure", st.Hold.DeadLetterReason)
		assert.Equal(t, "s-1", st.Hold.MessageID)
		assert.Len(t, st.Followers, 2)
		assert.Empty(t, rec.successesOf("s"))
		// Nothing moves on its own: a minute later the session is still blocked.
		time.Sleep(time.Minute)
		synctest.Wait()
		assert.Empty(t, rec.successesOf("s"))

		// The operator's release, as sbretry applies it: wake-up first, then the record.
		r, err := acceptWhenFree(t, b, "s")
		require.NoError(t, err)
		raw, err := r.GetSessionState(t.Context(), nil)
		require.NoError(t, err)
		cur, err := sessionstate.Decode(raw)
		require.NoError(t, err)
		plan, err := sessionstate.PlanRelease("s", cur, time.Now())
		require.NoError(t, err)
		assert.Nil(t, plan.After.Hold)
		assert.Equal(t, append([]int64{cur.Hold.SequenceNumber}, cur.Followers...), plan.After.Followers)
		_, err = b.Sender().ScheduleMessages(t.Context(), []*azservicebus.Message{plan.Wake}, time.Time{}, nil)
		require.NoError(t, err)
		rec2, err := sessionstate.Marshal(plan.After)
		require.NoError(t, err)
		require.NoError(t, r.SetSessionState(t.Context(), rec2, nil))
		require.NoError(t, r.Close(t.Context()))

		waitFor(t, b, func() bool { return successCount(rec, "s") == 2 })
		waitFor(t, b, func() bool { return !sessionState(t, b, "s").Blocked() })
		require.NoError(t, stop())
		assert.Equal(t, ids("s", 2, 3), rec.successesOf("s"))
		assert.Empty(t, b.Deferred())
	})
}

// acceptWhenFree accepts session sid once no consumer holds it.
func acceptWhenFree(t *testing.T, b *retrytest.Broker, sid string) (*retrytest.SessionReceiver, error) {
	t.Helper()
	for range 100 {
		r, err := b.AcceptSession(t.Context(), sid)
		if err == nil {
			return r, nil
		}
		time.Sleep(time.Second)
	}
	return nil, errors.New("the session stayed locked")
}

// Without DurableHolds, a wake-up still makes the consumer honour a record another consumer wrote: the
// held message runs at its time, then its followers.
func TestSessionRecordHonouredWithoutDurableHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 2)
		rec := newSessionRecorder()
		fail := true
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.ID == "s-1" && fail {
				return errBoom
			}
			return nil
		})
		first := newSessionConsumer(t, b, h, rec, &retry.Options{Backoff: backoff.Constant{Interval: time.Minute}}, durableOnly)
		stop := runSessionConsumer(t, first)
		waitFor(t, b, func() bool { return len(b.Deferred()) == 2 })
		require.NoError(t, stop())
		fail = false
		plain := newSessionConsumer(t, b, h, rec, &retry.Options{Backoff: backoff.Constant{Interval: time.Minute}}, nil)
		stop = runSessionConsumer(t, plain)
		waitFor(t, b, func() bool { return successCount(rec, "s") == 2 })
		require.NoError(t, stop())
		assert.Equal(t, ids("s", 1, 2), rec.successesOf("s"))
		assert.False(t, sessionState(t, b, "s").Blocked())
	})
}

// Durable holds need a sender for the wake-ups: a subscription's session connection has none, and Run
// says so instead of dead-lettering what it cannot hold.
func TestSessionDurableNeedsASender(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, &retrytest.BrokerOptions{EntityPath: "events", Subscriptions: []broker.SubscriptionConfig{{Name: "billing"}}})
		sc := newSessionConsumer(t, b, func(context.Context, *azservicebus.ReceivedMessage) error { return nil }, nil, nil, durableOnly)
		err := sc.Run(t.Context())
		require.ErrorIs(t, err, retry.ErrInvalidOptions)
		assert.ErrorContains(t, err, "DurableHolds")
	})
}

// A consumer stopped between writing a hold's record and deferring the message, with the next one
// coming after the hold is due: the message is back active, and runs as the attempt the record says,
// so MaxAttempts still counts from the first.
func TestSessionDurableHeldMessageBackActiveKeepsItsAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 2)
		rec := newSessionRecorder()
		injected := false
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.ID == "s-1" && !injected {
				injected = true
				b.Fail(retrytest.OpDefer, 1, errors.New("killed"))
			}
			if c.ID == "s-1" {
				return errBoom
			}
			return nil
		})
		ctx, cancel := context.WithCancel(t.Context())
		opts := &retry.Options{Backoff: backoff.Constant{Interval: time.Minute}, MaxAttempts: 2}
		opts.Hooks.OnSettle = func(p retry.SettleParams) {
			if p.Operation == retry.SettleDefer && p.Err != nil {
				cancel() // the process dies right after the failed deferral
			}
		}
		first := newSessionConsumer(t, b, h, rec, opts, durableOnly)
		done := make(chan error, 1)
		go func() { done <- first.Run(ctx) }()
		require.NoError(t, <-done)
		st := sessionState(t, b, "s")
		require.NotNil(t, st.Hold)
		assert.Equal(t, 2, st.Hold.Attempt)

		time.Sleep(10 * time.Minute)
		second := newSessionConsumer(t, b, h, rec, &retry.Options{Backoff: backoff.Constant{Interval: time.Minute}, MaxAttempts: 2}, durableOnly)
		stop := runSessionConsumer(t, second)
		waitFor(t, b, func() bool { return successCount(rec, "s") == 1 && len(b.DeadLettered()) == 1 })
		require.NoError(t, stop())
		var attempts []int
		for _, c := range rec.callsOf("s") {
			if c.ID == "s-1" {
				attempts = append(attempts, c.Attempt)
			}
		}
		assert.Equal(t, []int{1, 2}, attempts, "attempt 2 is the last: MaxAttempts counts across the stop")
		assert.Equal(t, "RetryMaxAttemptsExceeded", b.DeadLettered()[0].Reason)
		assert.Equal(t, []string{"s-2"}, rec.successesOf("s"))
	})
}

// skewedClock is the bubble's clock, lag behind.
type skewedClock struct{ lag time.Duration }

func (c skewedClock) Now() time.Time                         { return time.Now().Add(-c.lag) }
func (c skewedClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// A consumer whose clock is behind the broker's sees the wake-up before its hold is due by its own
// clock. The broker's delivery of the wake-up makes the hold due: it runs at once, and the session is
// never left with nothing to wake it (duplicate detection on, which would drop a wake-up scheduled
// again under an id used before).
func TestSessionDurableWakeUpEarlyByTheLocalClock(t *testing.T) {
	for _, tc := range []struct {
		name   string
		sender bool
	}{{"with a sender", true}, {"without a sender", false}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newSessionBroker(t, &retrytest.BrokerOptions{DuplicateDetection: true})
				sendSession(t, b, "s", 2)
				rec := newSessionRecorder()
				fail := true
				h := rec.handler(func(_ context.Context, c sessionCall) error {
					if c.ID == "s-1" && fail {
						return errBoom
					}
					return nil
				})
				// The hold is made by a consumer on the broker's clock...
				first := newSessionConsumer(t, b, h, rec, &retry.Options{Backoff: backoff.Constant{Interval: time.Minute}}, durableOnly)
				stop := runSessionConsumer(t, first)
				waitFor(t, b, func() bool { return len(b.Deferred()) == 2 })
				require.NoError(t, stop())
				fail = false
				// ...and woken on one whose clock is 10 s behind, with or without a sender.
				connect := b.SessionConnector()
				if !tc.sender {
					base := connect
					connect = func(ctx context.Context) (*retry.SessionConnection, error) {
						c, err := base(ctx)
						if c != nil {
							c.Sender = nil
						}
						return c, err
					}
				}
				sopts := &retry.SessionOptions{MaxHold: time.Nanosecond, DurableHolds: tc.sender, BlockAfterDeadLetter: !tc.sender}
				sc, err := retry.NewSessionConsumer(connect, h, &retry.Options{Logger: discardLogger(), Clock: skewedClock{10 * time.Second}}, sopts)
				require.NoError(t, err)
				stop = runSessionConsumer(t, sc)
				waitFor(t, b, func() bool { return successCount(rec, "s") == 2 })
				require.NoError(t, stop())
				assert.Equal(t, ids("s", 1, 2), rec.successesOf("s"))
				calls := rec.callsOf("s")
				assert.Equal(t, time.Minute, calls[1].At-calls[0].At, "run at the wake-up, not 10 s later")
				assert.False(t, sessionState(t, b, "s").Blocked())
			})
		})
	}
}

// With BlockAfterDeadLetter the block is recorded before the dead-letter: a record write that fails
// leaves the message unsettled (nothing runs past it), and a consumer stopped between the record and
// the dead-letter leaves the message for the next one to dead-letter. Either way the session ends
// blocked, with the message dead-lettered once and the later messages deferred.
func TestSessionBlockSurvivesFailures(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   retrytest.Op
	}{{"record write fails", retrytest.OpSessionState}, {"dead-letter fails after the record", retrytest.OpDeadLetter}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newSessionBroker(t, nil)
				sendSession(t, b, "s", 3)
				rec := newSessionRecorder()
				injected := false
				h := rec.handler(func(_ context.Context, c sessionCall) error {
					if c.ID == "s-1" {
						if !injected {
							injected = true
							b.Fail(tc.op, 1, errors.New("injected"))
						}
						return retry.Permanent(errors.New("bad"))
					}
					return nil
				})
				sc := newSessionConsumer(t, b, h, rec, nil, &retry.SessionOptions{BlockAfterDeadLetter: true})
				stop := runSessionConsumer(t, sc)
				waitFor(t, b, func() bool { return len(b.DeadLettered()) == 1 && len(b.Deferred()) == 2 })
				time.Sleep(5 * time.Minute)
				synctest.Wait()
				require.NoError(t, stop())
				assert.Len(t, b.DeadLettered(), 1)
				assert.Empty(t, rec.successesOf("s"), "nothing ran past the dead-lettered s-1")
				st := sessionState(t, b, "s")
				require.NotNil(t, st.Hold)
				assert.Equal(t, "RetryPermanentFailure", st.Hold.DeadLetterReason)
				assert.Len(t, st.Followers, 2)
			})
		})
	}
}

// A message whose sbretry-control property is not a wake-up is the application's: it reaches the
// handler.
func TestSessionControlPropertyOfTheApplication(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		_, err := b.Send(&azservicebus.Message{MessageID: strPtr("s-1"), SessionID: strPtr("s"), ApplicationProperties: map[string]any{sessionstate.PropControl: "pause"}})
		require.NoError(t, err)
		rec := newSessionRecorder()
		sc := newSessionConsumer(t, b, rec.handler(func(context.Context, sessionCall) error { return nil }), rec, nil, durableOnly)
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return successCount(rec, "s") == 1 })
		require.NoError(t, stop())
	})
}

// A consumer stopped after recording a dead-letter block but before the dead-letter, then an operator's
// release before any consumer takes the session again: the release puts the message at the head of
// the followers, so the next consumer finds it still deferred and runs it again, instead of leaving it
// deferred with no record naming it.
func TestSessionReleaseBeforeAPendingDeadLetter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 2)
		rec := newSessionRecorder()
		permanent := true
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			switch {
			case c.ID != "s-1":
				return nil
			case c.Attempt == 1:
				return errBoom // held durably: deferred
			case permanent:
				b.Fail(retrytest.OpDeadLetter, 1, errors.New("killed"))
				return retry.Permanent(errors.New("bad"))
			}
			return nil
		})
		ctx, cancel := context.WithCancel(t.Context())
		opts := &retry.Options{Backoff: backoff.Constant{Interval: time.Minute}}
		opts.Hooks.OnSettle = func(p retry.SettleParams) {
			if p.Operation == retry.SettleDeadLetter && p.Err != nil {
				cancel() // the process dies between the record and the dead-letter
			}
		}
		sopts := &retry.SessionOptions{MaxHold: time.Nanosecond, DurableHolds: true, BlockAfterDeadLetter: true}
		first := newSessionConsumer(t, b, h, rec, opts, sopts)
		done := make(chan error, 1)
		go func() { done <- first.Run(ctx) }()
		require.NoError(t, <-done)
		st := sessionState(t, b, "s")
		require.NotNil(t, st.Hold)
		require.NotEmpty(t, st.Hold.DeadLetterReason)
		require.Empty(t, b.DeadLettered(), "the dead-letter did not happen")

		r, err := acceptWhenFree(t, b, "s")
		require.NoError(t, err)
		plan, err := sessionstate.PlanRelease("s", st, time.Now())
		require.NoError(t, err)
		_, err = b.Sender().ScheduleMessages(t.Context(), []*azservicebus.Message{plan.Wake}, time.Time{}, nil)
		require.NoError(t, err)
		raw, err := sessionstate.Marshal(plan.After)
		require.NoError(t, err)
		require.NoError(t, r.SetSessionState(t.Context(), raw, nil))
		require.NoError(t, r.Close(t.Context()))

		permanent = false
		second := newSessionConsumer(t, b, h, rec, &retry.Options{Backoff: backoff.Constant{Interval: time.Minute}}, sopts)
		stop := runSessionConsumer(t, second)
		waitFor(t, b, func() bool { return successCount(rec, "s") == 2 })
		require.NoError(t, stop())
		assert.Equal(t, ids("s", 1, 2), rec.successesOf("s"), "s-1 ran again, then s-2")
		assert.Empty(t, b.Deferred())
		assert.False(t, sessionState(t, b, "s").Blocked())
	})
}

// retakenOnWrite is a session receiver whose first state write goes through only after the SDK took
// the session again (the new link's LockedUntil is later): what azservicebus does when the lock was
// lost before the call.
type retakenOnWrite struct {
	retry.SessionReceiver
	retaken *atomic.Bool
}

func (r retakenOnWrite) SetSessionState(ctx context.Context, state []byte, o *azservicebus.SetSessionStateOptions) error {
	err := r.SessionReceiver.SetSessionState(ctx, state, o)
	r.retaken.Store(true)
	return err
}

func (r retakenOnWrite) LockedUntil() time.Time {
	if r.retaken.Load() {
		return r.SessionReceiver.LockedUntil().Add(time.Second)
	}
	return r.SessionReceiver.LockedUntil()
}

// A record written only after the SDK took the session again may have replaced one another holder
// wrote in that moment: the consumer does not go on as if its view were the session's, but leaves the
// message unsettled and releases the session, so that the next holder starts from the broker's state
// (here the record it wrote, which holds the message as a stopped consumer's would).
func TestSessionStateWriteAfterTheSDKTookTheSessionAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 2)
		inner := b.SessionConnector()
		var accepts atomic.Int32
		connect := wrapAccepted(inner, func(r retry.SessionReceiver, n int) retry.SessionReceiver {
			accepts.Store(int32(n))
			if n > 1 {
				return r
			}
			return retakenOnWrite{SessionReceiver: r, retaken: new(atomic.Bool)}
		})
		rec := newSessionRecorder()
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.ID == "s-1" && c.Attempt < 2 {
				return errBoom
			}
			return nil
		})
		sc, err := retry.NewSessionConsumer(connect, h, &retry.Options{Logger: discardLogger(), Hooks: retry.Hooks{OnProcessed: rec.onProcessed},
			Backoff: backoff.Constant{Interval: time.Minute}}, durableOnly)
		require.NoError(t, err)
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return successCount(rec, "s") == 2 })
		require.NoError(t, stop())
		assert.Equal(t, []string{"s-1", "s-2"}, rec.successesOf("s"), "in order")
		rec.mu.Lock()
		defer rec.mu.Unlock()
		require.NotEmpty(t, rec.processed)
		first := rec.processed[0]
		assert.Equal(t, "s-1", first.Message.MessageID)
		assert.Equal(t, retry.OutcomeLeftForRedelivery, first.Result.Outcome, "not reported held: the session was released")
		assert.GreaterOrEqual(t, accepts.Load(), int32(2), "the session was accepted again")
		assert.Nil(t, sessionState(t, b, "s").Hold, "the hold ended once the message succeeded")
	})
}

// slowFalseDefer is a session receiver whose first defer takes 3 s and reports success without
// deferring: what azservicebus v1.11 can do with a settle it retried (soak/README.md findings 1 and 3).
type slowFalseDefer struct {
	retry.SessionReceiver
	lied *atomic.Bool
}

func (r slowFalseDefer) DeferMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.DeferMessageOptions) error {
	if r.lied.CompareAndSwap(false, true) {
		time.Sleep(3 * time.Second) // fake time: the SDK's retries
		return nil
	}
	return r.SessionReceiver.DeferMessage(ctx, m, o)
}

// A defer that succeeded only after the SDK retried it is doubted, as a complete is: the session is
// released rather than gone on with, so that a held message the defer left locked here is not taken
// for gone once due (which would run its followers first) but comes back, first, to run in order.
func TestSessionDurableHoldDoubtsASlowDefer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 2)
		inner := b.SessionConnector()
		lied := new(atomic.Bool)
		connect := wrapAccepted(inner, func(r retry.SessionReceiver, _ int) retry.SessionReceiver {
			return slowFalseDefer{SessionReceiver: r, lied: lied}
		})
		rec := newSessionRecorder()
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.ID == "s-1" && c.Attempt < 2 {
				return errBoom
			}
			return nil
		})
		// The retry is due 1 s after the failure: before the slow defer returns.
		sc, err := retry.NewSessionConsumer(connect, h, &retry.Options{Logger: discardLogger(), Hooks: retry.Hooks{OnProcessed: rec.onProcessed},
			Backoff: backoff.Constant{Interval: time.Second}}, durableOnly)
		require.NoError(t, err)
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return successCount(rec, "s") == 2 })
		require.NoError(t, stop())
		require.True(t, lied.Load())
		assert.Equal(t, []string{"s-1", "s-2"}, rec.successesOf("s"), "in order")
		rec.mu.Lock()
		defer rec.mu.Unlock()
		first := rec.processed[0]
		assert.Equal(t, retry.OutcomeDeferred, first.Result.Outcome)
		assert.True(t, first.Result.PossibleDuplicate, "the defer is doubted")
	})
}

// retakenOnReceive is a session receiver whose second receive comes back through a new link: the SDK
// took the session again after its lock was lost (its LockedUntil moves).
type retakenOnReceive struct {
	retry.SessionReceiver
	receives *atomic.Int32
	retaken  *atomic.Bool
}

func (r retakenOnReceive) ReceiveMessages(ctx context.Context, n int, o *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	msgs, err := r.SessionReceiver.ReceiveMessages(ctx, n, o)
	if len(msgs) > 0 && r.receives.Add(1) == 2 {
		r.retaken.Store(true)
	}
	return msgs, err
}

func (r retakenOnReceive) LockedUntil() time.Time {
	if r.retaken.Load() {
		return r.SessionReceiver.LockedUntil().Add(time.Second)
	}
	return r.SessionReceiver.LockedUntil()
}

// A call that finds the session taken again by the SDK (its lock was lost meanwhile, and another
// consumer may have held the session and changed its record) ends the session as a lost lock does: the
// message that call brought is not run on this consumer's view of the session, which may be stale, but
// goes back, and runs once the session is accepted afresh.
func TestSessionTakenAgainBySDKIsTreatedAsLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 2)
		inner := b.SessionConnector()
		var accepts atomic.Int32
		connect := wrapAccepted(inner, func(r retry.SessionReceiver, n int) retry.SessionReceiver {
			accepts.Store(int32(n))
			if n > 1 {
				return r
			}
			return retakenOnReceive{SessionReceiver: r, receives: new(atomic.Int32), retaken: new(atomic.Bool)}
		})
		rec := newSessionRecorder()
		var mu sync.Mutex
		var ran []string
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			mu.Lock()
			ran = append(ran, fmt.Sprintf("%s#%d", c.ID, accepts.Load()))
			mu.Unlock()
			return nil
		})
		sc, err := retry.NewSessionConsumer(connect, h, &retry.Options{Logger: discardLogger(), Hooks: retry.Hooks{OnProcessed: rec.onProcessed}}, durableOnly)
		require.NoError(t, err)
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return successCount(rec, "s") == 2 })
		require.NoError(t, stop())
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, []string{"s-1#1", "s-2#2"}, ran, "s-2 ran only once the session was accepted afresh")
	})
}

// Immediate retries are counted wherever the attempt resumes: with every retry made durable (MaxHold
// 1 ns, below ImmediateDelay), the first two retries wait ImmediateDelay, the third the backoff, and
// the count starts again after it, as before each delayed retry on a queue; it used to start again
// at every resumed hold, so the backoff was never used.
func TestSessionDurableHoldKeepsTheImmediateRetryCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 1)
		rec := newSessionRecorder()
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.Attempt < 5 {
				return errBoom
			}
			return nil
		})
		sc := newSessionConsumer(t, b, h, rec, &retry.Options{
			ImmediateRetries: 2, ImmediateDelay: time.Second, Backoff: backoff.Constant{Interval: 10 * time.Minute}, MaxAttempts: 5,
		}, durableOnly)
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return successCount(rec, "s") == 1 })
		require.NoError(t, stop())
		var gaps []time.Duration
		calls := rec.callsOf("s")
		for i := 1; i < len(calls); i++ {
			gaps = append(gaps, calls[i].At-calls[i-1].At)
		}
		assert.Equal(t, []time.Duration{time.Second, time.Second, 10 * time.Minute, time.Second}, gaps,
			"two immediate retries, then the backoff, then immediate retries again (before each delayed one)")
		assert.Empty(t, b.DeadLettered())
	})
}

// A durable hold's broker calls reach the hooks as a delayed retry's do: OnRetryCopy sees the held
// message (what it adds is written on the deferral, where the resumed attempt reads it), OnSettle
// the wake-up's schedule (named by its id), the defer, and the wake-up's complete once done.
func TestSessionDurableHoldReportsItsCallsToTheHooks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 1)
		rec := newSessionRecorder()
		var mu sync.Mutex
		var calls []string
		var resumedSaw any
		h := rec.handler(func(ctx context.Context, c sessionCall) error {
			if c.Attempt == 1 {
				return errBoom
			}
			return nil
		})
		opts := &retry.Options{Backoff: backoff.Constant{Interval: time.Minute}, Hooks: retry.Hooks{
			OnRetryCopy: func(p retry.RetryCopyParams) {
				mu.Lock()
				defer mu.Unlock()
				calls = append(calls, fmt.Sprintf("copy %s attempt %d", *p.Copy.MessageID, p.Attempt))
				p.Copy.ApplicationProperties["traceparent"] = "00-held"
				p.Copy.ApplicationProperties[envelope.PropAttempt] = int64(99) // ours are restored
			},
			OnSettle: func(p retry.SettleParams) {
				mu.Lock()
				defer mu.Unlock()
				what := p.Message.MessageID
				if _, wake := sessionstate.IsWakeUp(p.Message); wake {
					what = "wake-up"
				}
				calls = append(calls, fmt.Sprintf("%s %s %v", p.Operation, what, p.RetryMessageID != ""))
			},
			OnStart: func(p retry.StartParams) context.Context {
				if p.Envelope.Attempt == 2 {
					resumedSaw = p.Message.ApplicationProperties["traceparent"]
				}
				return nil
			},
		}}
		sc := newSessionConsumer(t, b, h, rec, opts, durableOnly)
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return successCount(rec, "s") == 1 })
		// s-1 and its wake-up completed; then every goroutine idle, so the hook of the last
		// complete has run too.
		waitFor(t, b, func() bool { return len(b.Completed()) == 2 && !sessionState(t, b, "s").Blocked() })
		synctest.Wait()
		require.NoError(t, stop())
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, []string{
			"copy s-1 attempt 2",
			"schedule s-1 true", // the wake-up, named by its id
			"defer s-1 false",
			"complete s-1 false",
			"complete wake-up false",
		}, calls)
		assert.Equal(t, "00-held", resumedSaw, "the resumed attempt reads what OnRetryCopy wrote on the deferral")
		assert.Empty(t, b.DeadLettered())
	})
}

// A success this process decided and could not settle is not applied to the message once another
// process has moved it on: here another consumer held it durably at attempt 2 since, so at the wake-up
// the handler runs attempt 2 rather than the stale attempt 1's success being completed.
func TestSessionInheritsNoDecisionFromAnEarlierAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 1)
		opts := func(rec *sessionRecorder) *retry.Options {
			return &retry.Options{Backoff: backoff.Constant{Interval: time.Minute}, Logger: discardLogger(), Hooks: retry.Hooks{OnProcessed: rec.onProcessed}}
		}
		// A: its first success cannot be completed (the connection drops); it pauses at once, so that it
		// does not take the session back before B does, and stops.
		recA := newSessionRecorder()
		b.Fail(retrytest.OpComplete, 1, &azservicebus.Error{Code: azservicebus.CodeConnectionLost})
		var a *retry.SessionConsumer
		optsA := opts(recA)
		optsA.Hooks.OnProcessed = func(p retry.ProcessedParams) {
			recA.onProcessed(p)
			if p.Result.Outcome == retry.OutcomeLeftForRedelivery {
				a.Pause("let another process take the session")
			}
		}
		a, err := retry.NewSessionConsumer(b.SessionConnector(), recA.handler(func(context.Context, sessionCall) error { return nil }), optsA, durableOnly)
		require.NoError(t, err)
		stopA := runSessionConsumer(t, a)
		waitFor(t, b, func() bool {
			recA.mu.Lock()
			defer recA.mu.Unlock()
			return len(recA.processed) == 1
		})
		require.NoError(t, stopA())
		require.Equal(t, retry.OutcomeLeftForRedelivery, recA.processed[0].Result.Outcome)

		// B, another process: the message fails there and is held durably at attempt 2.
		recB := newSessionRecorder()
		bc, err := retry.NewSessionConsumer(b.SessionConnector(), recB.handler(func(context.Context, sessionCall) error { return errBoom }), opts(recB), durableOnly)
		require.NoError(t, err)
		stopB := runSessionConsumer(t, bc)
		waitFor(t, b, func() bool { return len(b.Deferred()) == 1 })
		require.NoError(t, stopB())
		require.Equal(t, 2, sessionState(t, b, "s").Hold.Attempt)

		// A again, past the wake-up: attempt 2 runs; nothing is inherited from attempt 1.
		a.Resume()
		stopA = runSessionConsumer(t, a)
		waitFor(t, b, func() bool { return successCount(recA, "s") == 2 && len(b.Deferred()) == 0 })
		require.NoError(t, stopA())
		calls := recA.callsOf("s")
		require.Len(t, calls, 2, "A's handler ran again, for attempt 2")
		assert.Equal(t, 2, calls[1].Attempt)
		for _, p := range recA.processed {
			assert.False(t, p.Result.Inherited, "%s attempt %d inherited", p.Message.MessageID, p.Result.Attempt)
		}
	})
}
