package console

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/retryindex"
)

// Index is what the console asks of a retry-state index: [retryindex.Store] has it
// (retryindex.OpenSQLite, retryindex/postgres.Open), and so does anything that answers the same way.
// The search page looks events up in it; the overview, the pending page, its chart and the
// dead-letter page list and count from it. The console only reads through it, and never closes it.
type Index interface {
	// Lookup finds the events id names: a retry MessageID or a chain id, else the events whose
	// original MessageID, idempotency key or correlation id is id, each with its history and the
	// answer's freshness.
	Lookup(ctx context.Context, id string, opts *retryindex.LookupOptions) (*retryindex.Answer, error)
	// Pending pages the pending retries of one source entity in due order, with their exact count
	// and the answer's freshness.
	Pending(ctx context.Context, opts *retryindex.PendingOptions) (*retryindex.PendingPage, error)
	// DeadLettered pages the dead-lettered events of one source entity, the most recent first, with
	// their exact count and the answer's freshness.
	DeadLettered(ctx context.Context, opts *retryindex.PendingOptions) (*retryindex.PendingPage, error)
	// PendingHistogram counts the pending retries of one source entity by due time, exactly, for the
	// pending page's chart.
	PendingHistogram(ctx context.Context, opts *retryindex.HistogramOptions) (*retryindex.Histogram, error)
}

// The stores of package retryindex are Indexes.
var (
	_ Index = retryindex.Store(nil)
	_ Index = (*retryindex.SQLite)(nil)
)

// maxQueryBytes bounds the search query: the longest identifier (key, correlation id, original
// MessageID) the retry library accepts in an envelope. A longer query cannot match anything, and is
// refused before anything is read.
const maxQueryBytes = 1024

// searchPage is what the search page shows for one query.
type searchPage struct {
	// Query is what was asked, as typed (the template shows it through text, never raw).
	Query string
	// Empty says no query was given: the page only invites one.
	Empty bool
	// FromIndex says the answer comes from Options.Index; otherwise from a scan of the broker.
	FromIndex bool
	// HasIndex says the console has an index, so a scan was asked for explicitly (from=broker).
	HasIndex bool
	// Findings are where the event (or the events the query names) stands.
	Findings []finding

	// From the index: as of when, each feed's last write, whether more events matched than shown, and
	// how many matched in entities this console does not show.
	AsOf      time.Time
	Feeds     []feedLine
	Truncated bool
	Elsewhere int

	// From a scan: when it was read, what was read, and whether the answer is partial (a scan stopped
	// at MaxPeek, or an entity could not be read).
	ReadAt   time.Time
	Scans    []scanLine
	Partial  bool
	Sessions []string // session entities: their held sessions were not searched
	MaxPeek  int
}

// feedLine is one feed of the index with its last write, relative to the answer.
type feedLine struct {
	Name   string
	Last   time.Time
	Ago    string
	Cursor int64
	Tailer bool
	// Lost counts the records the feed could not store since the last rebuild, LostAt when the last
	// loss was noted: the answer may miss what they said.
	Lost   int64
	LostAt time.Time
}

// scanLine is one entity read by a scan, or the error that stopped its read.
type scanLine struct {
	Entity    string
	Peeked    int
	Truncated bool
	Err       string
}

// finding is one place the searched event stands, from the index or from a scan, with what the
// operator may do about it.
type finding struct {
	// State is pending, held, active, succeeded, dead-lettered, discarded or gone.
	State string
	// Entity is the console entity the event belongs to; empty when this console does not show it.
	Entity string
	// Ref names the retry copy or dead letter in the broker (ENTITY:SEQ), when known.
	Ref string
	// At is when it falls due (pending, held), or when the state began (the others); Relative says it
	// from now.
	At       time.Time
	Relative string
	// Attempt is the attempt the state is about; MaxAttempts the entity's configured bound (0 when not
	// configured: the page then says "attempt n" alone).
	Attempt, MaxAttempts int
	// MessageID is the copy's or dead letter's MessageID; OriginalID, Key and CorrelationID the event's
	// names.
	MessageID, OriginalID, Key, CorrelationID string
	// LastError is the last recorded error; Reason the dead-letter reason.
	LastError, Reason string
	// Updated and Feed say how fresh an index finding is; History is its attempts (index only).
	Updated time.Time
	Feed    string
	History []retryindex.Attempt
	// Cancel offers the cancel preview of the pending copy Ref; DeadLetter offers the message page and
	// the redrive (to Target, when there is one) and purge previews of the dead letter Ref.
	Cancel, DeadLetter bool
	Target             string
}

// search answers "where is this event?" for an id, a key or a correlation id: from the index when the
// console has one (Options.Index), else by scanning each entity through package inspect, saying when
// the scan was partial. The query is the visitor's text: it is bounded, shown only through text (escaped
// and made showable), and never logged.
func (c *Console) search(w http.ResponseWriter, r *http.Request) {
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	if len(q) > maxQueryBytes {
		// The query itself is not repeated: it may be anything, of any size.
		c.fail(w, r, http.StatusBadRequest, "the search query is %d bytes long; ids, keys and correlation ids are at most %d", len(q), maxQueryBytes)
		return
	}
	if !utf8.ValidString(q) {
		// Service Bus ids and properties are AMQP strings, valid UTF-8: such a query matches nothing, and
		// a database index may refuse it outright.
		c.fail(w, r, http.StatusBadRequest, "the search query is not valid UTF-8 text; ids, keys and correlation ids are")
		return
	}
	pg := &searchPage{Query: q, Empty: q == "", HasIndex: c.opts.Index != nil, MaxPeek: c.opts.MaxPeek}
	if pg.Empty {
		c.render(w, r, http.StatusOK, "search.html", "Search", pg)
		return
	}
	ctx, cancel := readContext(r)
	defer cancel()
	if c.opts.Index != nil && r.URL.Query().Get("from") != "broker" {
		if err := c.searchIndex(ctx, pg); err != nil {
			c.fail(w, r, http.StatusBadGateway, "reading the retry-state index: %v (search the broker instead: add &from=broker)", err)
			return
		}
	} else {
		c.searchBroker(ctx, pg)
	}
	c.render(w, r, http.StatusOK, "search.html", "Search", pg)
}

// searchIndex answers pg's query from the index: the events of the console's entities, with their
// history, and the answer's freshness.
func (c *Console) searchIndex(ctx context.Context, pg *searchPage) error {
	ans, err := c.opts.Index.Lookup(ctx, pg.Query, nil)
	if err != nil {
		return err
	}
	now := c.now()
	pg.FromIndex, pg.AsOf, pg.Truncated = true, ans.AsOf, ans.Truncated
	pg.Feeds = feedLines(ans.Freshness)
	for _, ev := range ans.Events {
		e := c.entityOfEvent(ev)
		if e == nil {
			// An index may be shared by consoles of other entities: this console shows only its own.
			pg.Elsewhere++
			continue
		}
		pg.Findings = append(pg.Findings, c.eventFinding(e, ev, now))
	}
	return nil
}

// entityOfEvent is the console entity an indexed event belongs to: the entity its chain started on,
// else the one whose queue, retry queue or dead-letter queue holds its copy; nil when this console
// does not show it.
func (c *Console) entityOfEvent(ev retryindex.Event) *entity {
	if e := c.byPath[strings.ToLower(ev.Source)]; e != nil {
		return e
	}
	held := strings.ToLower(ev.Entity)
	held = strings.TrimSuffix(held, strings.ToLower(deadLetterSuffix))
	if held == "" {
		return nil
	}
	if e := c.byPath[held]; e != nil {
		return e
	}
	for _, e := range c.entities {
		if e.cfg.RetryQueue != "" && strings.EqualFold(e.cfg.RetryQueue, held) {
			return e
		}
	}
	return nil
}

// deadLetterSuffix ends the path of a dead-letter queue.
const deadLetterSuffix = "/$DeadLetterQueue"

// eventFinding is an indexed event as the search page shows it, with the actions that apply: a
// pending copy whose place is known can be cancelled, a dead letter whose place is known opened,
// redriven or purged. Each action is only its preview, which reads the broker again.
func (c *Console) eventFinding(e *entity, ev retryindex.Event, now time.Time) finding {
	f := finding{
		State: ev.State.String(), Entity: e.cfg.Path, Attempt: ev.Attempt, MaxAttempts: e.cfg.MaxAttempts,
		OriginalID: ev.OriginalID, Key: ev.Key, CorrelationID: ev.CorrelationID, LastError: ev.LastError, Reason: ev.Reason,
		Updated: ev.Updated, Feed: ev.Feed, History: ev.History, At: ev.Updated, MessageID: ev.RetryMessageID(),
	}
	if ev.Entity != "" && ev.SequenceNumber > 0 {
		f.Ref = inspect.Ref{Entity: ev.Entity, SequenceNumber: ev.SequenceNumber}.String()
	}
	switch ev.State {
	case retryindex.StatePending:
		f.At = ev.Due
		f.Relative = relative(ev.Due, now)
		if e.session.Load() || e.cfg.SessionConsumer {
			// A session consumer holds the message in its session; the held-sessions page releases it.
			f.State = "held"
			break
		}
		f.Cancel = f.Ref != "" && containsFold(e.in.RetryEntities(), ev.Entity)
	case retryindex.StateDeadLettered:
		f.DeadLetter = f.Ref != "" && containsFold(e.inspector().DeadLetterQueues(), ev.Entity)
		f.Target = e.target
	}
	if f.Relative == "" {
		f.Relative = relative(f.At, now)
	}
	return f
}

// searchBroker answers pg's query by scanning each entity (inspect.Inspector.Status: its queues and
// dead-letter queues, each up to MaxPeek messages). The answer is partial when a scan stopped at the
// bound or an entity could not be read, and the page says so.
func (c *Console) searchBroker(ctx context.Context, pg *searchPage) {
	now := c.now()
	pg.ReadAt = now
	for _, e := range c.entities {
		if e.session.Load() {
			c.searchSessionEntity(ctx, pg, e, now)
			continue
		}
		st, err := e.in.Status(ctx, pg.Query)
		if err != nil && c.recognise(ctx, e, err) {
			c.searchSessionEntity(ctx, pg, e, now)
			continue
		}
		if st != nil {
			pg.addScans(st.Scans)
			for _, p := range st.Pending {
				pg.Findings = append(pg.Findings, finding{
					State: "pending", Entity: e.cfg.Path, Ref: p.Ref().String(), At: p.DueTime, Relative: relative(p.DueTime, now),
					Attempt: p.Attempt, MaxAttempts: e.cfg.MaxAttempts, MessageID: p.MessageID, OriginalID: p.Envelope.OriginalMessageID,
					Key: p.Envelope.Key, CorrelationID: p.Envelope.CorrelationID, LastError: p.LastError,
					Cancel: containsFold(e.in.RetryEntities(), p.Entity),
				})
			}
			for _, a := range st.Active {
				pg.Findings = append(pg.Findings, finding{
					State: "active", Entity: e.cfg.Path, Ref: a.Ref().String(), At: a.EnqueuedTime, Relative: relative(a.EnqueuedTime, now),
					Attempt: a.Attempt, MaxAttempts: e.cfg.MaxAttempts, MessageID: a.MessageID, OriginalID: a.Envelope.OriginalMessageID,
					Key: a.Envelope.Key, CorrelationID: a.Envelope.CorrelationID, LastError: a.LastError,
				})
			}
			for _, d := range st.DeadLetters {
				pg.Findings = append(pg.Findings, deadLetterFinding(e, d, now))
			}
		}
		if err != nil {
			pg.Partial = true
			pg.Scans = append(pg.Scans, scanLine{Entity: e.cfg.Path, Err: describeReadError(err)})
		}
	}
}

// searchSessionEntity searches a session entity's dead-letter queue: its held sessions are read
// session by session (each accepted and locked for a moment), which a search does not do; the page
// says so and links to them.
func (c *Console) searchSessionEntity(ctx context.Context, pg *searchPage, e *entity, now time.Time) {
	pg.Sessions = append(pg.Sessions, e.cfg.Path)
	list, err := e.sessionIn.DeadLetters(ctx, inspect.DeadLetterFilter{})
	if list != nil {
		pg.addScans([]inspect.Scan{list.Scan})
		if list.RetryQueueScan != nil {
			pg.addScans([]inspect.Scan{*list.RetryQueueScan})
		}
		for _, d := range list.Items {
			if d.MessageID == pg.Query || d.Key == pg.Query || d.CorrelationID == pg.Query || d.OriginalMessageID() == pg.Query {
				pg.Findings = append(pg.Findings, deadLetterFinding(e, d, now))
			}
		}
	}
	if err != nil {
		pg.Partial = true
		pg.Scans = append(pg.Scans, scanLine{Entity: e.cfg.Path, Err: describeReadError(err)})
	}
}

// addScans records what a scan read, and makes the answer partial when it stopped at MaxPeek.
func (pg *searchPage) addScans(scans []inspect.Scan) {
	for _, s := range scans {
		pg.Scans = append(pg.Scans, scanLine{Entity: s.Entity, Peeked: s.Peeked, Truncated: s.Truncated})
		pg.Partial = pg.Partial || s.Truncated
	}
}

// deadLetterFinding is a scanned dead letter as the search page shows it.
func deadLetterFinding(e *entity, d inspect.DeadLetter, now time.Time) finding {
	return finding{
		State: "dead-lettered", Entity: e.cfg.Path, Ref: d.Ref().String(), At: d.DeadLetteredAt, Relative: relative(d.DeadLetteredAt, now),
		Attempt: d.Attempt, MaxAttempts: e.cfg.MaxAttempts, MessageID: d.MessageID, OriginalID: d.OriginalMessageID(),
		Key: d.Key, CorrelationID: d.CorrelationID, LastError: errorText(d), Reason: d.Reason,
		DeadLetter: true, Target: e.target,
	}
}

// containsFold reports whether list holds s, ignoring case (Service Bus names are case-insensitive).
func containsFold(list []string, s string) bool {
	for _, x := range list {
		if strings.EqualFold(x, s) {
			return true
		}
	}
	return false
}

// relative says t from now: "in 59m0s", "3m0s ago"; empty for a zero time.
func relative(t, now time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := t.Sub(now).Round(time.Second)
	if d >= 0 {
		return "in " + d.String()
	}
	return (-d).String() + " ago"
}

// ago says how long before asOf a feed last wrote.
func ago(asOf, last time.Time) string {
	if last.IsZero() {
		return "never"
	}
	return fmt.Sprintf("%s before", asOf.Sub(last).Round(time.Second))
}
