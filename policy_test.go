package retry_test

import (
	"context"
	"errors"
	"strings"
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

var (
	errValidation = errors.New("validation failed")
	errGone       = errors.New("customer deleted")
)

type throttleError struct{ after time.Duration }

func (e *throttleError) Error() string { return "throttled" }

func failWith(err error) retry.Handler {
	return func(context.Context, *azservicebus.ReceivedMessage) error { return err }
}

// policies is a chain with one rule of each kind.
func policies() []retry.Rule {
	return []retry.Rule{
		{Name: "validation", Match: retry.ErrorIs(errValidation), Policy: retry.Policy{Action: retry.ActionDeadLetter, Reason: "InvalidOrder"}},
		{Name: "gone", Match: retry.ErrorIs(errGone), Policy: retry.Policy{Action: retry.ActionDiscard}},
		{Name: "throttled", Match: retry.ErrorAs[*throttleError](), Policy: retry.Policy{Backoff: backoff.Constant{Interval: time.Minute}, MaxAttempts: 3}},
		{Name: "also validation", Match: retry.ErrorIs(errValidation), Policy: retry.Policy{Action: retry.ActionDiscard}},
	}
}

func TestPolicyChoosesByError(t *testing.T) {
	cases := []struct {
		name       string
		err        error
		attempt    int // of the delivery processed
		outcome    retry.Outcome
		reason     string
		delay      time.Duration
		policy     string
		completed  int
		deadLetter int
	}{
		{name: "first match wins", err: errValidation, attempt: 1, outcome: retry.OutcomeDeadLettered, reason: "InvalidOrder", policy: "validation", deadLetter: 1},
		{name: "wrapped errors match by errors.Is", err: errors.Join(errors.New("ctx"), errGone), attempt: 1, outcome: retry.OutcomeDiscarded, policy: "gone", completed: 1},
		{name: "errors.As with its own backoff", err: &throttleError{}, attempt: 1, outcome: retry.OutcomeRetryScheduled, delay: time.Minute, policy: "throttled", completed: 1},
		{name: "its own max attempts", err: &throttleError{}, attempt: 3, outcome: retry.OutcomeDeadLettered, reason: "RetryMaxAttemptsExceeded", policy: "throttled", deadLetter: 1},
		{name: "RetryAfter replaces the rule's backoff", err: retry.RetryAfter(2*time.Minute, &throttleError{}), attempt: 1, outcome: retry.OutcomeRetryScheduled, delay: time.Minute, policy: "throttled", completed: 1},
		{name: "Permanent comes before the rules", err: retry.Permanent(errGone), attempt: 1, outcome: retry.OutcomeDeadLettered, reason: "RetryPermanentFailure", deadLetter: 1},
		{name: "no rule: the Options", err: errBoom, attempt: 1, outcome: retry.OutcomeRetryScheduled, delay: 10 * time.Second, completed: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, failWith(tc.err), &retry.Options{Policies: policies()})
			msg := sampleMessage()
			if tc.attempt > 1 {
				msg.ApplicationProperties[envelope.PropAttempt] = int64(tc.attempt)
			}
			f.broker.Send(msg)
			res := f.process()
			assert.Equal(t, tc.outcome, res.Outcome)
			assert.Equal(t, tc.policy, res.Policy)
			assert.Equal(t, tc.reason, res.DeadLetterReason)
			assert.Equal(t, tc.delay, res.Delay)
			assert.Len(t, f.broker.Completed(), tc.completed)
			assert.Len(t, f.broker.DeadLettered(), tc.deadLetter)
			if tc.outcome == retry.OutcomeDiscarded {
				assert.Empty(t, f.broker.Scheduled())
				assert.Contains(t, f.logs.String(), "message discarded by its retry policy")
				assert.Contains(t, f.logs.String(), `"policy":"gone"`)
			}
		})
	}
}

// The RetryAfter case above asks for more than the rule's Constant backoff allows: the rule's cap
// bounds it. Below its cap, RetryAfter's delay is taken as asked.
func TestPolicyRetryAfterWithinTheRulesCap(t *testing.T) {
	f := newFixture(t, failWith(retry.RetryAfter(5*time.Second, &throttleError{})), &retry.Options{
		Policies: []retry.Rule{{Match: retry.ErrorAs[*throttleError](), Policy: retry.Policy{Backoff: backoff.Exponential{Base: time.Second, Floor: time.Second, Cap: time.Hour}}}},
	})
	f.broker.Send(sampleMessage())
	res := f.process()
	require.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
	assert.Equal(t, 5*time.Second, res.Delay)
	assert.Equal(t, "rule 0", res.Policy, "an unnamed rule is named by its index")
}

func TestPolicyMatchThatPanicsDoesNotMatch(t *testing.T) {
	f := newFixture(t, failWith(errBoom), &retry.Options{Policies: []retry.Rule{
		{Name: "bad", Match: func(error) bool { panic("nil map") }, Policy: retry.Policy{Action: retry.ActionDiscard}},
	}})
	f.broker.Send(sampleMessage())
	res := f.process()
	assert.Equal(t, retry.OutcomeRetryScheduled, res.Outcome, "the Options' policy")
	assert.Contains(t, f.logs.String(), "Match panicked")
}

func TestImmediateRetriesBeforeTheDelayedOne(t *testing.T) {
	type seen struct {
		attempt   int
		lastError string
	}
	cases := []struct {
		name        string
		failures    int // the handler fails this many times, then succeeds
		opts        retry.Options
		outcome     retry.Outcome
		attempts    []seen
		immediate   int
		copyAttempt int
	}{
		{
			name: "success on the second immediate retry", failures: 2, opts: retry.Options{ImmediateRetries: 3},
			outcome: retry.OutcomeCompleted, immediate: 2,
			attempts: []seen{{1, ""}, {2, "downstream unavailable"}, {3, "downstream unavailable"}},
		},
		{
			name: "all immediate retries fail: a delayed one after", failures: 100, opts: retry.Options{ImmediateRetries: 2},
			outcome: retry.OutcomeRetryScheduled, immediate: 2, copyAttempt: 4,
			attempts: []seen{{1, ""}, {2, "downstream unavailable"}, {3, "downstream unavailable"}},
		},
		{
			name: "MaxAttempts counts them", failures: 100, opts: retry.Options{ImmediateRetries: 5, MaxAttempts: 2},
			outcome: retry.OutcomeDeadLettered, immediate: 1,
			attempts: []seen{{1, ""}, {2, "downstream unavailable"}},
		},
		{
			name: "a rule's own count", failures: 100, opts: retry.Options{ImmediateRetries: 5, Policies: []retry.Rule{
				{Match: retry.ErrorIs(errBoom), Policy: retry.Policy{ImmediateRetries: -1}},
			}},
			outcome: retry.OutcomeRetryScheduled, copyAttempt: 2, attempts: []seen{{1, ""}},
		},
		{
			name: "default: none", failures: 100,
			outcome: retry.OutcomeRetryScheduled, copyAttempt: 2, attempts: []seen{{1, ""}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []seen
			f := newFixture(t, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
				env, ok := envelope.FromContext(ctx)
				require.True(t, ok)
				got = append(got, seen{env.Attempt, env.LastError})
				if len(got) <= tc.failures {
					return errBoom
				}
				return nil
			}, &tc.opts)
			f.broker.Send(sampleMessage())
			res := f.process()
			assert.Equal(t, tc.outcome, res.Outcome)
			assert.Equal(t, tc.attempts, got)
			assert.Equal(t, tc.immediate, res.ImmediateRetries)
			assert.Equal(t, tc.attempts[len(tc.attempts)-1].attempt, res.Attempt)
			if tc.copyAttempt > 0 {
				sched := f.broker.Scheduled()
				require.Len(t, sched, 1)
				assert.Equal(t, tc.copyAttempt, sched[0].Attempt)
				assert.Equal(t, chainOf(1).RetryMessageID(tc.copyAttempt), sched[0].MessageID)
			} else {
				assert.Empty(t, f.broker.Scheduled())
			}
		})
	}
}

func TestImmediateRetriesSkipPermanentAndOtherActions(t *testing.T) {
	for _, err := range []error{retry.Permanent(errBoom), errValidation, errGone} {
		calls := 0
		f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error {
			calls++
			return err
		}, &retry.Options{ImmediateRetries: 3, Policies: policies()})
		f.broker.Send(sampleMessage())
		f.process()
		assert.Equal(t, 1, calls, "%v: no immediate retry for a failure that is not retried", err)
	}
}

// A handler that answers RetryAfter (a 429) asked for its delay: no immediate retry calls it again
// at once, and the delayed retry is due after the delay it asked for, within the backoff's cap.
func TestRetryAfterEndsImmediateRetries(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after time.Duration
		want  time.Duration
	}{
		{"its own delay", 30 * time.Second, 30 * time.Second},
		{"capped by the backoff", 30 * time.Minute, 10 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error {
				calls++
				return retry.RetryAfter(tc.after, errBoom)
			}, &retry.Options{ImmediateRetries: 2, Backoff: backoff.Exponential{Base: time.Second, Cap: 10 * time.Minute}})
			f.broker.Send(sampleMessage())
			res := f.process()
			assert.Equal(t, 1, calls, "no immediate retry after RetryAfter")
			assert.Equal(t, 0, res.ImmediateRetries)
			assert.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
			assert.Equal(t, tc.want, res.Delay)
		})
	}
}

func TestImmediateDelayWaitsOnTheClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var at []time.Duration
		start := time.Now()
		b, r, p := bubbleProcessor(t, func(context.Context, *azservicebus.ReceivedMessage) error {
			at = append(at, time.Since(start))
			return errBoom
		}, &retry.Options{ImmediateRetries: 2, ImmediateDelay: 300 * time.Millisecond})
		b.Send(sampleMessage())
		res := p.Process(t.Context(), r, receiveNow(t, r))
		assert.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
		assert.Equal(t, []time.Duration{0, 300 * time.Millisecond, 600 * time.Millisecond}, at)
	})
}

func TestShutdownDuringAnImmediateDelayLeavesTheMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		b, r, p := bubbleProcessor(t, func(context.Context, *azservicebus.ReceivedMessage) error {
			calls++
			return errBoom
		}, &retry.Options{ImmediateRetries: 2, ImmediateDelay: time.Minute})
		b.Send(sampleMessage())
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(30*time.Second, cancel)
		res := p.Process(ctx, r, receiveNow(t, r))
		assert.Equal(t, retry.OutcomeLeftForRedelivery, res.Outcome)
		assert.Equal(t, 1, calls)
		assert.Empty(t, b.Scheduled(), "no attempt counted")
		assert.Empty(t, b.Completed())
	})
}

func TestPolicyOptionsAreValidated(t *testing.T) {
	match := retry.ErrorIs(errBoom)
	cases := []struct {
		name  string
		opts  retry.Options
		field string
	}{
		{"negative immediate retries", retry.Options{ImmediateRetries: -1}, "ImmediateRetries"},
		{"too many immediate retries", retry.Options{ImmediateRetries: 101}, "ImmediateRetries"},
		{"negative immediate delay", retry.Options{ImmediateDelay: -time.Second}, "ImmediateDelay"},
		{"too long an immediate delay", retry.Options{ImmediateDelay: 2 * time.Minute}, "ImmediateDelay"},
		{"rule without Match", retry.Options{Policies: []retry.Rule{{}}}, "Policies[0].Match"},
		{"unknown action", retry.Options{Policies: []retry.Rule{{Match: match, Policy: retry.Policy{Action: 9}}}}, "Policies[0].Policy.Action"},
		{"backoff", retry.Options{Backoff: backoff.Fibonacci{Floor: time.Hour, Cap: time.Minute}}, "Backoff"},
		{"rule backoff", retry.Options{Policies: []retry.Rule{{Match: match}, {Match: match, Policy: retry.Policy{Backoff: backoff.Constant{Interval: -1}}}}}, "Policies[1].Policy.Backoff"},
		{"rule delay", retry.Options{Policies: []retry.Rule{{Match: match, Policy: retry.Policy{ImmediateDelay: time.Hour}}}}, "Policies[0].Policy.ImmediateDelay"},
		{"rule attempts", retry.Options{Policies: []retry.Rule{{Match: match, Policy: retry.Policy{MaxAttempts: -2}}}}, "Policies[0].Policy.MaxAttempts"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := retry.NewProcessor(nopSender{}, okHandler, &tc.opts)
			require.ErrorIs(t, err, retry.ErrInvalidOptions)
			var oe *retry.OptionError
			require.ErrorAs(t, err, &oe)
			assert.Equal(t, tc.field, oe.Field)
		})
	}
}

func TestActionStrings(t *testing.T) {
	for a, want := range map[retry.Action]string{retry.ActionRetry: "retry", retry.ActionDeadLetter: "dead-letter", retry.ActionDiscard: "discard", 7: "unknown"} {
		assert.Equal(t, want, a.String())
	}
	assert.True(t, strings.HasPrefix(retry.OutcomeHeld.String(), "held"))
	assert.Equal(t, "discarded", retry.OutcomeDiscarded.String())
}

func TestLockLostDuringAnImmediateDelayLeavesTheMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		b, r, p := bubbleProcessor(t, func(context.Context, *azservicebus.ReceivedMessage) error {
			calls++
			return errBoom
		}, &retry.Options{ImmediateRetries: 2, ImmediateDelay: 50 * time.Second, LockDuration: time.Minute})
		b.Send(sampleMessage())
		b.Fail(retrytest.OpRenew, 100, &azservicebus.Error{Code: azservicebus.CodeLockLost})
		res := p.Process(t.Context(), r, receiveNow(t, r))
		assert.Equal(t, retry.OutcomeLeftForRedelivery, res.Outcome)
		require.ErrorIs(t, res.SettleErr, retry.ErrLockLost)
		assert.Equal(t, 1, calls, "no immediate retry after the lock is gone")
		assert.Empty(t, b.Scheduled())
	})
}

// A caller's deadline is a failed attempt with or without immediate retries: they stop, and the
// failure is decided (here: a delayed retry), never left for an immediate redelivery.
func TestDeadlineEndsImmediateRetries(t *testing.T) {
	for _, imm := range []int{0, 2} {
		calls := 0
		f := newFixture(t, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
			calls++
			return ctx.Err()
		}, &retry.Options{ImmediateRetries: imm})
		f.broker.Send(sampleMessage())
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		res := f.proc.Process(ctx, f.recv, f.receiveOne())
		cancel()
		assert.Equal(t, retry.OutcomeRetryScheduled, res.Outcome, "ImmediateRetries=%d", imm)
		assert.Equal(t, 1, calls, "ImmediateRetries=%d", imm)
	}
}
