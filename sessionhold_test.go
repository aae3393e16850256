package retry_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
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
)

// The second message of a session fails twice: it is retried in place after each backoff, the
// session's later messages wait for it, and the successes are in order.
func TestSessionOrderAcrossTransientFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s1", 4)
		rec := newSessionRecorder()
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.ID == "s1-2" && c.Attempt < 3 {
				return errBoom
			}
			return nil
		})
		sc := newSessionConsumer(t, b, h, rec, &retry.Options{Backoff: backoff.Constant{Interval: 7 * time.Second}}, nil)
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 4 })
		require.NoError(t, stop())

		assert.Equal(t, ids("s1", 1, 2, 3, 4), rec.successesOf("s1"))
		calls := rec.callsOf("s1")
		require.Len(t, calls, 6)
		var order []string
		for _, c := range calls {
			order = append(order, fmt.Sprintf("%s#%d", c.ID, c.Attempt))
		}
		assert.Equal(t, []string{"s1-1#1", "s1-2#1", "s1-2#2", "s1-2#3", "s1-3#1", "s1-4#1"}, order, "nothing of the session runs while s1-2 is held")
		assert.Equal(t, 7*time.Second, calls[2].At-calls[1].At, "the backoff's delay, on the clock")
		assert.Equal(t, 7*time.Second, calls[3].At-calls[2].At)

		require.Len(t, rec.processed, 4, "OnProcessed once per message")
		for _, p := range rec.processed {
			assert.Equal(t, retry.OutcomeCompleted, p.Result.Outcome, p.Message.MessageID)
			assert.Equal(t, retrytest.DefaultEntityPath, p.EntityPath)
		}
		assert.Equal(t, 3, rec.processed[1].Result.Attempt)
		h2 := sc.Health()
		assert.Equal(t, uint64(4), h2.Received)
		assert.Equal(t, uint64(4), h2.Completed)
		assert.Equal(t, 0, h2.InFlight)
		assert.Equal(t, retry.StateStopped, h2.State)
		for _, m := range b.Completed() {
			assert.Equal(t, uint32(1), m.DeliveryCount, "held in place, never redelivered: %s", m.MessageID)
		}
	})
}

// While one session is held, the others proceed.
func TestSessionOthersProceedWhileOneHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "held", 2)
		sendSession(t, b, "free", 3)
		rec := newSessionRecorder()
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.ID == "held-1" && c.Attempt == 1 {
				return errBoom
			}
			return nil
		})
		sc := newSessionConsumer(t, b, h, rec, &retry.Options{Backoff: backoff.Constant{Interval: time.Minute}}, &retry.SessionOptions{MaxConcurrentSessions: 2})
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 5 })
		require.NoError(t, stop())

		assert.Equal(t, ids("free", 1, 2, 3), rec.successesOf("free"))
		assert.Equal(t, ids("held", 1, 2), rec.successesOf("held"))
		free, held := rec.callsOf("free"), rec.callsOf("held")
		require.Len(t, held, 3)
		assert.Less(t, free[2].At, held[1].At, "the free session finished during the hold")
		assert.Equal(t, time.Minute, held[1].At-held[0].At)
	})
}

// Permanent failures and spent attempts dead-letter with their reasons; the session goes on.
func TestSessionDeadLettersAndContinues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 3)
		rec := newSessionRecorder()
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			switch c.ID {
			case "s-1":
				return retry.Permanent(errors.New("malformed order"))
			case "s-2":
				return errBoom
			}
			return nil
		})
		sc := newSessionConsumer(t, b, h, rec, &retry.Options{MaxAttempts: 3, Backoff: backoff.Constant{Interval: time.Second}}, nil)
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 1 && len(b.DeadLettered()) == 2 })
		require.NoError(t, stop())

		dl := b.DeadLettered()
		require.Len(t, dl, 2)
		assert.Equal(t, "s-1", dl[0].Message.MessageID)
		assert.Equal(t, "RetryPermanentFailure", dl[0].Reason)
		assert.Equal(t, "malformed order", dl[0].Description)
		assert.Equal(t, "s-2", dl[1].Message.MessageID)
		assert.Equal(t, "RetryMaxAttemptsExceeded", dl[1].Reason)
		assert.Equal(t, int64(3), dl[1].Message.ApplicationProperties[envelope.PropDeadLetterAttempt])
		assert.Equal(t, []string{"s-3"}, rec.successesOf("s"))
		assert.Len(t, rec.callsOf("s"), 1+3+1)
		h2 := sc.Health()
		assert.Equal(t, uint64(2), h2.DeadLettered)
		assert.Equal(t, uint64(1), h2.Completed)
	})
}

// A retry that would end after MaxHold is not waited for: the message is dead-lettered with
// RetrySessionHoldExceeded.
func TestSessionMaxHoldExceeded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 2)
		rec := newSessionRecorder()
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.ID == "s-1" {
				return errBoom
			}
			return nil
		})
		sc := newSessionConsumer(t, b, h, rec, &retry.Options{MaxAttempts: 10, Backoff: backoff.Constant{Interval: 2 * time.Minute}},
			&retry.SessionOptions{MaxHold: 5 * time.Minute})
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 1 })
		require.NoError(t, stop())

		calls := rec.callsOf("s")
		require.Len(t, calls, 4, "attempts at 0, 2 and 4 min; the one at 6 min would end the hold after 5")
		assert.Equal(t, 4*time.Minute, calls[2].At-calls[0].At)
		dl := b.DeadLettered()
		require.Len(t, dl, 1)
		assert.Equal(t, "RetrySessionHoldExceeded", dl[0].Reason)
		assert.Equal(t, []string{"s-2"}, rec.successesOf("s"))
	})
}

// A shutdown during a hold does not wait for it: the held message goes back to its session unsettled,
// in order and without an attempt counted, and the next consumer takes it from there.
func TestSessionShutdownDuringHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 3)
		rec := newSessionRecorder()
		failed := make(chan struct{})
		first := true
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.ID == "s-2" && first {
				first = false
				close(failed)
				return errBoom
			}
			return nil
		})
		sc := newSessionConsumer(t, b, h, rec, &retry.Options{Backoff: backoff.Constant{Interval: time.Minute}}, nil)
		stop := runSessionConsumer(t, sc)
		<-failed
		synctest.Wait() // the hold has begun
		start := time.Now()
		require.NoError(t, stop())
		assert.Zero(t, time.Since(start), "the hold is abandoned at once")
		st := b.Stats()
		assert.Equal(t, 2, st.Active, "s-2 and s-3 are back in the session")
		assert.Equal(t, 0, st.Locked)
		require.Len(t, rec.processed, 2)
		assert.Equal(t, retry.OutcomeLeftForRedelivery, rec.processed[1].Result.Outcome)

		sc2 := newSessionConsumer(t, b, h, rec, nil, nil)
		stop = runSessionConsumer(t, sc2)
		waitFor(t, b, func() bool { return len(b.Completed()) == 3 })
		require.NoError(t, stop())
		assert.Equal(t, ids("s", 1, 2, 3), rec.successesOf("s"))
		calls := rec.callsOf("s")
		require.Len(t, calls, 4)
		assert.Equal(t, "s-2", calls[2].ID)
		assert.Equal(t, 1, calls[2].Attempt, "the abandoned hold counted no attempt")
		for _, m := range b.Completed() {
			assert.Equal(t, uint32(1), m.DeliveryCount, "closing the receiver does not count a delivery: %s", m.MessageID)
		}
	})
}

// The policies apply to holds in place as to delayed retries: a rule may discard, the first retries
// wait ImmediateDelay, and RetryAfter replaces the backoff's delay within its cap.
func TestSessionHoldPolicies(t *testing.T) {
	errGone := errors.New("order deleted")
	errThrottled := errors.New("throttled")
	cases := []struct {
		name    string
		opts    retry.Options
		fail    func(c sessionCall) error
		gaps    []time.Duration // between the calls of s-1
		outcome retry.Outcome
		counter func(h retry.Health) uint64
		want    uint64
	}{
		{
			name: "discard",
			opts: retry.Options{Policies: []retry.Rule{{Name: "gone", Match: retry.ErrorIs(errGone), Policy: retry.Policy{Action: retry.ActionDiscard}}}},
			fail: func(sessionCall) error { return errGone },
			gaps: []time.Duration{}, outcome: retry.OutcomeDiscarded,
			counter: func(h retry.Health) uint64 { return h.Discarded }, want: 1,
		},
		{
			name: "immediate retries first",
			opts: retry.Options{ImmediateRetries: 1, ImmediateDelay: 100 * time.Millisecond, Backoff: backoff.Constant{Interval: 10 * time.Second}},
			fail: func(c sessionCall) error {
				if c.Attempt < 3 {
					return errBoom
				}
				return nil
			},
			gaps: []time.Duration{100 * time.Millisecond, 10 * time.Second}, outcome: retry.OutcomeCompleted,
			counter: func(h retry.Health) uint64 { return h.Completed }, want: 2,
		},
		{
			name: "RetryAfter ends the immediate retries",
			opts: retry.Options{ImmediateRetries: 2, ImmediateDelay: 100 * time.Millisecond, Backoff: backoff.Constant{Interval: 10 * time.Second}},
			fail: func(c sessionCall) error {
				if c.Attempt < 3 {
					return retry.RetryAfter(30*time.Second, errThrottled)
				}
				return nil
			},
			gaps: []time.Duration{10 * time.Second, 10 * time.Second}, outcome: retry.OutcomeCompleted,
			counter: func(h retry.Health) uint64 { return h.Completed }, want: 2,
		},
		{
			name: "RetryAfter within the cap",
			opts: retry.Options{Backoff: backoff.Exponential{Base: time.Second, Cap: 30 * time.Second}},
			fail: func(c sessionCall) error {
				switch c.Attempt {
				case 1:
					return retry.RetryAfter(3*time.Second, errThrottled)
				case 2:
					return retry.RetryAfter(time.Hour, errThrottled)
				}
				return nil
			},
			gaps: []time.Duration{3 * time.Second, 30 * time.Second}, outcome: retry.OutcomeCompleted,
			counter: func(h retry.Health) uint64 { return h.Completed }, want: 2,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newSessionBroker(t, nil)
				sendSession(t, b, "s", 2)
				rec := newSessionRecorder()
				h := rec.handler(func(_ context.Context, c sessionCall) error {
					if c.ID == "s-1" {
						return tc.fail(c)
					}
					return nil
				})
				opts := tc.opts
				sc := newSessionConsumer(t, b, h, rec, &opts, nil)
				stop := runSessionConsumer(t, sc)
				waitFor(t, b, func() bool { return len(b.Completed()) == 2 })
				require.NoError(t, stop())
				var gaps []time.Duration
				calls := rec.callsOf("s")
				for i := 1; i < len(calls)-1; i++ {
					gaps = append(gaps, calls[i].At-calls[i-1].At)
				}
				assert.Equal(t, tc.gaps, append([]time.Duration{}, gaps...), "the waits between the attempts of s-1")
				require.Len(t, rec.processed, 2)
				assert.Equal(t, tc.outcome, rec.processed[0].Result.Outcome)
				assert.Equal(t, "s-2", calls[len(calls)-1].ID, "the session went on after s-1")
				assert.Equal(t, tc.want, tc.counter(sc.Health()))
			})
		})
	}
}

// A complete that fails leaves the message unsettled and releases the session, so that it comes back
// before the messages behind it, never out of order. Its success was decided here, so the redelivery
// completes it without running the handler again (flights.go).
func TestSessionFailedSettleReleasesTheSession(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 3)
		b.Fail(retrytest.OpComplete, 1, &azservicebus.Error{Code: azservicebus.CodeConnectionLost})
		rec := newSessionRecorder()
		h := rec.handler(func(context.Context, sessionCall) error { return nil })
		sc := newSessionConsumer(t, b, h, rec, nil, &retry.SessionOptions{MaxConcurrentSessions: 1})
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 3 })
		require.NoError(t, stop())
		assert.Equal(t, []string{"s-1", "s-2", "s-3"}, rec.successesOf("s"), "each handler once")
		require.Len(t, rec.processed, 4)
		assert.Equal(t, retry.OutcomeLeftForRedelivery, rec.processed[0].Result.Outcome)
		assert.True(t, rec.processed[1].Result.Inherited, "s-1's redelivery applied the decided success")
		assert.Equal(t, retry.OutcomeCompleted, rec.processed[1].Result.Outcome)
		var sbErr *azservicebus.Error
		require.ErrorAs(t, rec.processed[0].Result.SettleErr, &sbErr)
		assert.Equal(t, azservicebus.CodeConnectionLost, sbErr.Code)
	})
}

// lyingReceiver is a session receiver whose first complete takes 3 s and reports success without
// completing anything, as azservicebus v1.11 does for a retried settle the broker had rejected
// (soak/README.md findings 1 and 3).
type lyingReceiver struct {
	retry.SessionReceiver
	lied *atomic.Bool
}

func (l lyingReceiver) CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.CompleteMessageOptions) error {
	if l.lied.CompareAndSwap(false, true) {
		time.Sleep(3 * time.Second)
		return nil
	}
	return l.SessionReceiver.CompleteMessage(ctx, m, o)
}

// A complete that succeeded only after the SDK retried it is doubted: the session is released, so
// that the message, still there, comes back before its successor, never after it; its redelivery
// completes it as decided, without running the handler again.
func TestSessionDoubtedCompleteKeepsOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, &retrytest.BrokerOptions{LockDuration: 30 * time.Second})
		sendSession(t, b, "s", 2)
		rec := newSessionRecorder()
		var lied atomic.Bool
		base := b.SessionConnector()
		connect := wrapAccepted(base, func(r retry.SessionReceiver, _ int) retry.SessionReceiver {
			return lyingReceiver{SessionReceiver: r, lied: &lied}
		})
		sc, err := retry.NewSessionConsumer(connect, rec.handler(func(context.Context, sessionCall) error { return nil }),
			&retry.Options{Logger: discardLogger(), Hooks: retry.Hooks{OnProcessed: rec.onProcessed}}, nil)
		require.NoError(t, err)
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 2 })
		require.NoError(t, stop())
		assert.Equal(t, ids("s", 1, 2), rec.successesOf("s"), "each handler once")
		require.Len(t, rec.processed, 3)
		assert.True(t, rec.processed[0].Result.PossibleDuplicate)
		assert.True(t, rec.processed[1].Result.Inherited, "s-1 came back before s-2, and was completed as decided")
		assert.Equal(t, "s-1", rec.processed[1].Message.MessageID)
		assert.Equal(t, uint64(1), sc.Health().PossibleDuplicates)
	})
}

// A retry held in place is logged as the queue consumer logs a scheduled retry: "retry scheduled" at
// INFO, with the next attempt, the delay and the error, and where it waits.
func TestSessionRetryLoggedAsTheQueueConsumerLogsIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs bytes.Buffer
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 1)
		calls := 0
		sc := newSessionConsumer(t, b, func(context.Context, *azservicebus.ReceivedMessage) error {
			calls++
			if calls == 1 {
				return errBoom
			}
			return nil
		}, nil, &retry.Options{Backoff: backoff.Constant{Interval: 10 * time.Second}, Logger: slog.New(slog.NewJSONHandler(&lockedWriter{w: &logs}, nil))}, nil)
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 1 })
		require.NoError(t, stop())
		assert.Regexp(t, `"level":"INFO","msg":"retry scheduled","message_id":"s-1",.*"next_attempt":2,"delay":10000000000,.*"held_in":"session","session_id":"s","handler_error":"downstream unavailable"`, logs.String())
	})
}

// Held in place, immediate retries come before each delayed retry, as on a queue: two quick ones, a
// backoff, two quick ones again.
func TestSessionHoldInPlaceImmediateRetriesBeforeEachDelayedOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 1)
		rec := newSessionRecorder()
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.Attempt < 6 {
				return errBoom
			}
			return nil
		})
		sc := newSessionConsumer(t, b, h, rec, &retry.Options{
			ImmediateRetries: 2, ImmediateDelay: time.Second, Backoff: backoff.Constant{Interval: time.Minute}, MaxAttempts: 6,
		}, nil)
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 1 })
		require.NoError(t, stop())
		var gaps []time.Duration
		calls := rec.callsOf("s")
		for i := 1; i < len(calls); i++ {
			gaps = append(gaps, calls[i].At-calls[i-1].At)
		}
		assert.Equal(t, []time.Duration{time.Second, time.Second, time.Minute, time.Second, time.Second}, gaps)
		require.Len(t, rec.processed, 1)
		assert.Equal(t, 4, rec.processed[0].Result.ImmediateRetries)
	})
}
