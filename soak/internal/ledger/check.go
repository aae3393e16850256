package ledger

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// DeadLetter is one message read from the dead-letter queue at the end of a run.
type DeadLetter struct {
	ID      string // the chain's original MessageID
	Attempt int    // the attempt that was dead-lettered (1 for a first delivery)
	Seq     int64
	Reason  string
}

// Ours reports whether the consumer dead-lettered it (our reasons all start with "Retry"), not the broker.
func (d DeadLetter) Ours() bool { return strings.HasPrefix(d.Reason, "Retry") }

// Expect is what the driver sent: the message's class and, in a sessions run, its session and its
// index in the session's sequence (0, 1, …, in the order sent).
type Expect struct {
	Class        Class
	FailAttempts int
	Session      string
	Index        int
}

// Run is everything a finished soak run knows.
type Run struct {
	Sent        map[string]Expect
	Log         *Log
	DeadLetters []DeadLetter
	// Kills is how many consumer processes were SIGKILLed.
	Kills int
	// MaxAttempts is the consumer's.
	MaxAttempts int
	// InFlightBound is the most deliveries one consumer process holds between receive and settle: what one
	// kill can leave finished but not completed.
	InFlightBound int
	// Sessions marks a run over a session queue: the session rules apply ([Log.Session] in order,
	// sessionorder.go), and a repeat in the same process is explained, as by a failed complete, when one
	// of the two successes was not reported completed (by a P record completed of its attempt in that
	// process: for the earlier, before the repeat; for the later, at all): the consumer left it
	// unsettled after losing the session lock, or was still settling it, or was killed first, when the
	// session, its lock run out, went to another receiver of the process. The broker gives such a
	// message back, in order, and the repeat is at-least-once. So does a completion the consumer
	// reported as doubted (PossibleDuplicate: the SDK retried the complete, which may not have taken;
	// finding 3 in soak/README.md). What stays unexplained is a repeat of a success the consumer had
	// reported completed beyond doubt.
	Sessions bool
}

// Report is the outcome of [Check].
type Report struct {
	Sent, Succeeded, DeadOurs, DeadBroker, Lost int
	// Duplicates counts successes beyond the first of each id; CrossProcess of them had their earlier
	// success in a process that was killed, SameProcess in the same process (each must follow a failed
	// complete there).
	Duplicates, CrossProcess, SameProcess int
	// FailedCompletes counts failed complete calls.
	FailedCompletes int
	// Inherited counts deliveries completed without running the handler (an outcome decided earlier).
	Inherited int
	// UnsettledRepeats counts the same-process repeats of a sessions run that no failed complete
	// explains but a success the consumer did not report completed does (Run.Sessions).
	UnsettledRepeats int
	// SessionReport is the session rules' outcome; zero unless Run.Sessions.
	SessionReport
	// Violations lists every broken invariant, with the ids that show it. Empty means the run passed.
	Violations []string
}

// maxListed bounds the ids listed in one violation.
const maxListed = 10

// Check applies the soak's set arithmetic to r.
func Check(r Run) Report {
	var rep Report
	violate := func(format string, args ...any) {
		rep.Violations = append(rep.Violations, fmt.Sprintf(format, args...))
	}
	listed := func(ids []string) string {
		sort.Strings(ids)
		if len(ids) > maxListed {
			return strings.Join(ids[:maxListed], " ") + fmt.Sprintf(" … (%d in all)", len(ids))
		}
		return strings.Join(ids, " ")
	}
	rep.Sent = len(r.Sent)

	succeeded := map[string][]Success{}
	for _, s := range r.Log.Successes {
		succeeded[s.ID] = append(succeeded[s.ID], s)
	}
	rep.Succeeded = len(succeeded)
	dead := map[string][]DeadLetter{}
	var noReason, unknown []string
	for _, d := range r.DeadLetters {
		dead[d.ID] = append(dead[d.ID], d)
		if d.Reason == "" {
			noReason = append(noReason, d.ID)
		}
		if _, ok := r.Sent[d.ID]; !ok {
			unknown = append(unknown, d.ID)
		}
	}
	for _, ds := range dead {
		if ds[0].Ours() {
			rep.DeadOurs++
		} else {
			rep.DeadBroker++
		}
	}
	if len(noReason) > 0 {
		violate("dead letters without a reason: %s", listed(noReason))
	}
	if len(unknown) > 0 {
		violate("dead letters of ids never sent: %s", listed(unknown))
	}

	// Nothing lost; nothing both succeeded and dead-lettered; nothing succeeded that was never sent.
	var lost, both, strays []string
	for id := range r.Sent {
		_, ok := succeeded[id]
		_, dl := dead[id]
		switch {
		case !ok && !dl:
			lost = append(lost, id)
		case ok && dl:
			both = append(both, id)
		}
	}
	for id := range succeeded {
		if _, ok := r.Sent[id]; !ok {
			strays = append(strays, id)
		}
	}
	rep.Lost = len(lost)
	if len(lost) > 0 {
		violate("lost (neither succeeded nor dead-lettered): %s", listed(lost))
	}
	if len(both) > 0 {
		violate("both succeeded and dead-lettered: %s", listed(both))
	}
	if len(strays) > 0 {
		violate("successes of ids never sent: %s", listed(strays))
	}

	// No attempt of a chain with two copies: every (id, attempt) is one broker message (one sequence
	// number), and a chain ends once.
	type attemptKey struct {
		id      string
		attempt int
	}
	seqs := map[attemptKey]map[int64]bool{}
	see := func(id string, attempt int, seq int64) {
		k := attemptKey{id, attempt}
		if seqs[k] == nil {
			seqs[k] = map[int64]bool{}
		}
		seqs[k][seq] = true
	}
	for _, p := range r.Log.Processed {
		see(p.ID, p.Attempt, p.Seq)
		if p.Inherited {
			rep.Inherited++
		}
	}
	for _, s := range r.Log.Successes {
		see(s.ID, s.Attempt, s.Seq)
	}
	for _, d := range r.DeadLetters {
		see(d.ID, d.Attempt, d.Seq)
	}
	var forked []string
	for k, s := range seqs {
		if len(s) > 1 {
			forked = append(forked, fmt.Sprintf("%s#%d(%d copies)", k.id, k.attempt, len(s)))
		}
	}
	if len(forked) > 0 {
		violate("attempts with two copies: %s", listed(forked))
	}
	var twoEnds []string
	for id, ss := range succeeded {
		for _, s := range ss[1:] {
			if s.Attempt != ss[0].Attempt {
				twoEnds = append(twoEnds, fmt.Sprintf("%s(attempts %d and %d)", id, ss[0].Attempt, s.Attempt))
				break
			}
		}
	}
	for id, ds := range dead {
		if len(ds) > 1 {
			twoEnds = append(twoEnds, fmt.Sprintf("%s(%d dead letters)", id, len(ds)))
		}
	}
	if len(twoEnds) > 0 {
		violate("chains that ended twice: %s", listed(twoEnds))
	}

	// Duplicates: a repeated success must follow a kill (the earlier success was in another process) or
	// a failed complete of that attempt in the same process.
	failed := map[attemptKey]map[int]bool{}
	for _, f := range r.Log.SettleFailures {
		if f.Operation != "complete" {
			continue
		}
		rep.FailedCompletes++
		k := attemptKey{f.ID, f.Attempt}
		if failed[k] == nil {
			failed[k] = map[int]bool{}
		}
		failed[k][f.PID] = true
	}
	// In a sessions run, a repeat in the same process is also explained when the consumer had not
	// reported the earlier success completed by the time the handler ran again (sessionorder.go).
	done := completedRecords(r.Log)
	// A completion the consumer itself doubted (the SDK retried the complete, which may not have
	// taken) explains a repeat too: the session was released so that the message, if still there,
	// came back first.
	doubted := doubtedRecords(r.Log)
	var unexplained []string
	for id, ss := range succeeded {
		for i := 1; i < len(ss); i++ {
			rep.Duplicates++
			prev := ss[i-1]
			if ss[i].PID != prev.PID {
				rep.CrossProcess++
				continue
			}
			rep.SameProcess++
			k := attemptKey{id, prev.Attempt}
			switch {
			case failed[k][prev.PID]:
			case r.Sessions && (!done.within(id, prev.Attempt, prev.PID, prev.Record, ss[i].Record) ||
				!done.within(id, ss[i].Attempt, ss[i].PID, ss[i].Record, math.MaxInt)):
				// One of the two was never reported completed: the earlier one (before the repeat) was
				// left unsettled after a lost session lock or was still being settled by a handler that
				// ran on after its lock ran out, while the session went to another receiver of the
				// process; or the later one is such a handler, writing late.
				rep.UnsettledRepeats++
			case r.Sessions && doubted.within(id, prev.Attempt, prev.PID, prev.Record, ss[i].Record):
				rep.UnsettledRepeats++
			default:
				unexplained = append(unexplained, fmt.Sprintf("%s#%d(pid %d)", id, prev.Attempt, prev.PID))
			}
		}
	}
	if len(unexplained) > 0 {
		what := "without a failed complete"
		if r.Sessions {
			what += ", the earlier one reported completed before"
		}
		violate("repeated successes in one process %s: %s", what, listed(unexplained))
	}
	if bound := r.Kills*r.InFlightBound + rep.FailedCompletes + rep.UnsettledRepeats; rep.Duplicates > bound {
		violate("%d duplicate successes exceed kills × in-flight + failed completes + unsettled repeats = %d×%d + %d + %d",
			rep.Duplicates, r.Kills, r.InFlightBound, rep.FailedCompletes, rep.UnsettledRepeats)
	}

	// Each class ends the way its handler says: ok and transient succeed at their one succeeding attempt
	// (or are dead-lettered by the broker after too many deliveries), always and permanent are
	// dead-lettered with our reason at the attempt it names (or by the broker), never succeed.
	var wrong []string
	for id, e := range r.Sent {
		ss, ds := succeeded[id], dead[id]
		switch e.Class {
		case ClassOK, ClassTransient:
			want := e.FailAttempts + 1
			if e.Class == ClassOK {
				want = 1
			}
			if len(ss) > 0 && ss[0].Attempt != want {
				wrong = append(wrong, fmt.Sprintf("%s(%s succeeded at attempt %d, want %d)", id, e.Class, ss[0].Attempt, want))
			}
			if len(ds) > 0 && ds[0].Ours() {
				wrong = append(wrong, fmt.Sprintf("%s(%s dead-lettered %s at attempt %d)", id, e.Class, ds[0].Reason, ds[0].Attempt))
			}
		case ClassAlways, ClassPermanent:
			if len(ss) > 0 {
				wrong = append(wrong, fmt.Sprintf("%s(%s succeeded)", id, e.Class))
			}
			reason, attempt := "RetryMaxAttemptsExceeded", r.MaxAttempts
			if e.Class == ClassPermanent {
				reason, attempt = "RetryPermanentFailure", 1
			}
			if len(ds) > 0 && ds[0].Ours() && (ds[0].Reason != reason || ds[0].Attempt != attempt) {
				wrong = append(wrong, fmt.Sprintf("%s(%s dead-lettered %s at attempt %d, want %s at %d)", id, e.Class, ds[0].Reason, ds[0].Attempt, reason, attempt))
			}
		}
	}
	if len(wrong) > 0 {
		violate("messages that ended otherwise than their class says: %s", listed(wrong))
	}
	if r.Sessions {
		rep.SessionReport = checkSessions(r, violate, listed)
	}
	sort.Strings(rep.Violations)
	return rep
}
