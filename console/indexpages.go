package console

import (
	"context"
	"errors"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/redact"
	"github.com/sbretry/retry/retryindex"
)

// indexFreshness is how fresh an answer from the index is, as every index-backed page shows it: as
// of when the index answered, when each feed last wrote, and how many records the feeds lost.
type indexFreshness struct {
	AsOf  time.Time
	Feeds []feedLine
	// Lost sums the feeds' lost records: when it is not zero the answer may miss what they said,
	// until a rebuild from the broker.
	Lost int64
}

// feedLines are the index's feeds as the pages show them, each relative to the answer.
func feedLines(f retryindex.Freshness) []feedLine {
	out := make([]feedLine, 0, len(f.Feeds))
	for _, fs := range f.Feeds {
		out = append(out, feedLine{Name: fs.Name, Last: fs.Last, Ago: ago(f.AsOf, fs.Last), Cursor: fs.Cursor,
			Tailer: strings.HasPrefix(fs.Name, retryindex.FeedTailer), Lost: fs.Lost, LostAt: fs.LostAt})
	}
	return out
}

// freshnessOf is an index answer's freshness for the pages.
func freshnessOf(f retryindex.Freshness) *indexFreshness {
	out := &indexFreshness{AsOf: f.AsOf, Feeds: feedLines(f)}
	for _, fs := range f.Feeds {
		out.Lost += fs.Lost
	}
	return out
}

// fromIndex says whether the page r asks for about e answers from the index: the console has one,
// the page did not ask for the broker (from=broker), and e is not a session entity (a session
// consumer holds its retries in the sessions, which its own page lists).
func (c *Console) fromIndex(r *http.Request, e *entity) bool {
	return c.opts.Index != nil && r.FormValue("from") != "broker" && !e.session.Load()
}

// brokerParam is what a page's links add to keep reading the broker when the console has an index
// and the page was asked for the broker: the index's cursors and the broker's are not the same.
func (c *Console) brokerParam(r *http.Request) string {
	if c.opts.Index != nil && r.FormValue("from") == "broker" {
		return "&from=broker"
	}
	return ""
}

// indexFailed shows why the index could not answer, and how to read the broker instead.
func (c *Console) indexFailed(w http.ResponseWriter, r *http.Request, e *entity, what string, err error) {
	if errors.Is(err, retryindex.ErrInvalidCursor) {
		c.fail(w, r, http.StatusBadRequest, "%s of %s: the cursor is not one the index wrote: start from the first page", what, e.cfg.Path)
		return
	}
	c.fail(w, r, http.StatusBadGateway, "%s of %s from the retry-state index: %v (read the broker instead: add &from=broker)", what, e.cfg.Path, err)
}

// indexSource is the source entity the index's listings of e are filtered by: e's path, which the
// stores answer from their indexes and counts by source, or none when the index is declared e's
// alone (Options.IndexDedicated, deprecated).
func (c *Console) indexSource(e *entity) string {
	if c.opts.IndexDedicated {
		return ""
	}
	return e.cfg.Path
}

// indexedRows are the page rows of the events of a listing of e; foreign counts the events of other
// entities a dedicated index held (left out: the page says so, as the index is then not e's alone).
func (c *Console) indexedRows(e *entity, evs []retryindex.Event) (rows []indexedRow, foreign int) {
	rows = make([]indexedRow, 0, len(evs))
	for _, ev := range evs {
		if c.opts.IndexDedicated && !strings.EqualFold(ev.Source, e.cfg.Path) {
			foreign++
			continue
		}
		rows = append(rows, indexedRowOf(e, ev))
	}
	return rows, foreign
}

// indexedRow is one event of an index-backed page: where the index says its copy or dead letter is,
// and the MessageID it expects there, which an action checks against the broker before it acts.
type indexedRow struct {
	// Ref is ENTITY:SEQ of the copy or dead letter; empty when no feed recorded where it is.
	Ref            string
	Entity         string
	SequenceNumber int64
	// At is when the retry falls due, or when the event was dead-lettered.
	At                    time.Time
	Attempt               int
	OriginalID, MessageID string
	LastError, Reason     string
	// Held says the retry is a copy the outage breaker held (KindHeld).
	Held bool
	// Act says the row can be selected for an action: its place and MessageID are known, in an
	// entity this console acts on.
	Act bool
	// Expect is the form value that makes an action check the row against the broker: REF=MESSAGEID.
	Expect string
}

// indexedRowOf is the indexed event ev of e as a page row.
func indexedRowOf(e *entity, ev retryindex.Event) indexedRow {
	row := indexedRow{Entity: ev.Entity, SequenceNumber: ev.SequenceNumber, Attempt: ev.Attempt, OriginalID: ev.OriginalID,
		LastError: ev.LastError, Reason: ev.Reason, Held: ev.Kind == retryindex.KindHeld}
	if ev.Entity != "" && ev.SequenceNumber > 0 {
		row.Ref = inspect.Ref{Entity: ev.Entity, SequenceNumber: ev.SequenceNumber}.String()
	}
	switch ev.State {
	case retryindex.StatePending:
		row.At, row.MessageID = ev.Due, ev.RetryMessageID()
		row.Act = row.Ref != "" && row.MessageID != "" && containsFold(e.in.RetryEntities(), ev.Entity)
	case retryindex.StateDeadLettered:
		row.At, row.MessageID = ev.Updated, deadLetterMessageID(ev)
		row.Act = row.Ref != "" && containsFold(e.in.DeadLetterQueues(), ev.Entity)
	}
	if row.Act {
		row.Expect = row.Ref + "=" + row.MessageID
	}
	return row
}

// deadLetterMessageID is the MessageID of the message an event was dead-lettered as: its first
// delivery (the original MessageID) when it failed at its first attempt, else the retry copy of the
// attempt that failed last ([retryindex.Event.RetryMessageID]'s form).
func deadLetterMessageID(ev retryindex.Event) string {
	if ev.Attempt <= 1 {
		return ev.OriginalID
	}
	return "sbretry-" + ev.Chain + "-" + itoa(ev.Attempt)
}

// pendingFromIndex is the pending page from the index: the entity's pending retries in true due order
// over the whole backlog, a page at a time by the index's cursor, with their exact count and the
// answer's freshness.
func (c *Console) pendingFromIndex(w http.ResponseWriter, r *http.Request, e *entity) {
	ctx, cancel := readContext(r)
	defer cancel()
	cursor := r.FormValue("cursor")
	pg, err := c.opts.Index.Pending(ctx, &retryindex.PendingOptions{Limit: c.opts.PageSize, Cursor: cursor, Source: c.indexSource(e)})
	if err != nil {
		c.indexFailed(w, r, e, "listing the pending retries", err)
		return
	}
	rows, foreign := c.indexedRows(e, pg.Items)
	base := "pending?e=" + url.QueryEscape(e.cfg.Path)
	data := map[string]any{
		"Entity": e.cfg.Path, "FromIndex": true, "Index": freshnessOf(pg.Freshness), "Total": pg.Total, "Rows": rows, "Foreign": foreign,
		"First": cursor == "", "FirstHref": template.URL(base), "BrokerHref": template.URL(base + "&from=broker"),
		"Filter": filterForm{}, "Bodies": c.opts.FilterBodies, "Clear": template.URL(base),
	}
	if pg.Next != "" {
		data["NextHref"] = template.URL(base + "&cursor=" + url.QueryEscape(pg.Next))
	}
	c.render(w, r, http.StatusOK, "pending.html", "Pending retries of "+e.cfg.Path, data)
}

// indexGroup is a failure group of the most recent dead letters the index lists.
type indexGroup struct {
	ID, Reason, Pattern string
	Count               int
	FirstSeen, LastSeen time.Time
	ExampleRef, Example string
	// Items are the group's dead letters, newest first.
	Items []retryindex.Event
}

// deadLettersFromIndex is the dead-letter page from the index: the entity's dead letters newest
// first, a page at a time by the index's cursor, with their exact count and the answer's freshness,
// and the failure groups of the most recent indexGroupWindow of them (the page says of how many).
func (c *Console) deadLettersFromIndex(w http.ResponseWriter, r *http.Request, e *entity) {
	ctx, cancel := readContext(r)
	defer cancel()
	cursor := r.FormValue("cursor")
	pg, err := c.opts.Index.DeadLettered(ctx, &retryindex.PendingOptions{Limit: c.opts.PageSize, Cursor: cursor, Source: c.indexSource(e)})
	if err != nil {
		c.indexFailed(w, r, e, "listing the dead letters", err)
		return
	}
	rows, foreign := c.indexedRows(e, pg.Items)
	groups, grouped, err := c.indexGroups(ctx, e)
	if err != nil {
		c.indexFailed(w, r, e, "grouping the dead letters", err)
		return
	}
	base := "deadletters?e=" + url.QueryEscape(e.cfg.Path)
	data := map[string]any{
		"Entity": e.cfg.Path, "FromIndex": true, "Index": freshnessOf(pg.Freshness), "Total": pg.Total, "Rows": rows, "Foreign": foreign,
		"IndexGroups": groups, "Grouped": grouped, "First": cursor == "", "FirstHref": template.URL(base),
		"BrokerHref": template.URL(base + "&from=broker"), "Target": e.target,
		"Filter": filterForm{}, "Bodies": c.opts.FilterBodies, "Clear": template.URL(base), "Reasons": true,
	}
	if pg.Next != "" {
		data["NextHref"] = template.URL(base + "&cursor=" + url.QueryEscape(pg.Next))
	}
	c.render(w, r, http.StatusOK, "deadletters.html", "Dead letters of "+e.cfg.Path, data)
}

// indexGroupWindow bounds the events the dead-letter page groups (and MaxPeek bounds it): walking a
// listing costs about 25 µs an event in the embedded store, and a failure group's fingerprint about 50
// µs more (its regular expressions), so that 2,000 keep the page near a tenth of a second at any
// backlog (BenchmarkPagesFromIndex). The page says how many it grouped.
const indexGroupWindow = 2_000

// indexPageLimit is the page size the console reads the index with when it walks a listing (the
// groups): large enough that a walk is a few queries.
const indexPageLimit = 1000

// walkIndex reads the first max events of a listing of e's source (list is Index.Pending or
// Index.DeadLettered), in the listing's order, and returns them with the first page's total and
// freshness.
func (c *Console) walkIndex(ctx context.Context, e *entity, max int,
	list func(context.Context, *retryindex.PendingOptions) (*retryindex.PendingPage, error)) ([]retryindex.Event, *retryindex.PendingPage, error) {
	var out []retryindex.Event
	var first *retryindex.PendingPage
	cursor := ""
	for len(out) < max {
		pg, err := list(ctx, &retryindex.PendingOptions{Limit: min(indexPageLimit, max-len(out)), Cursor: cursor, Source: c.indexSource(e)})
		if err != nil {
			return nil, nil, err
		}
		if first == nil {
			first = pg
		}
		out = append(out, pg.Items...)
		if pg.Next == "" {
			break
		}
		cursor = pg.Next
	}
	return out, first, nil
}

// indexGroups groups the most recent indexGroupWindow (at most MaxPeek) dead letters of e the index
// lists by reason and fingerprint, the largest group first, and returns how many it grouped.
func (c *Console) indexGroups(ctx context.Context, e *entity) ([]*indexGroup, int, error) {
	evs, _, err := c.walkIndex(ctx, e, min(indexGroupWindow, c.opts.MaxPeek), c.opts.Index.DeadLettered)
	if err != nil {
		return nil, 0, err
	}
	if c.opts.IndexDedicated {
		evs = slices.DeleteFunc(evs, func(ev retryindex.Event) bool { return !strings.EqualFold(ev.Source, e.cfg.Path) })
	}
	byID := map[string]*indexGroup{}
	var out []*indexGroup
	for _, ev := range evs {
		text := redact.String(ev.LastError)
		id := Fingerprint(ev.Reason, text)
		g := byID[id]
		if g == nil {
			// Newest first: the first of a group is its most recent, its example.
			g = &indexGroup{ID: id, Reason: ev.Reason, Pattern: NormalizeError(text), FirstSeen: ev.Updated, LastSeen: ev.Updated, Example: ev.OriginalID}
			if ev.Entity != "" && ev.SequenceNumber > 0 {
				g.ExampleRef = inspect.Ref{Entity: ev.Entity, SequenceNumber: ev.SequenceNumber}.String()
			}
			byID[id] = g
			out = append(out, g)
		}
		g.Count++
		g.Items = append(g.Items, ev)
		if ev.Updated.Before(g.FirstSeen) {
			g.FirstSeen = ev.Updated
		}
	}
	slices.SortStableFunc(out, func(a, b *indexGroup) int { return b.Count - a.Count })
	return out, len(evs), nil
}

// groupFromIndex is a failure group's page from the index: the group among the most recent
// indexGroupWindow dead letters (the dead-letter page's groups), its dead letters newest first, a page
// at a time, each selectable for a redrive or purge checked against the broker.
func (c *Console) groupFromIndex(w http.ResponseWriter, r *http.Request, e *entity) {
	pageNo, err := intParam(r, "page", 0)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	ctx, cancel := readContext(r)
	defer cancel()
	groups, grouped, err := c.indexGroups(ctx, e)
	if err != nil {
		c.indexFailed(w, r, e, "grouping the dead letters", err)
		return
	}
	id := r.FormValue("g")
	i := slices.IndexFunc(groups, func(g *indexGroup) bool { return g.ID == id })
	if i < 0 {
		c.fail(w, r, http.StatusNotFound, "%s has no failure group %q among its %d most recent dead letters in the index: it may have been redriven or purged meanwhile (read the broker: add &from=broker)", e.cfg.Path, id, grouped)
		return
	}
	g := groups[i]
	fresh, err := c.opts.Index.DeadLettered(ctx, &retryindex.PendingOptions{Limit: 1, Source: c.indexSource(e)})
	if err != nil {
		c.indexFailed(w, r, e, "reading the freshness of the dead letters", err)
		return
	}
	start := min(pageNo*c.opts.PageSize, len(g.Items))
	end := min(start+c.opts.PageSize, len(g.Items))
	rows, _ := c.indexedRows(e, g.Items[start:end])
	base := "group?e=" + url.QueryEscape(e.cfg.Path) + "&g=" + url.QueryEscape(g.ID)
	data := map[string]any{
		"Entity": e.cfg.Path, "Group": g, "Rows": rows, "From": start + 1, "To": end, "Grouped": grouped, "Total": fresh.Total,
		"Index": freshnessOf(fresh.Freshness), "BrokerHref": template.URL(base + "&from=broker"), "Target": e.target,
	}
	if end < len(g.Items) {
		data["NextHref"] = template.URL(base + "&page=" + itoa(pageNo+1))
	}
	if pageNo > 0 {
		data["PrevHref"] = template.URL(base + "&page=" + itoa(pageNo-1))
	}
	c.render(w, r, http.StatusOK, "indexgroup.html", "Failure group "+g.ID, data)
}

// timelineFromIndex buckets e's pending retries by due time from the index's counts, over the whole
// backlog: the chart bucketDueTimes draws from every due time, exact, in two reads of the index (its
// bounds, then its buckets) whatever the backlog, where reading the due times themselves costs about
// 25 µs each.
func (c *Console) timelineFromIndex(ctx context.Context, e *entity) (*timeline, error) {
	now := c.now()
	horizon := now.Add(timelineHorizon)
	source := c.indexSource(e)
	// The earliest due time and the latest within the horizon: where the buckets start and end.
	bounds, err := c.opts.Index.PendingHistogram(ctx, &retryindex.HistogramOptions{Source: source, To: horizon})
	if err != nil {
		return nil, err
	}
	if bounds.Total == 0 {
		return &timeline{FromIndex: true, AsOf: bounds.AsOf.Unix()}, nil
	}
	from := now
	if !bounds.First.IsZero() && bounds.First.Before(from) {
		from = bounds.First
	}
	from = maxTime(from, now.Add(-timelineHorizon)).Truncate(time.Minute)
	end := maxTime(from, bounds.Last)
	step, n := timelineSteps(from, end)
	// The buckets end at the horizon, or before when the last one does: the retries due after it
	// count as Later, as bucketDueTimes counts them.
	to := from.Add(time.Duration(n)*step - time.Millisecond)
	if to.After(horizon) {
		to = horizon
	}
	h, err := c.opts.Index.PendingHistogram(ctx, &retryindex.HistogramOptions{Source: source, From: from, To: to, Width: step})
	if err != nil {
		return nil, err
	}
	t := &timeline{Total: int(h.Total), Later: int(h.After), Horizon: horizon.Unix(), FromIndex: true, AsOf: h.AsOf.Unix(),
		Starts: make([]int64, n), Counts: make([]int, n)}
	for i := range n {
		t.Starts[i] = from.Add(time.Duration(i) * step).Unix()
	}
	for i, k := range h.Counts {
		t.Counts[min(i, n-1)] += int(k)
	}
	t.Counts[0] += int(h.Before) // due before the horizon back: the first bucket, as bucketDueTimes does
	return t, nil
}

// indexCounts is one entity's exact counts from the index, for the overview.
type indexCounts struct {
	Pending, DeadLettered int64
	Err                   string
}

// overviewFromIndex counts each entity's pending retries and dead letters in the index, exactly.
func (c *Console) overviewFromIndex(ctx context.Context) ([]indexCounts, *indexFreshness) {
	out := make([]indexCounts, len(c.entities))
	var fresh *indexFreshness
	for i, e := range c.entities {
		p, err := c.opts.Index.Pending(ctx, &retryindex.PendingOptions{Limit: 1, Source: c.indexSource(e)})
		var d *retryindex.PendingPage
		if err == nil {
			d, err = c.opts.Index.DeadLettered(ctx, &retryindex.PendingOptions{Limit: 1, Source: c.indexSource(e)})
		}
		if err != nil {
			out[i].Err = redact.String(err.Error())
			continue
		}
		out[i].Pending, out[i].DeadLettered = p.Total, d.Total
		if fresh == nil {
			fresh = freshnessOf(d.Freshness)
		}
	}
	return out, fresh
}
