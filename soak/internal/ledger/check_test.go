package ledger

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// base is a clean run: a succeeded, b transient succeeded at attempt 2, c permanent, d always (3 attempts).
func base() Run {
	return Run{
		Sent: map[string]Expect{
			"a": {Class: ClassOK}, "b": {Class: ClassTransient, FailAttempts: 1},
			"c": {Class: ClassPermanent}, "d": {Class: ClassAlways},
		},
		Log: &Log{
			Successes: []Success{{ID: "a", Attempt: 1, Seq: 1, PID: 10}, {ID: "b", Attempt: 2, Seq: 5, PID: 10}},
			Processed: []Processed{{ID: "b", Attempt: 1, Seq: 2, Outcome: "retry-scheduled", PID: 10}},
		},
		DeadLetters: []DeadLetter{
			{ID: "c", Attempt: 1, Seq: 3, Reason: "RetryPermanentFailure"},
			{ID: "d", Attempt: 3, Seq: 9, Reason: "RetryMaxAttemptsExceeded"},
		},
		MaxAttempts:   3,
		InFlightBound: 2,
	}
}

func TestCheck(t *testing.T) {
	cases := []struct {
		name   string
		change func(r *Run)
		want   string // a substring of the one violation; empty means none
		check  func(t *testing.T, rep Report)
	}{
		{name: "a clean run passes", check: func(t *testing.T, rep Report) {
			assert.Equal(t, Report{Sent: 4, Succeeded: 2, DeadOurs: 2}, rep)
		}},
		{name: "a lost message", change: func(r *Run) { r.Sent["e"] = Expect{Class: ClassOK} }, want: "lost (neither succeeded nor dead-lettered): e"},
		{name: "succeeded and dead-lettered", change: func(r *Run) {
			r.DeadLetters = append(r.DeadLetters, DeadLetter{ID: "a", Attempt: 1, Seq: 1, Reason: "MaxDeliveryCountExceeded"})
		}, want: "both succeeded and dead-lettered: a"},
		{name: "a dead letter without a reason", change: func(r *Run) { r.DeadLetters[0].Reason = "" }, want: "without a reason: c"},
		{name: "two copies of one attempt", change: func(r *Run) {
			r.Log.Processed = append(r.Log.Processed, Processed{ID: "b", Attempt: 2, Seq: 6, Outcome: "completed", PID: 10})
		}, want: "attempts with two copies: b#2(2 copies)"},
		{name: "a duplicate after a kill is within the bound", change: func(r *Run) {
			r.Kills = 1
			r.Log.Successes = append(r.Log.Successes, Success{ID: "a", Attempt: 1, Seq: 1, PID: 11})
		}, check: func(t *testing.T, rep Report) {
			assert.Equal(t, 1, rep.Duplicates)
			assert.Equal(t, 1, rep.CrossProcess)
		}},
		{name: "duplicates beyond the bound", change: func(r *Run) {
			r.Log.Successes = append(r.Log.Successes, Success{ID: "a", Attempt: 1, Seq: 1, PID: 11})
		}, want: "1 duplicate successes exceed"},
		{name: "a same-process duplicate after a failed complete", change: func(r *Run) {
			r.Log.SettleFailures = []SettleFailure{{ID: "a", Attempt: 1, Operation: "complete", PID: 10}}
			r.Log.Successes = append(r.Log.Successes, Success{ID: "a", Attempt: 1, Seq: 1, PID: 10})
		}, check: func(t *testing.T, rep Report) { assert.Equal(t, 1, rep.SameProcess) }},
		{name: "a same-process duplicate without a failed complete", change: func(r *Run) {
			r.Kills = 1
			r.Log.Successes = append(r.Log.Successes, Success{ID: "a", Attempt: 1, Seq: 1, PID: 10})
		}, want: "repeated successes in one process without a failed complete: a#1(pid 10)"},
		{name: "a transient message dead-lettered by us", change: func(r *Run) {
			r.Log.Successes = r.Log.Successes[:1]
			r.DeadLetters = append(r.DeadLetters, DeadLetter{ID: "b", Attempt: 2, Seq: 5, Reason: "RetryMaxAttemptsExceeded"})
		}, want: "b(transient dead-lettered RetryMaxAttemptsExceeded at attempt 2)"},
		{name: "the broker may dead-letter any class", change: func(r *Run) {
			r.Log.Successes = r.Log.Successes[:1]
			r.DeadLetters = append(r.DeadLetters, DeadLetter{ID: "b", Attempt: 2, Seq: 5, Reason: "MaxDeliveryCountExceeded"})
		}, check: func(t *testing.T, rep Report) { assert.Equal(t, 1, rep.DeadBroker) }},
		{name: "an always-failing message that succeeded", change: func(r *Run) {
			r.DeadLetters = r.DeadLetters[:1]
			r.Log.Successes = append(r.Log.Successes, Success{ID: "d", Attempt: 3, Seq: 9, PID: 10})
		}, want: "d(always succeeded)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := base()
			if tc.change != nil {
				tc.change(&r)
			}
			rep := Check(r)
			if tc.want == "" {
				assert.Empty(t, rep.Violations)
			} else {
				require.Len(t, rep.Violations, 1, "%v", rep.Violations)
				assert.Contains(t, rep.Violations[0], tc.want)
			}
			if tc.check != nil {
				tc.check(t, rep)
			}
		})
	}
}
