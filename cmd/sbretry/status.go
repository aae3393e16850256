package main

import (
	"context"
	"fmt"
	"time"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/redact"
)

// status prints everything the entity says about one key: "will be retried at T (attempt n)",
// "active now", "dead-lettered at T: reason", each with the REF (entity and sequence number) that the
// other commands take. A key found nowhere exits with exitNotFound, after saying what was read; a key
// not found in a scan that stopped at --max-peek exits with exitPartial, since the rest was not read.
// With --index PATH it answers from the retry-state index instead (statusFromIndex), without reading
// the broker.
func (a *app) status(ctx context.Context, args []string) error {
	var c common
	fs := newFlagSet("status", &c)
	index := fs.String("index", "", "")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || pos[0] == "" {
		return usagef("status needs exactly one KEY (a key, correlation id or message id)")
	}
	if *index != "" {
		if c.timeout <= 0 {
			return usagef("--timeout must be positive")
		}
		return a.statusFromIndex(ctx, &c, *index, pos[0])
	}
	s, ctx, closeAll, err := a.open(ctx, &c)
	if err != nil {
		return err
	}
	defer closeAll()
	st, err := s.inspector.Status(ctx, pos[0])
	if err != nil {
		return err
	}
	a.warnTruncated(st.Scans...)
	// Empty lists rather than null keep jq filters such as '.pending | length' simple.
	if c.json {
		out := struct {
			ID          string           `json:"id"`
			Pending     []jsonPending    `json:"pending"`
			Active      []jsonActive     `json:"active"`
			DeadLetters []jsonDeadLetter `json:"deadLetters"`
			Scans       []jsonScan       `json:"scans"`
			Partial     bool             `json:"partial"`
		}{ID: st.ID, Pending: []jsonPending{}, Active: []jsonActive{}, DeadLetters: []jsonDeadLetter{}, Scans: scansJSON(st.Scans), Partial: st.Truncated()}
		for _, p := range st.Pending {
			out.Pending = append(out.Pending, pendingJSON(p))
		}
		for _, x := range st.Active {
			out.Active = append(out.Active, activeJSON(x))
		}
		for _, d := range st.DeadLetters {
			out.DeadLetters = append(out.DeadLetters, deadLetterJSON(d))
		}
		if err := writeJSON(a.stdout, out); err != nil {
			return err
		}
		return nothingFound(st)
	}
	// One line per finding, in the words an on-call engineer searches for; the relative due time
	// saves a mental subtraction across time zones.
	w := a.stdout
	fmt.Fprintf(w, "%s on %s:\n", st.ID, s.entity)
	now := a.now()
	for _, p := range st.Pending {
		fmt.Fprintf(w, "  will be retried at %s (attempt %d), %s; sequence number %d in %s, message id %s",
			formatTime(p.DueTime), p.Attempt, relative(p.DueTime, now), p.SequenceNumber, p.Entity, p.MessageID)
		if p.LastError != "" {
			fmt.Fprintf(w, "; last error: %s", clip(redact.String(p.LastError), 200))
		}
		fmt.Fprintln(w)
	}
	for _, x := range st.Active {
		fmt.Fprintf(w, "  active now (attempt %d): receivable or being processed, enqueued at %s; sequence number %d in %s, message id %s, delivery count %d\n",
			x.Attempt, formatTime(x.EnqueuedTime), x.SequenceNumber, x.Entity, x.MessageID, x.DeliveryCount)
	}
	for _, d := range st.DeadLetters {
		fmt.Fprintf(w, "  dead-lettered at %s: %s", formatTime(d.DeadLetteredAt), d.Reason)
		if d.Attempt > 0 {
			fmt.Fprintf(w, " (attempt %d)", d.Attempt)
		}
		if d.Description != "" {
			fmt.Fprintf(w, ": %s", clip(redact.String(d.Description), 200))
		}
		fmt.Fprintf(w, "; sequence number %d in %s\n", d.SequenceNumber, d.Entity)
	}
	switch {
	case len(st.Pending)+len(st.Active)+len(st.DeadLetters) > 0 && st.Truncated():
		fmt.Fprintf(w, "  partial answer: read only %s (--max-peek); more may be beyond that: raise --max-peek or use --index\n", describeScans(st.Scans))
	case st.Truncated():
		fmt.Fprintf(w, "  not found in what was read, which is partial: read only %s (--max-peek), and the entity holds more; raise --max-peek or use --index\n", describeScans(st.Scans))
	case len(st.Pending)+len(st.Active)+len(st.DeadLetters) == 0:
		fmt.Fprintf(w, "  nothing pending, active or dead-lettered (read %s)\n", describeScans(st.Scans))
	}
	return nothingFound(st)
}

// nothingFound is errNothingFound when st found nothing in a complete read (the command then exits
// with exitNotFound), errPartialNotFound when it found nothing in a read that stopped at --max-peek
// (exitPartial): "not found" would be a claim about messages never read.
func nothingFound(st *inspect.Status) error {
	if len(st.Pending)+len(st.Active)+len(st.DeadLetters) > 0 {
		return nil
	}
	if st.Truncated() {
		return errPartialNotFound
	}
	return errNothingFound
}

// relative says how far t is from now, for a person reading a due time.
func relative(t, now time.Time) string {
	d := t.Sub(now).Round(time.Second)
	if d >= 0 {
		return "in " + d.String()
	}
	return "overdue by " + (-d).String()
}

// describeScans says what was read, so that "nothing found" can be told apart from "nothing read".
func describeScans(scans []inspect.Scan) string {
	s := ""
	for i, sc := range scans {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%d messages of %s", sc.Peeked, sc.Entity)
	}
	return s
}
