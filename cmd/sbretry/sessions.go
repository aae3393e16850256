package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/redact"
	"github.com/sbretry/retry/sessionstate"
)

// The sessions commands: the held sessions of a session-enabled entity (retry.SessionConsumer's durable
// holds) and their release. See "Held sessions" in the package documentation.

// Statuses of a held session in the listing, the first word of its row.
const (
	statusWaiting      = "waiting"       // a retry is due at DUE
	statusDeadLettered = "dead-lettered" // blocked after a dead-letter until released
	statusFollowers    = "followers"     // nothing held, deferred messages waiting to run
	statusLocked       = "locked"        // a consumer holds the session now: not read
	statusForeign      = "foreign"       // the state is another application's: left alone
	statusInvalid      = "invalid"       // a hold record that cannot be read: left alone
	statusUnreadable   = "unreadable"    // reading the session failed: see the note
)

// isForeign reports a session state that is another application's.
func isForeign(err error) bool { return errors.Is(err, sessionstate.ErrForeign) }

// sessionStatus names what blocks s.
func sessionStatus(s inspect.HeldSession) string {
	switch {
	case s.ReadErr != nil:
		return statusUnreadable
	case s.Locked:
		return statusLocked
	case s.StateErr != nil && isForeign(s.StateErr):
		return statusForeign
	case s.StateErr != nil:
		return statusInvalid
	case s.Hold() == nil:
		return statusFollowers
	case s.Hold().DeadLetterReason != "":
		return statusDeadLettered
	}
	return statusWaiting
}

// sessionsList prints the held sessions of the entity.
func (a *app) sessionsList(ctx context.Context, args []string) error {
	var c common
	fs := newFlagSet("sessions list", &c)
	fs.IntVar(&c.maxSessions, "max-sessions", inspect.DefaultMaxSessions, "")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("sessions list takes no arguments, got %q", pos)
	}
	if c.maxSessions <= 0 {
		return usagef("--max-sessions must be positive")
	}
	// Held sessions are a session consumer's: a subscription it consumes has no retry queue.
	c.sessionConsumer = c.sessionConsumer || c.retryQueue == ""
	s, ctx, closeAll, err := a.open(ctx, &c)
	if err != nil {
		return err
	}
	defer closeAll()
	held, err := s.inspector.ListHeldSessions(ctx)
	if err != nil {
		return err
	}
	if held.Truncated {
		fmt.Fprintf(a.stderr, "sbretry: warning: read only the first %d sessions with a state of %s (--max-sessions); the answer covers those only\n", held.Listed, held.Entity)
	}
	for _, hs := range held.Sessions {
		if hs.Scan.Truncated {
			fmt.Fprintf(a.stderr, "sbretry: warning: read only the first %d messages of session %q of %s (--max-peek)\n", hs.Scan.Peeked, hs.SessionID, hs.Entity)
		}
	}
	if c.json {
		out := jsonHeldSessions{Entity: held.Entity, Sessions: []jsonHeldSession{}, Listed: held.Listed, Truncated: held.Truncated}
		for _, hs := range held.Sessions {
			out.Sessions = append(out.Sessions, heldSessionJSON(hs))
		}
		if err := writeJSON(a.stdout, out); err != nil {
			return err
		}
		return unreadableError(held)
	}
	if len(held.Sessions) == 0 {
		fmt.Fprintf(a.stdout, "no held sessions on %s (read %d sessions with a state)\n", held.Entity, held.Listed)
		return nil
	}
	if err := printHeldSessions(a.stdout, held.Sessions); err != nil {
		return err
	}
	return unreadableError(held)
}

// unreadableError is the listing's error when some session could not be read: the rest was printed.
func unreadableError(held *inspect.HeldSessions) error {
	n := 0
	for _, s := range held.Sessions {
		if s.ReadErr != nil {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	return fmt.Errorf("%d of the sessions of %s could not be read (status %s)", n, held.Entity, statusUnreadable)
}

// printable is s, quoted (Go syntax: \x1b, \u202e, \xff) when it holds characters a terminal would
// act on or show misleadingly: controls and escapes, format characters such as bidi overrides and
// zero-width spaces, and bytes that are not UTF-8 (a lone 0x9b is a CSI to an 8-bit terminal).
func printable(s string) string {
	if !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !strconv.IsPrint(r) || r == '\t' {
			return strconv.Quote(s)
		}
	}
	return s
}

// printHeldSessions writes the listing, one session a line, named by its entity and session id.
func printHeldSessions(w io.Writer, sessions []inspect.HeldSession) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ENTITY\tSESSION\tSTATUS\tSEQ\tMESSAGE ID\tATTEMPT\tDUE\tFOLLOWERS\tWAKE-UP\tNOTE")
	for _, s := range sessions {
		seq, id, attempt, due, wake := "-", "-", "-", "-", "-"
		note := ""
		status := sessionStatus(s)
		switch status {
		case statusUnreadable:
			note = "not read: " + redact.String(s.ReadErr.Error())
		case statusLocked:
			note = "held by a consumer now: not read (run again later)"
		case statusForeign:
			note = fmt.Sprintf("the state (%d bytes) is not a hold record: left alone", s.StateSize)
		case statusInvalid:
			note = "invalid hold record, left alone: " + redact.String(s.StateErr.Error())
		default:
			if h := s.Hold(); h != nil {
				seq, id, attempt = strconv.FormatInt(h.SequenceNumber, 10), h.MessageID, strconv.Itoa(h.Attempt)
				if h.DeadLetterReason != "" {
					note = "dead-lettered: " + h.DeadLetterReason
				} else {
					due = formatTime(h.WakeAt)
					wake = "none"
					if wu := s.NextWakeUp(); wu != nil {
						wake = formatTime(wu.DueTime)
					}
					if s.HeldMessage() == nil && !s.Scan.Truncated {
						note = "the held message is not in the session"
					}
				}
				if h.LastError != "" {
					note = strings.TrimPrefix(note+"; last error: "+h.LastError, "; ")
				}
			}
		}
		followers := "-"
		if s.StateErr == nil && !s.Locked && s.ReadErr == nil {
			followers = strconv.Itoa(len(s.State.Followers))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Entity, printable(s.SessionID), status, seq, printable(clip(id, 40)), attempt, due, followers, wake, printable(clip(redact.String(note), 80)))
	}
	return tw.Flush()
}

// sessionsRelease releases one held session: --session names it in the entity of the entity flags.
// The preview (the state before and after, the wake-up to send) is printed by the dry run and before
// the confirmation; the real run refuses a session whose state changed since, then sends the wake-up,
// checks that the session holds it, and only then writes the new state.
//
// A session subscription's session is released with --wake-to TOPIC (inspect.Options.WakeTo): the
// wake-up goes to the topic carrying sbretry-wake-to, the subscription's path, for the topic's rules to
// route to that subscription alone; without a rule that brings it there, the release writes nothing.
func (a *app) sessionsRelease(ctx context.Context, args []string) error {
	var c common
	var af auditFlags
	fs := newFlagSet("sessions release", &c)
	af.register(fs)
	sid := fs.String("session", "", "")
	dryRun := fs.Bool("dry-run", false, "")
	yes := fs.Bool("yes", false, "")
	wakeTo := fs.String("wake-to", "", "")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("sessions release takes no arguments, got %q: name the session with --session", pos)
	}
	if *sid == "" {
		return usagef("sessions release needs --session ID, the session to release in the entity of --queue")
	}
	e, err := c.entity()
	if err != nil {
		return err
	}
	switch {
	case e.IsSubscription() && *wakeTo == "":
		return usagef("sessions release of subscription %s needs --wake-to TOPIC: a plain send of the wake-up to topic %s would reach every subscription whose rules accept it; --wake-to sends it carrying %s=%s, for the topic's rules to route to this subscription alone (see the console's documentation for such rules)", e, e.Topic, inspect.PropWakeTo, e.Path())
	case !e.IsSubscription() && *wakeTo != "":
		return usagef("--wake-to is for a session subscription (--topic T --subscription S): a queue's wake-ups go to the queue itself")
	case *wakeTo != "" && c.retryQueue != "":
		return usagef("--wake-to and --retry-queue: a session subscription's consumer (retry.SessionConsumer) has no retry queue")
	case strings.Contains(*wakeTo, "/"):
		return usagef("--wake-to %q must name a topic (or a queue or topic forwarding into it), not a path", *wakeTo)
	}
	if *wakeTo != "" {
		c.sessionConsumer = true // only a session consumer's subscription has sessions to release
	}
	c.noRetries = true // a failed call is reported, never retried under a lock taken again
	s, ctx, closeAll, err := a.open(ctx, &c)
	if err != nil {
		return err
	}
	defer closeAll()
	in := s.inspector
	if *wakeTo != "" {
		in, err = inspect.New(s.client, e.Path(), &inspect.Options{MaxPeek: c.maxPeek, SessionConsumer: true, WakeTo: *wakeTo, Observer: s.inspector.Observer()})
		if err != nil {
			return usagef("%v", err)
		}
	}
	preview, err := in.PreviewRelease(ctx, *sid, a.now())
	if err != nil {
		return err // nothing was done
	}
	rep := &releaseReport{dryRun: *dryRun, rel: preview}
	if !c.json || !*yes {
		w := a.stdout
		if c.json {
			w = a.stderr // the preview for the confirmation; stdout is the JSON
		}
		verb := "releasing"
		if *dryRun {
			verb = "would release"
		}
		fmt.Fprintf(w, "%s session %q of %s:\n", verb, preview.SessionID, preview.Entity)
		printRelease(w, preview)
	}
	if *dryRun {
		return a.finish(c.json, rep, nil, "")
	}
	au := a.newAuditor(&af, "release")
	au.selection(preview.Entity, nil)
	au.session(preview.SessionID)
	if !*yes {
		if err := a.confirm(fmt.Sprintf("Release session %q of %s as shown above?", preview.SessionID, preview.Entity), "release"); err != nil {
			return a.finish(c.json, rep, au.refuse(err, sessionAuditItem(preview, false)), "")
		}
	}
	if err := au.start(sessionAuditItem(preview, false)); err != nil {
		return a.finish(c.json, rep, err, "")
	}
	rel, err := in.Release(ctx, preview)
	if rel != nil {
		rep.rel = rel
	}
	done := 0
	if err != nil {
		if rel != nil && rel.WakeSent {
			err = stopped(err) // part of it was done
		}
	} else {
		done = 1
	}
	if err = au.end(done, err, sessionAuditItem(rep.rel, done == 1)); err != nil {
		return a.finish(c.json, rep, err, "")
	}
	return a.finish(c.json, rep, nil, fmt.Sprintf("released session %q of %s: sent wake-up %s to %s, found it in the session, wrote the new state", rel.SessionID, rel.Entity, derefString(rel.Plan.Wake.MessageID), rel.WakeTo))
}

// printRelease writes what a release changes: the state before and after, and the wake-up.
func printRelease(w io.Writer, r *inspect.SessionRelease) {
	fmt.Fprintf(w, "  before: %s\n", describeState(r.Plan.Before))
	fmt.Fprintf(w, "  after:  %s\n", describeState(r.Plan.After))
	wake := r.Plan.Wake
	target := "no message (it brings a consumer to run the followers)"
	if n, ok := wake.ApplicationProperties[sessionstate.PropWakeSequenceNumber].(int64); ok && n >= 0 {
		target = "sequence number " + strconv.FormatInt(n, 10)
	}
	to := r.Entity
	if !strings.EqualFold(r.WakeTo, r.Entity) {
		to = fmt.Sprintf("%s carrying %s=%s (the topic's rules route it to %s)", r.WakeTo, inspect.PropWakeTo, r.Entity, r.Entity)
	}
	fmt.Fprintf(w, "  send:   wake-up %s to %s in session %s, receivable now, for %s\n", derefString(wake.MessageID), to, strconv.Quote(r.SessionID), target)
}

// describeState says in one line what a session state holds.
func describeState(s sessionstate.State) string {
	var b strings.Builder
	switch h := s.Hold; {
	case h == nil:
		b.WriteString("nothing held")
	case h.DeadLetterReason != "":
		fmt.Fprintf(&b, "blocked after sequence number %d (%s) was dead-lettered at attempt %d (%s, %s)", h.SequenceNumber, printable(clip(h.MessageID, 60)), h.Attempt, printable(h.DeadLetterReason), formatTime(h.DeadLetteredAt))
	default:
		fmt.Fprintf(&b, "sequence number %d (%s) held for attempt %d, due %s", h.SequenceNumber, printable(clip(h.MessageID, 60)), h.Attempt, formatTime(h.WakeAt))
	}
	fmt.Fprintf(&b, "; %d followers", len(s.Followers))
	if len(s.Followers) > 0 {
		b.WriteString(" " + joinSeqs(s.Followers, 10))
	}
	if h := s.Hold; h != nil && h.LastError != "" {
		b.WriteString("; last error: " + printable(clip(redact.String(h.LastError), 80)))
	}
	return b.String()
}

// joinSeqs lists at most n sequence numbers, [6 7 8 …].
func joinSeqs(seqs []int64, n int) string {
	parts := make([]string, 0, min(len(seqs), n)+1)
	for i, s := range seqs {
		if i == n {
			parts = append(parts, fmt.Sprintf("… %d more", len(seqs)-n))
			break
		}
		parts = append(parts, strconv.FormatInt(s, 10))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func derefString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// releaseReport is a release, as --json prints it.
type releaseReport struct {
	dryRun bool
	rel    *inspect.SessionRelease
}

func (r *releaseReport) toJSON(err error) any {
	rel := r.rel
	wake := rel.Plan.Wake
	out := jsonRelease{
		Action: "release", DryRun: r.dryRun, Entity: rel.Entity, SessionID: rel.SessionID, PlannedAt: rel.PlannedAt,
		Before: sessionStateJSON(rel.Plan.Before), After: sessionStateJSON(rel.Plan.After),
		WakeUp:   jsonWake{MessageID: derefString(wake.MessageID), SessionID: rel.SessionID, ForSequenceNumber: -1, To: rel.WakeTo},
		WakeSent: rel.WakeSent, StateWritten: rel.StateWritten,
	}
	if n, ok := wake.ApplicationProperties[sessionstate.PropWakeSequenceNumber].(int64); ok {
		out.WakeUp.ForSequenceNumber = n
	}
	if p, ok := wake.ApplicationProperties[inspect.PropWakeTo].(string); ok {
		out.WakeUp.WakeToProperty = p
	}
	if err != nil {
		out.Error = redact.String(err.Error())
	}
	return out
}

// Output shapes of the sessions commands' --json; the names are stable.

// jsonHeldSessions is sessions list --json: the entity, its held sessions, how many sessions with a
// state were read and whether --max-sessions stopped the listing.
type jsonHeldSessions struct {
	Entity    string            `json:"entity"`
	Sessions  []jsonHeldSession `json:"sessions"`
	Listed    int               `json:"listed"`
	Truncated bool              `json:"truncated"`
}

// jsonHeldSession is one session of the listing. status is one of the status constants; state is
// absent when the session was locked (nothing read) or its state is not a hold record (stateError says
// why); deferred and wakeUps are what the peek inside the session found; nextWakeUp is the wake-up of
// the current hold, absent when none was found.
type jsonHeldSession struct {
	Entity           string              `json:"entity"`
	SessionID        string              `json:"sessionId"`
	Status           string              `json:"status"`
	LockedByConsumer bool                `json:"lockedByConsumer"`
	LockError        string              `json:"lockError,omitempty"`
	ReadError        string              `json:"readError,omitempty"`
	StateError       string              `json:"stateError,omitempty"`
	StateBytes       int                 `json:"stateBytes"`
	State            *jsonSessionState   `json:"state,omitempty"`
	Deferred         []jsonSessionMsg    `json:"deferred"`
	WakeUps          []jsonSessionWakeUp `json:"wakeUps"`
	NextWakeUp       *jsonSessionWakeUp  `json:"nextWakeUp,omitempty"`
	Scan             *jsonScan           `json:"scan,omitempty"`
}

// jsonSessionState is a sessionstate.State: hold is null when nothing is held.
type jsonSessionState struct {
	Hold      *jsonHold `json:"hold"`
	Followers []int64   `json:"followers"`
}

type jsonHold struct {
	SequenceNumber   int64     `json:"sequenceNumber"`
	MessageID        string    `json:"messageId"`
	Attempt          int       `json:"attempt"`
	FirstFailure     time.Time `json:"firstFailure,omitzero"`
	WakeAt           time.Time `json:"wakeAt,omitzero"`
	WakeID           string    `json:"wakeId,omitempty"`
	LastError        string    `json:"lastError,omitempty"`
	DeadLetterReason string    `json:"deadLetterReason,omitempty"`
	DeadLetteredAt   time.Time `json:"deadLetteredAt,omitzero"`
}

// jsonSessionMsg is a deferred message of the session: heldUntil on the held one, heldBehind on the
// ones deferred behind it.
type jsonSessionMsg struct {
	SequenceNumber int64     `json:"sequenceNumber"`
	MessageID      string    `json:"messageId"`
	HeldUntil      time.Time `json:"heldUntil,omitzero"`
	HeldBehind     *int64    `json:"heldBehind,omitempty"`
	Attempt        int       `json:"attempt,omitempty"`
	LastError      string    `json:"lastError,omitempty"`
}

type jsonSessionWakeUp struct {
	SequenceNumber    int64     `json:"sequenceNumber"`
	MessageID         string    `json:"messageId"`
	Scheduled         bool      `json:"scheduled"`
	DueTime           time.Time `json:"dueTime,omitzero"`
	ForSequenceNumber int64     `json:"forSequenceNumber"`
}

// jsonWake is the wake-up a release sends; forSequenceNumber is -1 when it names no held message (a
// session blocked after a dead-letter, or with followers only).
type jsonWake struct {
	MessageID         string `json:"messageId"`
	SessionID         string `json:"sessionId"`
	ForSequenceNumber int64  `json:"forSequenceNumber"`
	// To is where the wake-up is sent: the queue, or for a subscription the topic of --wake-to, the
	// wake-up then carrying WakeToProperty (sbretry-wake-to) = the subscription's path.
	To             string `json:"to"`
	WakeToProperty string `json:"wakeToProperty,omitempty"`
}

// jsonRelease is sessions release --json: the preview (before, after, wakeUp) and, for a real run, what
// was done: wakeSent, then stateWritten. wakeSent without stateWritten is a release that stopped part
// way (exit 1; error says why): the session is still held, run the release again.
type jsonRelease struct {
	Action       string           `json:"action"`
	DryRun       bool             `json:"dryRun"`
	Entity       string           `json:"entity"`
	SessionID    string           `json:"sessionId"`
	PlannedAt    time.Time        `json:"plannedAt"`
	Before       jsonSessionState `json:"before"`
	After        jsonSessionState `json:"after"`
	WakeUp       jsonWake         `json:"wakeUp"`
	WakeSent     bool             `json:"wakeSent"`
	StateWritten bool             `json:"stateWritten"`
	Error        string           `json:"error,omitempty"`
}

func sessionStateJSON(s sessionstate.State) jsonSessionState {
	out := jsonSessionState{Followers: append([]int64{}, s.Followers...)}
	if h := s.Hold; h != nil {
		out.Hold = &jsonHold{
			SequenceNumber: h.SequenceNumber, MessageID: h.MessageID, Attempt: h.Attempt, FirstFailure: h.FirstFailure.UTC(),
			WakeAt: h.WakeAt.UTC(), WakeID: h.WakeID, LastError: redact.String(h.LastError),
			DeadLetterReason: h.DeadLetterReason, DeadLetteredAt: h.DeadLetteredAt.UTC(),
		}
	}
	return out
}

func wakeUpJSON(w inspect.WakeUp) jsonSessionWakeUp {
	return jsonSessionWakeUp{SequenceNumber: w.SequenceNumber, MessageID: w.MessageID, Scheduled: w.Scheduled, DueTime: w.DueTime.UTC(), ForSequenceNumber: w.ForSequenceNumber}
}

func heldSessionJSON(s inspect.HeldSession) jsonHeldSession {
	out := jsonHeldSession{
		Entity: s.Entity, SessionID: s.SessionID, Status: sessionStatus(s), LockedByConsumer: s.Locked, StateBytes: s.StateSize,
		Deferred: []jsonSessionMsg{}, WakeUps: []jsonSessionWakeUp{},
	}
	if s.LockErr != nil {
		out.LockError = redact.String(s.LockErr.Error())
	}
	if s.ReadErr != nil {
		out.ReadError = redact.String(s.ReadErr.Error())
		return out
	}
	if s.StateErr != nil {
		out.StateError = redact.String(s.StateErr.Error())
	} else if !s.Locked {
		st := sessionStateJSON(s.State)
		out.State = &st
	}
	if !s.Locked {
		sc := scansJSON([]inspect.Scan{s.Scan})[0]
		out.Scan = &sc
	}
	for _, d := range s.Deferred {
		m := jsonSessionMsg{SequenceNumber: d.SequenceNumber, MessageID: d.MessageID, HeldUntil: d.HeldUntil.UTC(), Attempt: d.Attempt, LastError: redact.String(d.LastError)}
		if d.HeldBehind >= 0 {
			m.HeldBehind = &d.HeldBehind
		}
		out.Deferred = append(out.Deferred, m)
	}
	for _, w := range s.WakeUps {
		out.WakeUps = append(out.WakeUps, wakeUpJSON(w))
	}
	if w := s.NextWakeUp(); w != nil {
		j := wakeUpJSON(*w)
		out.NextWakeUp = &j
	}
	return out
}
