package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/redact"
	"github.com/sbretry/retry/retryindex"
	"github.com/sbretry/retry/retryindex/postgres"
)

// openIndex opens the retry-state index that --index names: a PostgreSQL URL ("postgres://" or
// "postgresql://": the shared store, retryindex/postgres; a password is best given through PGPASSWORD
// or ~/.pgpass, not on the command line), or else the path of an embedded index file, opened
// read-only. A missing file is a usage error, never an empty answer. It returns the store and how to
// name it in output, which never includes a password.
func openIndex(ctx context.Context, spec string) (retryindex.Store, string, error) {
	return openIndexFor(ctx, spec, false)
}

// openIndexFor is openIndex, with the embedded file opened for writing, and created if missing, when
// write is set (index rebuild and index tail feed the index, as a recorder does).
func openIndexFor(ctx context.Context, spec string, write bool) (retryindex.Store, string, error) {
	scheme, _, isURL := strings.Cut(spec, "://")
	switch scheme = strings.ToLower(scheme); {
	case isURL && scheme != "postgres" && scheme != "postgresql":
		// Never echoed: a URL may carry a password.
		return nil, "", usagef("--index: a URL must be postgres:// or postgresql://; anything else is the path of an index file")
	case isURL:
		cfg, err := pgx.ParseConfig(spec)
		if err != nil {
			return nil, "", usagef("--index: the PostgreSQL URL does not parse")
		}
		name := fmt.Sprintf("postgres database %s on %s", cfg.Database, cfg.Host)
		s, err := postgres.Open(ctx, spec, nil)
		if err != nil {
			return nil, "", fmt.Errorf("opening the index in %s: %w", name, err)
		}
		return s, name, nil
	}
	if _, err := os.Stat(spec); err != nil && !write {
		return nil, "", usagef("--index %s: %v", spec, err)
	}
	s, err := retryindex.OpenSQLite(spec, &retryindex.SQLiteOptions{ReadOnly: !write})
	if err != nil {
		return nil, "", err
	}
	return s, spec, nil
}

// indexSource is the entity path the flags name, if any, for filtering index answers: the index may
// hold several entities' events, and the flags are optional with --index.
func indexSource(c *common) (string, error) {
	if c.queue == "" && c.topic == "" && c.subscription == "" {
		return "", nil
	}
	e, err := c.entity()
	if err != nil {
		return "", err
	}
	return e.Path(), nil
}

// describeFreshness says how fresh an index answer is: as of when it was read, and when each feed
// last wrote, relative to that.
func describeFreshness(f retryindex.Freshness) string {
	var b strings.Builder
	fmt.Fprintf(&b, "as of %s", formatTime(f.AsOf))
	if len(f.Feeds) == 0 {
		b.WriteString("; no feed has written to it yet")
		return b.String()
	}
	b.WriteString("; feeds:")
	for i, fd := range f.Feeds {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, " %s last wrote %s (%s ago)", fd.Name, formatTime(fd.Last), f.AsOf.Sub(fd.Last).Round(time.Second))
		if strings.HasPrefix(fd.Name, "tailer ") {
			fmt.Fprintf(&b, ", next sequence number %d", fd.Cursor)
		}
		if fd.Lost > 0 {
			fmt.Fprintf(&b, ", LOST %d records (the last at %s): answers may miss their changes until a rebuild from the broker (sbretry index rebuild)", fd.Lost, formatTime(fd.LostAt))
		}
	}
	return b.String()
}

// JSON shapes of the index answers.

type jsonFeed struct {
	Name   string    `json:"name"`
	Last   time.Time `json:"last"`
	Cursor int64     `json:"cursor,omitempty"`
	Lost   int64     `json:"lost"`
	LostAt time.Time `json:"lostAt,omitzero"`
}

type jsonAttempt struct {
	Attempt int       `json:"attempt"`
	Outcome string    `json:"outcome"`
	At      time.Time `json:"at"`
	Error   string    `json:"error,omitempty"`
	Reason  string    `json:"reason,omitempty"`
	NextDue time.Time `json:"nextDue,omitzero"`
	// Immediate is how many immediate retries the attempt made in its delivery.
	Immediate int    `json:"immediate"`
	Process   string `json:"process,omitempty"`
	Feed      string `json:"feed"`
}

type jsonEvent struct {
	Chain     string `json:"chain"`
	State     string `json:"state"`
	Attempt   int    `json:"attempt"`
	Immediate int    `json:"immediate"`
	// Hold says what holds a pending event: "session" (a session consumer's durable hold, the message
	// deferred in its session) or "outage" (the outage breaker's copy); absent for a retry copy.
	Hold              string        `json:"hold,omitempty"`
	Due               time.Time     `json:"due,omitzero"`
	Ref               string        `json:"ref,omitempty"`
	Entity            string        `json:"entity,omitempty"`
	SequenceNumber    int64         `json:"sequenceNumber,omitempty"`
	RetryMessageID    string        `json:"retryMessageId,omitempty"`
	OriginalMessageID string        `json:"originalMessageId"`
	Key               string        `json:"key"`
	CorrelationID     string        `json:"correlationId"`
	Source            string        `json:"source,omitempty"`
	LastError         string        `json:"lastError,omitempty"`
	Reason            string        `json:"reason,omitempty"`
	Updated           time.Time     `json:"updated"`
	Feed              string        `json:"feed"`
	History           []jsonAttempt `json:"history,omitempty"`
}

func feedsJSON(fs []retryindex.FeedStatus) []jsonFeed {
	out := make([]jsonFeed, len(fs))
	for i, f := range fs {
		out[i] = jsonFeed{Name: f.Name, Last: f.Last, Cursor: f.Cursor, Lost: f.Lost, LostAt: f.LostAt}
	}
	return out
}

func eventJSON(e retryindex.Event) jsonEvent {
	j := jsonEvent{
		Chain: e.Chain, State: e.State.String(), Attempt: e.Attempt, Immediate: e.Immediate, Due: e.Due, Entity: e.Entity, SequenceNumber: e.SequenceNumber,
		RetryMessageID: e.RetryMessageID(), OriginalMessageID: e.OriginalID, Key: e.Key, CorrelationID: e.CorrelationID,
		Source: e.Source, LastError: redact.String(e.LastError), Reason: e.Reason, Updated: e.Updated, Feed: e.Feed,
	}
	if e.Entity != "" && e.SequenceNumber > 0 {
		j.Ref = fmt.Sprintf("%s:%d", e.Entity, e.SequenceNumber)
	}
	if e.State == retryindex.StatePending {
		switch e.Kind {
		case retryindex.KindDeferred:
			j.Hold = "session"
		case retryindex.KindHeld:
			j.Hold = "outage"
		}
	}
	for _, h := range e.History {
		j.History = append(j.History, jsonAttempt{Attempt: h.Attempt, Outcome: h.Kind.String(), At: h.At, Error: redact.String(h.Error),
			Reason: h.Reason, NextDue: h.NextDue, Immediate: h.Immediate, Process: h.Process, Feed: h.Feed})
	}
	return j
}

// statusFromIndex answers status from the index at path: where the event stands, and its history.
func (a *app) statusFromIndex(ctx context.Context, c *common, path, id string) error {
	source, err := indexSource(c)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	idx, path, err := openIndex(ctx, path)
	if err != nil {
		return err
	}
	defer func() { _ = idx.Close() }()
	ans, err := idx.Lookup(ctx, id, nil)
	if err != nil {
		return err
	}
	events := ans.Events[:0:0]
	for _, e := range ans.Events {
		if source == "" || strings.EqualFold(e.Source, source) {
			events = append(events, e)
		}
	}
	if c.json {
		out := struct {
			ID        string      `json:"id"`
			From      string      `json:"from"`
			Index     string      `json:"index"`
			AsOf      time.Time   `json:"asOf"`
			Feeds     []jsonFeed  `json:"feeds"`
			Events    []jsonEvent `json:"events"`
			Truncated bool        `json:"truncated"`
		}{ID: id, From: "index", Index: path, AsOf: ans.AsOf, Feeds: feedsJSON(ans.Feeds), Events: []jsonEvent{}, Truncated: ans.Truncated}
		for _, e := range events {
			out.Events = append(out.Events, eventJSON(e))
		}
		if err := writeJSON(a.stdout, out); err != nil {
			return err
		}
	} else {
		w := a.stdout
		where := "the index"
		if source != "" {
			where = source + " in the index"
		}
		fmt.Fprintf(w, "%s on %s: from index %s, %s\n", id, where, path, describeFreshness(ans.Freshness))
		for _, e := range events {
			writeIndexEvent(w, e, a.now())
		}
		if ans.Truncated {
			fmt.Fprintf(w, "  (more events match %s than shown: the newest %d are listed)\n", id, len(ans.Events))
		}
		if len(events) == 0 {
			fmt.Fprintf(w, "  no trace in the index: searched retry message ids, original message ids, idempotency keys and correlation ids (a message that succeeded at its first attempt is not recorded, unless its consumer's recorder sets RecordFirstAttempts; one not delivered yet has no trace either)\n")
		}
	}
	if len(events) == 0 {
		return errNothingFound
	}
	return nil
}

// writeIndexEvent prints one event: its state in the words status uses, then its history.
func writeIndexEvent(w io.Writer, e retryindex.Event, now time.Time) {
	switch e.State {
	case retryindex.StatePending:
		switch e.Kind {
		case retryindex.KindDeferred:
			fmt.Fprintf(w, "  held in its session until %s (a session consumer's durable hold; then attempt %d), %s; the session's later messages wait behind it", formatTime(e.Due), e.Attempt, relative(e.Due, now))
			if e.Entity != "" {
				fmt.Fprintf(w, "; deferred in %s", e.Entity)
			}
		case retryindex.KindHeld:
			fmt.Fprintf(w, "  held by the outage breaker until %s (attempt %d again: a hold spends no attempt), %s", formatTime(e.Due), e.Attempt, relative(e.Due, now))
		default:
			fmt.Fprintf(w, "  will be retried at %s (attempt %d), %s", formatTime(e.Due), e.Attempt, relative(e.Due, now))
		}
		if e.Kind != retryindex.KindDeferred {
			if e.SequenceNumber > 0 && e.Entity != "" {
				fmt.Fprintf(w, "; sequence number %d in %s", e.SequenceNumber, e.Entity)
			}
			fmt.Fprintf(w, ", message id %s", e.RetryMessageID())
		}
	case retryindex.StateActive:
		fmt.Fprintf(w, "  active (attempt %d): receivable or being processed, since %s", e.Attempt, formatTime(e.Updated))
	case retryindex.StateSucceeded:
		fmt.Fprintf(w, "  succeeded at %s (attempt %d)", formatTime(e.Updated), e.Attempt)
	case retryindex.StateDeadLettered:
		fmt.Fprintf(w, "  dead-lettered at %s: %s (attempt %d)", formatTime(e.Updated), printable(clip(e.Reason, 200)), e.Attempt)
		if e.SequenceNumber > 0 && e.Entity != "" {
			fmt.Fprintf(w, "; sequence number %d in %s", e.SequenceNumber, e.Entity)
		}
	case retryindex.StateDiscarded:
		fmt.Fprintf(w, "  discarded by a retry policy at %s (attempt %d)", formatTime(e.Updated), e.Attempt)
	case retryindex.StateGone:
		fmt.Fprintf(w, "  copy gone (found missing at %s): its retry copy is no longer in %s and no feed said why (consumed by a consumer that does not record, or cancelled)", formatTime(e.Updated), e.Entity)
	}
	if e.LastError != "" && e.State != retryindex.StateSucceeded {
		fmt.Fprintf(w, "; last error: %s", printable(clip(redact.String(e.LastError), 200)))
	}
	// Ids, reasons and errors are the producer's: quoted when they hold anything a terminal would act on.
	fmt.Fprintf(w, " [original id %s, key %s, correlation id %s; updated by the %s feed]\n", printable(e.OriginalID), printable(e.Key), printable(e.CorrelationID), e.Feed)
	if len(e.History) == 0 {
		return
	}
	fmt.Fprintln(w, "  history:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, h := range e.History {
		line := fmt.Sprintf("    %s\tattempt %d\t%s", formatTime(h.At), h.Attempt, h.Kind)
		if !h.NextDue.IsZero() {
			line += ", due " + formatTime(h.NextDue)
		}
		if h.Immediate > 0 {
			line += fmt.Sprintf(" (after %d immediate retries)", h.Immediate)
		}
		if h.Reason != "" {
			line += ": " + printable(clip(h.Reason, 200))
		}
		if h.Error != "" {
			line += "; error: " + printable(clip(redact.String(h.Error), 120))
		}
		fmt.Fprintf(tw, "%s\t%s (%s)\n", line, printable(h.Process), h.Feed)
	}
	_ = tw.Flush()
}

// pendingFromIndex lists one page of pending retries from the index at path, in due order, with the
// exact total.
func (a *app) pendingFromIndex(ctx context.Context, c *common, path string, limit int, cursor string, wide bool) error {
	source, err := indexSource(c)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	idx, name, err := openIndex(ctx, path)
	if err != nil {
		return err
	}
	defer func() { _ = idx.Close() }()
	page, err := idx.Pending(ctx, &retryindex.PendingOptions{Limit: limit, Cursor: cursor, Source: source})
	if errors.Is(err, retryindex.ErrInvalidCursor) {
		return usagef("--cursor %q: not a cursor of pending --index", cursor)
	}
	if err != nil {
		return err
	}
	if c.json {
		out := struct {
			From    string      `json:"from"`
			Index   string      `json:"index"`
			AsOf    time.Time   `json:"asOf"`
			Feeds   []jsonFeed  `json:"feeds"`
			Total   int64       `json:"total"`
			Pending []jsonEvent `json:"pending"`
			Next    string      `json:"next,omitempty"`
		}{From: "index", Index: name, AsOf: page.AsOf, Feeds: feedsJSON(page.Feeds), Total: page.Total, Pending: []jsonEvent{}, Next: page.Next}
		for _, e := range page.Items {
			out.Pending = append(out.Pending, eventJSON(e))
		}
		return writeJSON(a.stdout, out)
	}
	fmt.Fprintf(a.stdout, "%d pending retries, from index %s, %s\n", page.Total, name, describeFreshness(page.Freshness))
	if len(page.Items) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	head := "ENTITY\tSEQ\tDUE\tATTEMPT\tORIGINAL ID"
	if wide {
		head += "\tMESSAGE ID\tKEY"
	}
	fmt.Fprintln(tw, head+"\tLAST ERROR")
	for _, e := range page.Items {
		entity, seq := e.Entity, "?"
		if entity == "" {
			entity = "?"
		}
		if e.SequenceNumber > 0 {
			seq = fmt.Sprint(e.SequenceNumber)
		}
		line := fmt.Sprintf("%s\t%s\t%s\t%d\t%s", entity, seq, formatTime(e.Due), e.Attempt, printable(clip(e.OriginalID, 60)))
		if wide {
			line += "\t" + e.RetryMessageID() + "\t" + printable(clip(e.Key, 60))
		}
		fmt.Fprintln(tw, line+"\t"+printable(clip(redact.String(e.LastError), 60)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if page.Next != "" {
		fmt.Fprintf(a.stdout, "more: sbretry pending --index %s --limit %d --cursor %s\n", shellWord(path, name), limit, page.Next)
	}
	return nil
}

// errPartialNotFound is status finding nothing in a scan that stopped at --max-peek: it exits with
// exitPartial, since the messages beyond the bound were not read.
var errPartialNotFound = errors.New("nothing found in a partial read")

// shellWord is the --index value to repeat in a suggested command: the file path, or for a
// PostgreSQL URL (which may hold a password) a placeholder naming the database.
func shellWord(spec, name string) string {
	if spec == name {
		return spec
	}
	return "'<URL of the " + name + ">'"
}

// dlqPageRead is how many dead-lettered events dlq list --index reads from the index at a time while
// filling a page through --reason or --contains.
const dlqPageRead = 500

// dlqFromIndex lists dead-lettered events from the index at path, the most recently dead-lettered
// first, with the exact total: one page of limit, continued by cursor. The filters mean what they mean
// for a scan: --since and --until bound when the event was dead-lettered (--until starts the listing
// there), --reason is its reason, --contains searches its last error, ignoring case (the index keeps
// no description apart from the reason). With --reason or --contains the index is read page by page
// until the page is full or the listing passes --since; the total then counts every dead-lettered
// event, and the output says how many it read.
func (a *app) dlqFromIndex(ctx context.Context, c *common, path string, f inspect.DeadLetterFilter, limit int, cursor string, wide bool) error {
	source, err := indexSource(c)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	idx, name, err := openIndex(ctx, path)
	if err != nil {
		return err
	}
	defer func() { _ = idx.Close() }()
	if cursor == "" && !f.Until.IsZero() {
		// (time, id) below (until, the least id): dead-lettered before --until, as a scan filters.
		cursor = strconv.FormatInt(f.Until.UnixMilli(), 10) + "." + strconv.FormatInt(math.MinInt64, 10)
	}
	filtered := f.Reason != "" || f.Contains != ""
	keep := func(e retryindex.Event) bool {
		switch {
		case f.Reason != "" && !strings.EqualFold(e.Reason, f.Reason):
			return false
		case f.Contains != "":
			needle := strings.ToLower(f.Contains)
			return strings.Contains(strings.ToLower(e.LastError), needle) || strings.Contains(strings.ToLower(e.Reason), needle)
		}
		return true
	}
	read1 := func(from string, n int) (*retryindex.PendingPage, error) {
		page, err := idx.DeadLettered(ctx, &retryindex.PendingOptions{Limit: n, Cursor: from, Source: source})
		if errors.Is(err, retryindex.ErrInvalidCursor) {
			return nil, usagef("--cursor %q: not a cursor of dlq list --index", cursor)
		}
		return page, err
	}
	var items []retryindex.Event
	var first *retryindex.PendingPage
	next, read := cursor, 0
	for {
		from, n := next, limit-len(items)
		if filtered {
			n = dlqPageRead
		}
		page, err := read1(from, n)
		if err != nil {
			return err
		}
		if first == nil {
			first = page
		}
		next = page.Next
		for i, e := range page.Items {
			if !f.Since.IsZero() && e.Updated.Before(f.Since) {
				next = "" // older ones follow: the listing is done
				break
			}
			read++
			if !keep(e) {
				continue
			}
			items = append(items, e)
			if len(items) == limit && i < len(page.Items)-1 {
				// Full within this read: the cursor after e is the Next of the same read cut there.
				cut, err := read1(from, i+1)
				if err != nil {
					return err
				}
				next = cut.Next
				break
			}
		}
		if next == "" || len(items) == limit {
			break
		}
	}
	if c.json {
		out := struct {
			From        string      `json:"from"`
			Index       string      `json:"index"`
			AsOf        time.Time   `json:"asOf"`
			Feeds       []jsonFeed  `json:"feeds"`
			Total       int64       `json:"total"`
			Read        int         `json:"read"`
			DeadLetters []jsonEvent `json:"deadLetters"`
			Next        string      `json:"next,omitempty"`
		}{From: "index", Index: name, AsOf: first.AsOf, Feeds: feedsJSON(first.Feeds), Total: first.Total, Read: read, DeadLetters: []jsonEvent{}, Next: next}
		for _, e := range items {
			out.DeadLetters = append(out.DeadLetters, eventJSON(e))
		}
		return writeJSON(a.stdout, out)
	}
	fmt.Fprintf(a.stdout, "%d dead-lettered events, from index %s, %s\n", first.Total, name, describeFreshness(first.Freshness))
	if len(items) == 0 {
		fmt.Fprintf(a.stdout, "no matching dead letters among the %d read from the index\n", read)
		return nil
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	head := "ENTITY\tSEQ\tDEAD-LETTERED\tREASON\tATTEMPT\tORIGINAL ID"
	if wide {
		head += "\tCHAIN\tKEY"
	}
	fmt.Fprintln(tw, head+"\tLAST ERROR")
	for _, e := range items {
		entity, seq := e.Entity, "?"
		if entity == "" {
			entity = "?"
		}
		if e.SequenceNumber > 0 {
			seq = strconv.FormatInt(e.SequenceNumber, 10)
		}
		line := fmt.Sprintf("%s\t%s\t%s\t%s\t%d\t%s", entity, seq, formatTime(e.Updated), printable(clip(e.Reason, 60)), e.Attempt, printable(clip(e.OriginalID, 60)))
		if wide {
			line += "\t" + e.Chain + "\t" + printable(clip(e.Key, 60))
		}
		fmt.Fprintln(tw, line+"\t"+printable(clip(redact.String(e.LastError), 60)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if filtered {
		fmt.Fprintf(a.stdout, "%d matching, among %d read from the index\n", len(items), read)
	}
	if next != "" {
		fmt.Fprintf(a.stdout, "more: sbretry dlq list --index %s --limit %d --cursor %s\n", shellWord(path, name), limit, next)
	}
	return nil
}
