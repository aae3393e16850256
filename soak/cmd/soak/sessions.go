package main

import (
	"fmt"
	"math/rand/v2"

	"github.com/sbretry/retry/sbemu/broker"
	"github.com/sbretry/retry/soak/internal/ledger"
	"github.com/sbretry/retry/soak/internal/sessionmode"
)

// The sessions soak (-sessions N): the same run as the queue soak (emulator, proxy, kills, faults,
// drain, set arithmetic), on a session-enabled queue consumed by a retry.SessionConsumer, with each
// session sent an ordered sequence and the session rules of package ledger added to the checks.

// sessionQueueName is the sessions soak's queue (RequiresSession).
const sessionQueueName = "soak-sessions"

// perSession and perSessionShort are the messages per session when -messages is not given.
const (
	perSession      = 25
	perSessionShort = 6
)

// planSessions draws the sessions run's messages (package ledger's SessionMix), in the order they are
// sent: index 0 of every session, then index 1, ….
func planSessions(r *rand.Rand, sessions, n, maxFail int) ([]string, map[string]ledger.Expect) {
	msgs := ledger.PlanSessions(r, ledger.SessionMix, sessions, n, maxFail)
	ids := make([]string, len(msgs))
	out := make(map[string]ledger.Expect, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
		out[m.ID] = m.Expect
	}
	return ids, out
}

// sessionConsumerArgs are soakconsumer's flags for the sessions soak; none for the queue soak.
func sessionConsumerArgs(s settings) []string {
	if s.sessions == 0 {
		return nil
	}
	return []string{"-sessions", "-session-mode", s.sessionMode, "-max-hold", s.maxHold.String(),
		"-max-sessions", fmt.Sprint(s.maxSessions), "-session-idle", s.sessionIdle.String()}
}

// sessionsBanner is the first line's description of the sessions soak; empty for the queue soak.
func sessionsBanner(s settings) string {
	if s.sessions == 0 {
		return ""
	}
	hold := s.maxHold.String()
	if s.maxHold == 0 {
		hold = "default(5m)"
		if s.sessionMode == string(sessionmode.Durable) {
			hold = "1ns" // soakconsumer's default for durable holds
		}
	}
	return fmt.Sprintf(" sessions=%d session-mode=%s max-hold=%s max-sessions=%d", s.sessions, s.sessionMode, hold, s.maxSessions)
}

// sessionsEmpty reports whether no session of q holds a receivable, locked, deferred or scheduled
// message (a durable hold's wake-up is a scheduled one).
func sessionsEmpty(q *broker.Queue) bool {
	for _, snap := range q.SessionSnapshots() {
		if snap.Active+snap.Locked+snap.Deferred+snap.Scheduled > 0 {
			return false
		}
	}
	return true
}

// printSessionLine prints what the session rules found, before the summary line. Repeats are allowed:
// delivery is at least once, so a handler that succeeded but whose complete never happened (its
// process killed, the complete failed, the session lock lost) runs again when the broker gives the
// session back; the duplicate rules say each is explained.
func printSessionLine(rep ledger.Report) {
	fmt.Printf("soak: sessions=%d out-of-order=%d inversions=%d repeats=%d (in another process, after a kill: %d; in the same process: %d, of which %d not reported completed; late, after a later index, from a handler that lost its lock: %d)\n",
		rep.Sessions, rep.OutOfOrder, rep.Inversions, rep.Repeats, rep.CrossProcess, rep.SameProcess, rep.UnsettledRepeats, rep.RepeatsAfterLater)
}
