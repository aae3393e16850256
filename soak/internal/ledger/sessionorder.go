package ledger

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// The sessions soak sends, for each session, a sequence of messages indexed 0, 1, … in that order, and
// checks that the consumer ended them in that order. What "in that order" can mean is limited by what
// the ledger sees: the O and D records of every consumer process, appended to one file with O_APPEND,
// one write(2) each, so the order of the lines is the order in which the writes happened, across
// processes. A session's next message is received only after the previous one was settled, and its
// handler's success is written (and fsynced) before the handler returns, so before the complete;
// OnProcessed writes a D record after the dead-letter and before the next receive. So for a consumer
// that keeps a session's order, the first O or D record of index i precedes that of every later index,
// whichever processes wrote them: the order of the log is the order in which the broker handed the
// messages to handlers that finished them.
//
// A message can end twice: a handler succeeds and the process is killed before the complete (or the
// complete fails, or the session lock is lost), and the broker gives the message back, in order, to the
// next receiver of the session, which runs the handler again. That is at-least-once delivery, the
// contract: the repeat is allowed, and counted; Check's duplicate rules say whether each is explained
// (a kill, a failed complete, a success the consumer had not reported completed). A message given back
// comes back before its successors, so a repeat comes before any later index ends, with one exception:
// a handler still running when its session lock ran out (the session already with another receiver,
// which may have gone on) writes its success late, and the consumer cannot complete that delivery (it
// leaves it unsettled, or is killed first). Any other repeat after a later index, one that the consumer
// then reports completed (a P record completed of the same attempt, in the same process, after it), is
// an inversion: the message was handed to a handler again after its successor was and settled that
// way, which breaks the order the handler sees, and is a violation.

// PropIndex is the application property that carries a session message's index in its session.
const PropIndex = "soak-index"

// SessionMix is the mix of the sessions soak: 10 % fail transiently, 1 % fail with retry.Permanent,
// 0.5 % always fail (dead-lettered once MaxAttempts is spent, all attempts held in place).
var SessionMix = Mix{Transient: 0.10, Always: 0.005, Permanent: 0.01}

// SessionMessage is one message of a sessions run, in the order it is sent.
type SessionMessage struct {
	ID string
	Expect
}

// PlanSessions draws n messages over sessions sessions from r, sent index-major (index 0 of every
// session, then index 1, …) so that every session's sequence spans the whole send phase. Ids are
// s<session>-<index>, sessions s000, s001, …; classes follow m, a transient one failing 1 to maxFail
// attempts.
func PlanSessions(r *rand.Rand, m Mix, sessions, n, maxFail int) []SessionMessage {
	sessions = max(sessions, 1)
	out := make([]SessionMessage, 0, n)
	for i := 0; len(out) < n; i++ {
		for s := 0; s < sessions && len(out) < n; s++ {
			sid := fmt.Sprintf("s%03d", s)
			c, fail := m.Pick(r, maxFail)
			out = append(out, SessionMessage{
				ID:     fmt.Sprintf("%s-%05d", sid, i),
				Expect: Expect{Class: c, FailAttempts: fail, Session: sid, Index: i},
			})
		}
	}
	return out
}

// SessionProperties are the application properties of a session message: its class, as [Properties],
// and its index.
func SessionProperties(e Expect) map[string]any {
	p := Properties(e.Class, e.FailAttempts)
	p[PropIndex] = int64(e.Index)
	return p
}

// IndexFromProperties reads a session message's index back; a missing one is an error.
func IndexFromProperties(props map[string]any) (int, error) {
	n, ok := props[PropIndex].(int64)
	if !ok {
		return 0, fmt.Errorf("ledger: message has no %s property", PropIndex)
	}
	return int(n), nil
}

// SessionReport is what the session rules found.
type SessionReport struct {
	// Sessions is how many sessions were sent to.
	Sessions int
	// OutOfOrder counts messages whose first end came after a later index of their session had ended.
	OutOfOrder int
	// Repeats counts session successes of an index that had already ended (the at-least-once
	// duplicates, seen from the sessions); RepeatsAfterLater of them came after a later index of the
	// session had ended, from a handler whose delivery was then not reported completed (a handler that
	// had lost its session lock: allowed); Inversions of them came after a later index and were then
	// reported completed (a violation).
	Repeats, RepeatsAfterLater, Inversions int
}

// outcomeCompleted is retry.OutcomeCompleted's text in P records.
const outcomeCompleted = "completed"

// completions holds the records of the P lines that report a delivery completed, by id, attempt and
// process.
type completions map[completionKey][]int

type completionKey struct {
	id           string
	attempt, pid int
}

// completedRecords collects l's completions.
func completedRecords(l *Log) completions {
	c := completions{}
	for _, p := range l.Processed {
		if p.Outcome == outcomeCompleted {
			k := completionKey{p.ID, p.Attempt, p.PID}
			c[k] = append(c[k], p.Record)
		}
	}
	return c
}

// doubtedRecords indexes the completions the consumer doubted (PossibleDuplicate: the SDK retried the
// settle, which may not have taken; soak/README.md finding 3) the same way.
func doubtedRecords(l *Log) completions {
	c := completions{}
	for _, p := range l.Processed {
		if p.Outcome == outcomeCompleted && p.PossibleDuplicate {
			k := completionKey{p.ID, p.Attempt, p.PID}
			c[k] = append(c[k], p.Record)
		}
	}
	return c
}

// within reports whether process pid reported attempt of id completed in a record after from and
// before to.
func (c completions) within(id string, attempt, pid, from, to int) bool {
	for _, rec := range c[completionKey{id, attempt, pid}] {
		if rec > from && rec < to {
			return true
		}
	}
	return false
}

// checkSessions applies the session rules to r: along the log, each session's first ends (first
// success or our dead-letter) have strictly increasing indexes; a later end of an index is a repeat,
// counted; every O or D record names the session and index its id was sent with. That nothing was lost,
// that no message both succeeded and was dead-lettered, and that repeats are explained are Check's
// rules over ids, which hold for session messages unchanged.
func checkSessions(r Run, violate func(string, ...any), listed func([]string) string) SessionReport {
	var rep SessionReport
	sessions := map[string]bool{}
	for _, e := range r.Sent {
		sessions[e.Session] = true
	}
	rep.Sessions = len(sessions)

	type state struct {
		ended map[int]SessionEvent // first end of each index
		high  SessionEvent         // the first end with the highest index so far
	}
	completed := completedRecords(r.Log)
	bySession := map[string]*state{}
	var outOfOrder, mislabelled, inverted []string
	for _, e := range r.Log.Session {
		if want, ok := r.Sent[e.ID]; ok && (want.Session != e.Session || want.Index != e.Index) {
			mislabelled = append(mislabelled, fmt.Sprintf("%s(recorded as %s#%d, sent as %s#%d)", e.ID, e.Session, e.Index, want.Session, want.Index))
		}
		st := bySession[e.Session]
		if st == nil {
			st = &state{ended: map[int]SessionEvent{}, high: SessionEvent{Index: -1}}
			bySession[e.Session] = st
		}
		if _, done := st.ended[e.Index]; done {
			if !e.DeadLettered {
				rep.Repeats++
				switch {
				case e.Index >= st.high.Index:
				case !completed.within(e.ID, e.Attempt, e.PID, e.Record, math.MaxInt):
					rep.RepeatsAfterLater++
				default:
					inverted = append(inverted, fmt.Sprintf("%s(success record %d, pid %d, after index %d's %s record %d, pid %d)",
						e.ID, e.Record, e.PID, st.high.Index, kind(st.high), st.high.Record, st.high.PID))
				}
			}
			continue
		}
		st.ended[e.Index] = e
		if e.Index < st.high.Index {
			outOfOrder = append(outOfOrder, fmt.Sprintf("%s(%s record %d, pid %d, after index %d's %s record %d, pid %d)",
				e.ID, kind(e), e.Record, e.PID, st.high.Index, kind(st.high), st.high.Record, st.high.PID))
			continue
		}
		st.high = e
	}
	rep.OutOfOrder = len(outOfOrder)
	if len(outOfOrder) > 0 {
		violate("session messages that ended after a later message of their session: %s", listed(outOfOrder))
	}
	rep.Inversions = len(inverted)
	if len(inverted) > 0 {
		violate("session messages handled again, and completed, after a later message of their session: %s", listed(inverted))
	}
	if len(mislabelled) > 0 {
		violate("session records whose session or index differs from what was sent: %s", listed(mislabelled))
	}
	return rep
}

// kind names an event for the evidence.
func kind(e SessionEvent) string {
	if e.DeadLettered {
		return "dead-letter"
	}
	return "success"
}
