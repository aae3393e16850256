package ledger

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// logOf parses lines into a log, so that the records' places are those of a real one.
func logOf(t *testing.T, lines ...string) *Log {
	t.Helper()
	var l Log
	for _, line := range lines {
		require.NoError(t, l.Add(line))
	}
	return &l
}

// sessionBase is a clean sessions run: session s000 sends 0..3 (index 2 permanent, dead-lettered by us),
// session s001 sends 0..1 (index 0 transient, succeeded at attempt 2). Pid 10 is killed after its
// success of s001-00001 (before the complete); pid 11 goes on.
func sessionBase() Run {
	return Run{
		Sessions: true,
		Sent: map[string]Expect{
			"s000-00000": {Class: ClassOK, Session: "s000", Index: 0},
			"s000-00001": {Class: ClassOK, Session: "s000", Index: 1},
			"s000-00002": {Class: ClassPermanent, Session: "s000", Index: 2},
			"s000-00003": {Class: ClassOK, Session: "s000", Index: 3},
			"s001-00000": {Class: ClassTransient, FailAttempts: 1, Session: "s001", Index: 0},
			"s001-00001": {Class: ClassOK, Session: "s001", Index: 1},
		},
		DeadLetters:   []DeadLetter{{ID: "s000-00002", Attempt: 1, Seq: 3, Reason: "RetryPermanentFailure"}},
		Kills:         1,
		MaxAttempts:   4,
		InFlightBound: 2,
	}
}

// sessionLines is sessionBase's log, interleaved across sessions as it would be.
var sessionLines = []string{
	"O s000-00000 s000 0 1 1 10 1",
	"P s000-00000 1 1 completed 0 0 10 1",
	"O s001-00000 s001 0 2 2 10 2",
	"O s000-00001 s000 1 1 4 10 3",
	"D s000-00002 s000 2 1 RetryPermanentFailure 10 4",
	"O s001-00001 s001 1 1 5 10 5",
	// killed here; pid 11 gets s001-00001 back and runs it again
	"O s001-00001 s001 1 1 5 11 6",
	"O s000-00003 s000 3 1 6 11 7",
}

func TestCheckSessions(t *testing.T) {
	cases := []struct {
		name  string
		lines []string // nil: sessionLines
		edit  func(r *Run)
		want  string // a substring of the one violation; empty means none
		check func(t *testing.T, rep Report)
	}{
		{name: "a clean run passes; the repeat after the kill is counted", check: func(t *testing.T, rep Report) {
			assert.Equal(t, SessionReport{Sessions: 2, Repeats: 1}, rep.SessionReport)
			assert.Equal(t, 1, rep.Duplicates)
			assert.Equal(t, 1, rep.CrossProcess)
		}},
		{name: "a later index ends first", lines: []string{
			"O s000-00001 s000 1 1 4 10 3",
			"O s000-00000 s000 0 1 1 10 1",
			"D s000-00002 s000 2 1 RetryPermanentFailure 10 4",
			"O s000-00003 s000 3 1 6 10 7",
			"O s001-00000 s001 0 2 2 10 2",
			"O s001-00001 s001 1 1 5 10 5",
		}, want: "ended after a later message of their session: s000-00000(success record 1, pid 10, after index 1's success record 0, pid 10)",
			check: func(t *testing.T, rep Report) { assert.Equal(t, 1, rep.OutOfOrder) }},
		{name: "a dead-letter after a later success is out of order", lines: []string{
			"O s000-00000 s000 0 1 1 10 1",
			"O s000-00001 s000 1 1 4 10 3",
			"O s000-00003 s000 3 1 6 10 7",
			"D s000-00002 s000 2 1 RetryPermanentFailure 10 4",
			"O s001-00000 s001 0 2 2 10 2",
			"O s001-00001 s001 1 1 5 10 5",
		}, want: "s000-00002(dead-letter record 3, pid 10, after index 3's success record 2, pid 10)"},
		{name: "order is per session: other sessions interleave freely", lines: []string{
			"O s001-00000 s001 0 2 2 10 2",
			"O s000-00000 s000 0 1 1 10 1",
			"O s001-00001 s001 1 1 5 10 5",
			"O s000-00001 s000 1 1 4 10 3",
			"D s000-00002 s000 2 1 RetryPermanentFailure 10 4",
			"O s000-00003 s000 3 1 6 10 7",
		}, check: func(t *testing.T, rep Report) { assert.Equal(t, SessionReport{Sessions: 2}, rep.SessionReport) }},
		{name: "an index the broker dead-lettered leaves no record and no gap", lines: []string{
			"O s000-00000 s000 0 1 1 10 1",
			"O s000-00001 s000 1 1 4 10 3",
			"O s000-00003 s000 3 1 6 10 7",
			"O s001-00000 s001 0 2 2 10 2",
			"O s001-00001 s001 1 1 5 10 5",
		}, edit: func(r *Run) {
			r.DeadLetters = []DeadLetter{{ID: "s000-00002", Attempt: 1, Seq: 3, Reason: "MaxDeliveryCountExceeded"}}
		}},
		{name: "a late repeat by a handler that lost its lock is counted, not out of order", lines: []string{
			"O s000-00000 s000 0 1 1 10 1",
			"O s000-00001 s000 1 1 4 10 3",
			"D s000-00002 s000 2 1 RetryPermanentFailure 10 4",
			"O s000-00003 s000 3 1 6 10 7",
			// the first handler of index 1, whose session lock ran out while it worked, finishes last
			"O s000-00001 s000 1 1 4 10 8",
			"P s000-00001 1 4 left-for-redelivery 0 0 10 8",
			"O s001-00000 s001 0 2 2 10 2",
			"O s001-00001 s001 1 1 5 10 5",
		}, check: func(t *testing.T, rep Report) {
			assert.Equal(t, SessionReport{Sessions: 2, Repeats: 1, RepeatsAfterLater: 1}, rep.SessionReport)
			assert.Equal(t, 1, rep.UnsettledRepeats)
		}},
		{name: "a late repeat then reported completed is an inversion", lines: []string{
			"O s000-00000 s000 0 1 1 10 1",
			"O s000-00001 s000 1 1 4 10 3",
			"P s000-00001 1 4 completed 0 0 10 3", // reported completed, but the broker gave it back later
			"D s000-00002 s000 2 1 RetryPermanentFailure 10 4",
			"O s000-00003 s000 3 1 6 10 7",
			"O s000-00001 s000 1 1 4 11 8",
			"P s000-00001 1 4 completed 0 0 11 8",
			"O s001-00000 s001 0 2 2 10 2",
			"O s001-00001 s001 1 1 5 10 5",
		}, edit: func(r *Run) { r.Kills = 1 }, // explained as a duplicate by the kill; not as an order
			want: "handled again, and completed, after a later message of their session: s000-00001(success record 5, pid 11, after index 3's success record 4, pid 10)",
			check: func(t *testing.T, rep Report) {
				assert.Equal(t, SessionReport{Sessions: 2, Repeats: 1, Inversions: 1}, rep.SessionReport)
			}},
		{name: "a late repeat whose process was killed before it settled is not an inversion", lines: []string{
			"O s000-00000 s000 0 1 1 10 1",
			"O s000-00001 s000 1 1 4 10 3",
			"P s000-00001 1 4 completed 0 0 10 3",
			"D s000-00002 s000 2 1 RetryPermanentFailure 10 4",
			"O s000-00003 s000 3 1 6 10 7",
			"O s000-00001 s000 1 1 4 10 8", // the handler that lost its lock; pid 10 killed while it settles
			"O s001-00000 s001 0 2 2 10 2",
			"O s001-00001 s001 1 1 5 10 5",
		}, edit: func(r *Run) { r.Kills = 1 },
			check: func(t *testing.T, rep Report) {
				assert.Equal(t, SessionReport{Sessions: 2, Repeats: 1, RepeatsAfterLater: 1}, rep.SessionReport, "an order the handler saw, not one the consumer settled")
				assert.Equal(t, 1, rep.UnsettledRepeats)
			}},
		{name: "a stale handler writing first, its process killed while it settles, explains a repeat", lines: []string{
			"O s000-00000 s000 0 1 1 10 1", // the handler whose session lock ran out: its complete hangs
			"O s000-00000 s000 0 1 1 10 2", // the session's next receiver in the same process
			"P s000-00000 1 1 completed 0 0 10 2",
			"O s000-00001 s000 1 1 4 10 3",
			"D s000-00002 s000 2 1 RetryPermanentFailure 10 4",
			"O s000-00003 s000 3 1 6 10 7",
			"O s001-00000 s001 0 2 2 10 2",
			"O s001-00001 s001 1 1 5 10 5",
		}, check: func(t *testing.T, rep Report) {
			assert.Equal(t, 1, rep.UnsettledRepeats)
			assert.Equal(t, SessionReport{Sessions: 2, Repeats: 1}, rep.SessionReport)
		}},
		{name: "a same-process repeat of a success reported completed is unexplained", lines: []string{
			"O s000-00000 s000 0 1 1 10 1",
			"P s000-00000 1 1 completed 0 0 10 1", // the SDK's retried complete said nil; the lock stayed
			"O s000-00000 s000 0 1 1 10 2",
			"P s000-00000 1 1 completed 0 0 10 2",
			"O s000-00001 s000 1 1 4 10 3",
			"D s000-00002 s000 2 1 RetryPermanentFailure 10 4",
			"O s000-00003 s000 3 1 6 10 7",
			"O s001-00000 s001 0 2 2 10 2",
			"O s001-00001 s001 1 1 5 10 5",
		}, want: "repeated successes in one process without a failed complete, the earlier one reported completed before: s000-00000#1(pid 10)"},
		{name: "a session message never ended is lost", edit: func(r *Run) {
			r.Sent["s001-00002"] = Expect{Class: ClassOK, Session: "s001", Index: 2}
		}, want: "lost (neither succeeded nor dead-lettered): s001-00002"},
		{name: "a record of another session than sent", lines: append(append([]string(nil), sessionLines[:7]...), "O s000-00003 s001 3 1 6 11 7"),
			want: "differs from what was sent: s000-00003(recorded as s001#3, sent as s000#3)"},
		{name: "a same-process repeat after a lost session lock is explained", lines: []string{
			"O s000-00000 s000 0 1 1 10 1",
			"P s000-00000 1 1 left-for-redelivery 0 0 10 1",
			"O s000-00000 s000 0 1 1 10 2",
			"P s000-00000 1 1 completed 0 0 10 2",
			"O s000-00001 s000 1 1 4 10 3",
			"D s000-00002 s000 2 1 RetryPermanentFailure 10 4",
			"O s000-00003 s000 3 1 6 10 7",
			"O s001-00000 s001 0 2 2 10 2",
			"O s001-00001 s001 1 1 5 10 5",
		}, check: func(t *testing.T, rep Report) {
			assert.Equal(t, 1, rep.SameProcess)
			assert.Equal(t, 1, rep.UnsettledRepeats)
			assert.Equal(t, 1, rep.Repeats)
		}},
		{name: "a same-process repeat of a success whose complete the consumer doubted is explained", lines: []string{
			"O s000-00000 s000 0 1 1 10 1",
			"P s000-00000 1 1 completed 0 1 10 1", // the SDK retried the complete: the consumer doubts it
			"O s000-00000 s000 0 1 1 10 2",
			"P s000-00000 1 1 completed 0 0 10 2",
			"O s000-00001 s000 1 1 4 10 3",
			"D s000-00002 s000 2 1 RetryPermanentFailure 10 4",
			"O s000-00003 s000 3 1 6 10 7",
			"O s001-00000 s001 0 2 2 10 2",
			"O s001-00001 s001 1 1 5 10 5",
		}, check: func(t *testing.T, rep Report) {
			assert.Equal(t, 1, rep.UnsettledRepeats)
			assert.Equal(t, 1, rep.Repeats)
		}},
		{name: "a left-for-redelivery before the success explains nothing", lines: []string{
			"P s000-00000 1 1 left-for-redelivery 0 0 10 1", // an earlier delivery whose handler was cancelled
			"O s000-00000 s000 0 1 1 10 1",
			"P s000-00000 1 1 completed 0 0 10 1",
			"O s000-00000 s000 0 1 1 10 2",
			"P s000-00000 1 1 completed 0 0 10 2",
			"O s000-00001 s000 1 1 4 10 3",
			"D s000-00002 s000 2 1 RetryPermanentFailure 10 4",
			"O s000-00003 s000 3 1 6 10 7",
			"O s001-00000 s001 0 2 2 10 2",
			"O s001-00001 s001 1 1 5 10 5",
		}, want: "repeated successes in one process without a failed complete, the earlier one reported completed before: s000-00000#1(pid 10)"},
		{name: "outside a sessions run a lost lock explains nothing", lines: []string{
			"O s000-00000 s000 0 1 1 10 1",
			"P s000-00000 1 1 left-for-redelivery 0 0 10 1",
			"O s000-00000 s000 0 1 1 10 2",
			"O s000-00001 s000 1 1 4 10 3",
			"O s000-00003 s000 3 1 6 10 7",
			"O s001-00000 s001 0 2 2 10 2",
			"O s001-00001 s001 1 1 5 10 5",
		}, edit: func(r *Run) { r.Sessions = false },
			want: "repeated successes in one process without a failed complete: s000-00000#1(pid 10)",
			check: func(t *testing.T, rep Report) {
				assert.Zero(t, rep.SessionReport, "the session rules are off")
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := sessionBase()
			lines := tc.lines
			if lines == nil {
				lines = sessionLines
			}
			r.Log = logOf(t, lines...)
			if tc.edit != nil {
				tc.edit(&r)
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

func TestPlanSessionsSendsEachSessionInOrder(t *testing.T) {
	msgs := PlanSessions(rand.New(rand.NewPCG(1, 2)), SessionMix, 3, 8, 3)
	require.Len(t, msgs, 8)
	var ids []string
	next := map[string]int{}
	for _, m := range msgs {
		ids = append(ids, m.ID)
		assert.Equal(t, next[m.Session], m.Index, "%s: indexes of a session are 0, 1, … in the order sent", m.ID)
		next[m.Session]++
	}
	assert.Equal(t, []string{"s000-00000", "s001-00000", "s002-00000", "s000-00001", "s001-00001", "s002-00001", "s000-00002", "s001-00002"}, ids)
	assert.Equal(t, map[string]int{"s000": 3, "s001": 3, "s002": 2}, next)
}

func TestSessionPropertiesRoundTrip(t *testing.T) {
	props := SessionProperties(Expect{Class: ClassTransient, FailAttempts: 2, Index: 41})
	c, fail, err := FromProperties(props)
	require.NoError(t, err)
	assert.Equal(t, ClassTransient, c)
	assert.Equal(t, 2, fail)
	i, err := IndexFromProperties(props)
	require.NoError(t, err)
	assert.Equal(t, 41, i)
	_, err = IndexFromProperties(Properties(ClassOK, 0))
	assert.Error(t, err)
}
