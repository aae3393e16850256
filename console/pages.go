package console

import (
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"time"
	"unicode/utf8"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/dlqaction"
)

// readTimeout bounds the Service Bus reads of one page, so that a broker that stops answering gives the
// operator an error page instead of a spinner that never ends.
const readTimeout = 30 * time.Second

// readContext bounds one page's reads; the request's own context also ends them when the browser
// goes away.
func readContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), readTimeout)
}

// latest returns the ring's samples, polling once first when it has none (no Run, or before its first
// poll), so the overview always shows current counts.
func (c *Console) latest(ctx context.Context) []sample {
	samples := c.ring.snapshot()
	if len(samples) == 0 {
		c.ring.add(c.poll(ctx))
		samples = c.ring.snapshot()
	}
	return samples
}

// overviewRow is one entity's line of the overview.
type overviewRow struct {
	Path       string
	RetryQueue string
	Counts     entityCounts
	// Index is the entity's exact counts from the index, when the console has one.
	Index *indexCounts
}

// overview shows every entity's latest counts and the alerts; the charts fetch their history from
// seriesJSON, so the page itself stays cheap however long the window is.
func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := readContext(r)
	defer cancel()
	samples := c.latest(ctx)
	last := samples[len(samples)-1]
	rows := make([]overviewRow, len(c.entities))
	var indexed []indexCounts
	var fresh *indexFreshness
	if c.opts.Index != nil && r.FormValue("from") != "broker" {
		indexed, fresh = c.overviewFromIndex(ctx)
	}
	for i, e := range c.entities {
		rows[i] = overviewRow{Path: e.cfg.Path, RetryQueue: e.cfg.RetryQueue, Counts: last.Counts[i]}
		if indexed != nil {
			rows[i].Index = &indexed[i]
		}
	}
	c.render(w, r, http.StatusOK, "overview.html", "Overview", map[string]any{
		"Rows": rows, "Alerts": c.alerts(samples), "At": last.At, "Samples": len(samples),
		"Window": c.opts.Window, "Interval": c.opts.PollInterval, "FromIndex": indexed != nil, "Index": fresh,
		"MaxPeek": c.opts.MaxPeek,
	})
}

// seriesJSON is the overview's history for the charts: times in Unix seconds and, per entity, the
// three series, aligned as uPlot takes them.
func (c *Console) seriesJSON(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := readContext(r)
	defer cancel()
	samples := c.latest(ctx)
	type series struct {
		Entity      string `json:"entity"`
		Active      []int  `json:"active"`
		Pending     []int  `json:"pending"`
		DeadLetters []int  `json:"deadLetters"`
	}
	out := struct {
		Times    []float64 `json:"times"`
		Entities []series  `json:"entities"`
	}{Times: make([]float64, len(samples))}
	for i, s := range samples {
		// Seconds with milliseconds: uPlot needs strictly increasing x values, and polls may come
		// more often than once a second.
		out.Times[i] = float64(s.At.UnixMilli()) / 1000
	}
	for i, e := range c.entities {
		s := series{Entity: e.cfg.Path, Active: make([]int, len(samples)), Pending: make([]int, len(samples)), DeadLetters: make([]int, len(samples))}
		for j, sm := range samples {
			s.Active[j], s.Pending[j], s.DeadLetters[j] = sm.Counts[i].Active, sm.Counts[i].Pending, sm.Counts[i].DeadLetters
		}
		out.Entities = append(out.Entities, s)
	}
	writeJSON(w, out)
}

// writeJSON writes v as the response; an encoding error can only be a broken connection by then.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// pendingPage lists one page of the entity's pending retries by due time, those a filter matches
// when the query carries one. The cursor is the inspector's: it names the last item shown, so pages
// stay consistent while retries activate.
func (c *Console) pendingPage(w http.ResponseWriter, r *http.Request) {
	e, ok := c.entityOf(w, r)
	if !ok {
		return
	}
	f, err := readFilter(r, c.opts.FilterBodies)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	if f.Reason != "" {
		c.fail(w, r, http.StatusBadRequest, "a pending retry has no dead-letter reason: filter it by error, property, due time or body")
		return
	}
	if !f.active() && c.fromIndex(r, e) {
		// The index has no filters: a filtered page reads the broker, and says so.
		c.pendingFromIndex(w, r, e)
		return
	}
	pf, _ := f.pending() // checked by readFilter
	ctx, cancel := readContext(r)
	defer cancel()
	pg, err := e.inspector().ListPending(ctx, inspect.PageOptions{Limit: c.opts.PageSize, Cursor: r.FormValue("cursor"), Filter: pf})
	if err != nil && c.recognise(ctx, e, err) {
		// A session consumer holds its retries in the sessions: the page says so and links to them.
		c.render(w, r, http.StatusOK, "pending.html", "Pending retries of "+e.cfg.Path, map[string]any{"Entity": e.cfg.Path, "Sessions": true})
		return
	}
	if err != nil {
		status := http.StatusBadGateway
		if isBadInput(err) {
			status = http.StatusBadRequest
		}
		c.fail(w, r, status, "listing the pending retries of %s: %v", e.cfg.Path, err)
		return
	}
	base := "pending?e=" + url.QueryEscape(e.cfg.Path) + c.brokerParam(r)
	data := map[string]any{
		"Entity": e.cfg.Path, "Items": pg.Items, "Next": pg.Next, "Truncated": pg.Truncated(), "First": r.FormValue("cursor") == "",
		"HasIndex": c.opts.Index != nil, "Scans": pg.Scans, "IndexHref": template.URL("pending?e=" + url.QueryEscape(e.cfg.Path)),
		"Filter": f, "Filtered": f.active(), "FilterFields": f.hiddenFields(), "Bodies": c.opts.FilterBodies,
		"FirstHref": template.URL(base + f.query()), "Clear": template.URL(base),
	}
	if pg.Next != "" {
		data["NextHref"] = template.URL(base + "&cursor=" + url.QueryEscape(pg.Next) + f.query())
	}
	c.render(w, r, http.StatusOK, "pending.html", "Pending retries of "+e.cfg.Path, data)
}

// deadLettersPage shows the entity's failure groups, largest first, with the scans that say how much
// of each dead-letter queue was read. With a filter in the query it groups only the dead letters the
// filter matches, lists them a page at a time, and offers the actions on all of them.
func (c *Console) deadLettersPage(w http.ResponseWriter, r *http.Request) {
	e, ok := c.entityOf(w, r)
	if !ok {
		return
	}
	f, err := readFilter(r, c.opts.FilterBodies)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	pageNo, err := intParam(r, "page", 0)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	if !f.active() && c.fromIndex(r, e) {
		// The index has no filters: a filtered page reads the broker, and says so.
		c.deadLettersFromIndex(w, r, e)
		return
	}
	ctx, cancel := readContext(r)
	defer cancel()
	df, _ := f.deadLetters() // checked by readFilter
	sel, err := dlqaction.Select(ctx, e.inspector(), df)
	if err != nil {
		c.fail(w, r, http.StatusBadGateway, "reading the dead letters of %s: %v", e.cfg.Path, err)
		return
	}
	base := "deadletters?e=" + url.QueryEscape(e.cfg.Path) + c.brokerParam(r)
	data := map[string]any{
		"HasIndex": c.opts.Index != nil, "IndexHref": template.URL("deadletters?e=" + url.QueryEscape(e.cfg.Path)),
		"Entity": e.cfg.Path, "Groups": groupDeadLetters(sel.Items), "Total": len(sel.Items), "Truncated": inspect.Truncated(sel.Scans), "Scans": sel.Scans,
		"Filter": f, "Filtered": f.active(), "FilterFields": f.hiddenFields(), "Bodies": c.opts.FilterBodies, "Clear": template.URL(base), "Target": e.target,
		"Reasons": true,
	}
	if f.active() {
		start := min(pageNo*c.opts.PageSize, len(sel.Items))
		end := min(start+c.opts.PageSize, len(sel.Items))
		data["Matching"], data["From"], data["To"] = sel.Items[start:end], start+1, end
		if end < len(sel.Items) {
			data["NextHref"] = template.URL(base + "&page=" + itoa(pageNo+1) + f.query())
		}
		if pageNo > 0 {
			data["PrevHref"] = template.URL(base + "&page=" + itoa(pageNo-1) + f.query())
		}
	}
	c.render(w, r, http.StatusOK, "deadletters.html", "Dead letters of "+e.cfg.Path, data)
}

// groupPage shows one failure group and one page of its dead letters. The group is found again on
// every visit (groups are not stored: a console may be one of several replicas); one that is gone gets
// a 404 that says it may have been redriven or purged.
func (c *Console) groupPage(w http.ResponseWriter, r *http.Request) {
	e, ok := c.entityOf(w, r)
	if !ok {
		return
	}
	if c.fromIndex(r, e) {
		c.groupFromIndex(w, r, e)
		return
	}
	pageNo, err := intParam(r, "page", 0)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	ctx, cancel := readContext(r)
	defer cancel()
	groups, sel, err := e.groups(ctx)
	if err != nil {
		c.fail(w, r, http.StatusBadGateway, "reading the dead letters of %s: %v", e.cfg.Path, err)
		return
	}
	id := r.FormValue("g")
	i := slices.IndexFunc(groups, func(g *failureGroup) bool { return g.ID == id })
	if i < 0 {
		c.fail(w, r, http.StatusNotFound, "%s has no failure group %q among the dead letters read: it may have been redriven or purged meanwhile", e.cfg.Path, id)
		return
	}
	g := groups[i]
	// Only one page of rows is rendered: a group of 10,000 is a 20 kB page, not a 2 MB one.
	start := min(pageNo*c.opts.PageSize, len(g.Items))
	end := min(start+c.opts.PageSize, len(g.Items))
	next := -1
	if end < len(g.Items) {
		next = pageNo + 1
	}
	c.render(w, r, http.StatusOK, "group.html", "Failure group "+g.ID, map[string]any{
		"Entity": e.cfg.Path, "Group": g, "Items": g.Items[start:end], "From": start + 1, "To": end,
		"Page": pageNo, "Next": next, "Prev": pageNo - 1, "Truncated": inspect.Truncated(sel.Scans), "Target": e.target,
	})
}

// property is one application property as the message page shows it.
type property struct{ Name, Value string }

// messagePage shows one dead letter, named by an entity-qualified ref. Every text the message or the
// broker wrote is redacted before it is shown; the body only with Options.ShowBodies, and binary bodies
// only as their size.
func (c *Console) messagePage(w http.ResponseWriter, r *http.Request) {
	e, ok := c.entityOf(w, r)
	if !ok {
		return
	}
	ref, err := parseQualifiedRef(r.FormValue("ref"))
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	ctx, cancel := readContext(r)
	defer cancel()
	d, err := e.inspector().DeadLetter(ctx, ref)
	if err != nil {
		c.fail(w, r, statusOf(err), "%s: %v", ref, err)
		return
	}
	m := d.Message
	props := make([]property, 0, len(m.ApplicationProperties))
	for k, v := range m.ApplicationProperties {
		props = append(props, property{Name: k, Value: propertyValue(v)})
	}
	sort.Slice(props, func(i, j int) bool { return props[i].Name < props[j].Name })
	data := map[string]any{
		"Entity": e.cfg.Path, "D": d, "Props": props, "ShowBodies": c.opts.ShowBodies, "BodySize": len(m.Body),
		"Group": Fingerprint(d.Reason, errorText(*d)), "Target": e.target,
	}
	if c.opts.ShowBodies {
		if utf8.Valid(m.Body) {
			data["Body"] = shownBlock(string(m.Body))
		} else {
			data["Body"] = fmt.Sprintf("(%d bytes of binary data)", len(m.Body))
		}
	}
	c.render(w, r, http.StatusOK, "message.html", "Dead letter "+ref.String(), data)
}
