package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/dlqaction"
	"github.com/sbretry/retry/internal/redact"
)

// The actions a form may ask for.
const (
	actionRedrive = "redrive"
	actionPurge   = "purge"
	actionCancel  = "cancel"
	actionRelease = "release"
)

// confirmWord is one of the two answers a purge accepts; the other is the number of dead letters the
// preview listed.
const confirmWord = "yes"

// parseQualifiedRef parses ENTITY:SEQ and refuses a bare number: a page always knows the entity.
func parseQualifiedRef(s string) (inspect.Ref, error) {
	r, err := inspect.ParseRef(s)
	if err != nil {
		return r, fmt.Errorf("malformed reference %q: want ENTITY:SEQ, as the listings link it", s)
	}
	if r.Entity == "" {
		return r, fmt.Errorf("reference %q has no entity: want ENTITY:SEQ (sequence numbers are counted per entity)", s)
	}
	return r, nil
}

// isBadInput reports errors caused by what the request named, not by Service Bus.
func isBadInput(err error) bool {
	for _, target := range []error{inspect.ErrInvalidRef, inspect.ErrAmbiguousRef, inspect.ErrUnknownEntity, inspect.ErrInvalidCursor, inspect.ErrNotPending} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// statusOf maps an inspector error to a status: 404 not found, 400 bad input, else 502 (Service Bus).
func statusOf(err error) int {
	switch {
	case errors.Is(err, inspect.ErrNotFound):
		return http.StatusNotFound
	case isBadInput(err):
		return http.StatusBadRequest
	}
	return http.StatusBadGateway
}

// request is an action form, as preview and run read it. Both steps post the same fields, plus the
// digest and the confirmation on the run, so that the run re-plans from what the preview was given and
// never from anything the browser could have changed in between.
type request struct {
	// action is redrive, purge or cancel; e is the entity the form names.
	action  string
	e       *entity
	group   string        // a whole group (redrive, purge); empty for a selection
	refs    []inspect.Ref // a selection
	session string        // the session a release releases
	// filter selects every message it matches (an action on all matching); nil for a group or refs.
	filter *filterForm
	// matched describes the filter a selection came from: the filter's Describe at the preview, the
	// preview form's "matched" field at the run (which acts on the preview's refs). It is covered by
	// the digest, so the audit record of a run says truly what the preview matched.
	matched string
	// expect is, for refs selected on an index-backed page, the MessageID the index named at each:
	// both steps check the broker against it before anything is done.
	expect expectations
}

// maxRefs bounds the references one action form may carry: no more than the messages a read peeks
// from the two entities an action may read (a subscription's dead-letter queue and its retry queue's),
// which is all a selection, or everything a filter matched, can have been made from.
func (c *Console) maxRefs() int { return 2 * c.opts.MaxPeek }

// maxFormBytes bounds an action form: maxRefs references of up to a few hundred bytes each (an
// entity path is at most 260 characters, escaped in the form), and the rest.
func (c *Console) maxFormBytes() int64 { return int64(c.maxRefs())*320 + 1<<20 }

// readRequest checks the request's CSRF protection and role and parses the form; a refusal is
// written (and audited) through a.
func (c *Console) readRequest(w http.ResponseWriter, r *http.Request, a *attempt) (*request, bool) {
	r.Body = http.MaxBytesReader(w, r.Body, c.maxFormBytes())
	if err := r.ParseForm(); err != nil {
		a.refuse(w, r, http.StatusBadRequest, "unreadable form: %v", err)
		return nil, false
	}
	a.fillFromForm(r, c.maxRefs())
	if why := c.checkCSRF(r); why != "" {
		a.refuse(w, r, http.StatusForbidden, "refused: %s; nothing was done", why)
		return nil, false
	}
	// The role is checked on the server, whatever the page showed: a reader's browser has no action
	// buttons, and a form forged or kept from an operator's page is refused here all the same.
	if p := principalOf(r); !p.canAct() {
		a.refuse(w, r, http.StatusForbidden, "refused: the token %s may only read (role %s); nothing was done", p.who(), p.Role)
		return nil, false
	}
	name := r.FormValue("e")
	e := c.byPath[strings.ToLower(strings.TrimSuffix(name, "/"))]
	if e == nil {
		a.refuse(w, r, http.StatusNotFound, "unknown entity %q: this console shows %s", name, c.entityList())
		return nil, false
	}
	req := &request{action: r.PostFormValue("action"), e: e, group: r.PostFormValue("g"), session: r.PostFormValue("session")}
	switch req.action {
	case actionRedrive, actionPurge, actionCancel:
		if req.session != "" {
			a.refuse(w, r, http.StatusBadRequest, "%s takes messages, not a session", req.action)
			return nil, false
		}
	case actionRelease:
		// A release names one session of a queue, and nothing else.
		switch {
		case req.session == "":
			a.refuse(w, r, http.StatusBadRequest, "release needs the session to release")
			return nil, false
		case req.group != "" || len(r.PostForm["ref"]) > 0:
			a.refuse(w, r, http.StatusBadRequest, "release takes a session, not messages")
			return nil, false
		case e.parsed.IsSubscription() && e.cfg.WakeTo == "":
			a.refuse(w, r, http.StatusBadRequest, "%s is a subscription: a release sends a wake-up into the session, and a send to its topic would reach every subscription whose rules accept it; configure Entity.WakeTo where the topic's rules route a wake-up to this subscription alone", e.cfg.Path)
			return nil, false
		}
		return req, true
	default:
		a.refuse(w, r, http.StatusBadRequest, "unknown action %q: want redrive, purge, cancel or release", req.action)
		return nil, false
	}
	if a.rec.Step == stepRun {
		// The run of an action on all matching carries its preview's description of the filter,
		// covered by the digest; a preview takes it from the filter itself, never from the form.
		req.matched = r.PostFormValue("matched")
	}
	if len(req.matched) > maxMatched {
		a.refuse(w, r, http.StatusBadRequest, "the description of the filter is %d bytes long; at most %d", len(req.matched), maxMatched)
		return nil, false
	}
	if r.PostFormValue("match") != "" {
		// Act on all matching: the filter selects; refs or a group besides it would be a guess.
		f, err := readFilter(r, c.opts.FilterBodies)
		switch {
		case err != nil:
			a.refuse(w, r, http.StatusBadRequest, "%v", err)
			return nil, false
		case !f.active():
			a.refuse(w, r, http.StatusBadRequest, "an action on all matching needs a filter: give a reason, an error text, a property, a time or a body text")
			return nil, false
		case req.group != "" || len(r.PostForm["ref"]) > 0:
			a.refuse(w, r, http.StatusBadRequest, "give a filter, a failure group or selected references, not more than one")
			return nil, false
		case f.Reason != "" && req.action == actionCancel:
			a.refuse(w, r, http.StatusBadRequest, "a pending retry has no dead-letter reason: filter it by error, property, due time or body")
			return nil, false
		}
		req.filter, req.matched = &f, f.Describe()
		a.rec.Filter = req.matched
		return req, true
	}
	a.rec.Filter = clipAuditField(req.matched)
	if req.action == actionCancel && req.group != "" {
		a.refuse(w, r, http.StatusBadRequest, "cancel takes pending retries, not a failure group")
		return nil, false
	}
	if n := len(r.PostForm["ref"]); n > c.maxRefs() {
		a.refuse(w, r, http.StatusRequestEntityTooLarge, "%d references selected; at most %d (the messages one read peeks) can be", n, c.maxRefs())
		return nil, false
	}
	seen := make(map[inspect.Ref]bool, len(r.PostForm["ref"]))
	for _, s := range r.PostForm["ref"] {
		ref, err := parseQualifiedRef(s)
		if err != nil {
			a.refuse(w, r, http.StatusBadRequest, "%v", err)
			return nil, false
		}
		if !seen[ref] {
			seen[ref] = true
			req.refs = append(req.refs, ref)
		}
	}
	// A form names either a group or refs: with both, which one the operator meant is a guess, and a
	// destructive action does not guess.
	if req.group != "" && len(req.refs) > 0 {
		a.refuse(w, r, http.StatusBadRequest, "give a failure group or selected references, not both")
		return nil, false
	}
	if req.group == "" && len(req.refs) == 0 {
		a.refuse(w, r, http.StatusBadRequest, "nothing selected: tick at least one message, or act on the whole group")
		return nil, false
	}
	x, err := readExpectations(r.PostForm["expect"], c.maxRefs())
	switch {
	case err != nil:
		a.refuse(w, r, http.StatusBadRequest, "%v", err)
		return nil, false
	case x != nil && !x.covers(req.refs):
		// A page from the index expects every message it offers: a form that expects some of its
		// refs and not others was not made by one.
		a.refuse(w, r, http.StatusBadRequest, "the form expects the index's messages for some selected references and not others")
		return nil, false
	}
	req.expect = x
	return req, true
}

// planned is what an action will act on, read fresh from Service Bus.
type planned struct {
	plan    *dlqaction.Plan         // redrive, purge
	pending []inspect.Pending       // cancel
	release *inspect.SessionRelease // release
	digest  string
	// more says a filter matched more pending retries than one action takes (maxRefs): the plan has
	// the earliest due.
	more bool
}

// maxMatched bounds the filter's description a form carries (its fields are bounded by
// maxFilterField each).
const maxMatched = 8 * maxFilterField

// matchingPending lists the pending retries req's filter matches, earliest due first, at most maxRefs
// of them, and says whether more match.
func (c *Console) matchingPending(ctx context.Context, req *request) ([]inspect.Pending, bool, error) {
	pf, err := req.filter.pending()
	if err != nil {
		return nil, false, fmt.Errorf("%w: %v", inspect.ErrInvalidRef, err)
	}
	page, err := req.e.inspector().ListPending(ctx, inspect.PageOptions{Limit: c.maxRefs(), Filter: pf})
	if err != nil {
		return nil, false, err
	}
	return page.Items, page.Next != "", nil
}

// plan reads the request's messages and builds the plan and its digest: the keyed hash of the action,
// the entity, the group, and every ref with its MessageID. The preview puts the digest in its form; the
// run recomputes it from a fresh read and acts only if both are equal, so it acts on exactly what the
// preview showed. A selected ref that is gone makes a conflict error.
func (c *Console) plan(ctx context.Context, req *request) (*planned, error) {
	out := &planned{}
	var lines []string
	switch req.action {
	case actionRelease:
		return c.planRelease(ctx, req, "")
	case actionCancel:
		var items []inspect.Pending
		var err error
		if req.filter != nil {
			items, out.more, err = c.matchingPending(ctx, req)
		} else {
			items, err = dlqaction.PreviewCancel(ctx, req.e.inspector(), req.refs)
			if err == nil {
				err = req.expect.checkPending(items)
			} else if req.expect != nil && errors.Is(err, inspect.ErrNotFound) {
				err = fmt.Errorf("%w: %w", errStaleIndex, err)
			}
		}
		if err != nil {
			return nil, err
		}
		out.pending = items
		for _, p := range items {
			lines = append(lines, p.Ref().String()+"="+p.MessageID)
		}
	default:
		var sel *dlqaction.Selection
		if req.filter != nil {
			// Everything the filter matches now; the preview's form then carries exactly these refs.
			df, err := req.filter.deadLetters()
			if err != nil {
				return nil, fmt.Errorf("%w: %v", inspect.ErrInvalidRef, err)
			}
			if sel, err = dlqaction.Select(ctx, req.e.inspector(), df); err != nil {
				return nil, err
			}
		} else if req.group != "" {
			// A whole group: read the dead letters again and take the group as it is now. The digest
			// then tells the run whether it is still the group the preview showed.
			groups, s, err := req.e.groups(ctx)
			if err != nil {
				return nil, err
			}
			i := slices.IndexFunc(groups, func(g *failureGroup) bool { return g.ID == req.group })
			if i < 0 {
				return nil, fmt.Errorf("%w: %s has no failure group %s any more (redriven or purged meanwhile?)", errConflict, req.e.cfg.Path, req.group)
			}
			sel = &dlqaction.Selection{Items: groups[i].Items, Scans: s.Scans}
		} else if req.expect != nil {
			// Selected on an index-backed page: each is peeked where the index said it is, and must be
			// the message the index named there.
			s, err := c.selectExpected(ctx, req.e, req.refs, req.expect)
			if err != nil {
				return nil, err
			}
			sel = s
		} else {
			// Selected refs: the inspector resolves each against the entity's dead-letter queues (a ref
			// naming another entity is a 400), and any that is gone makes the whole action a conflict,
			// so a preview or run never silently acts on fewer messages than the operator ticked.
			s, err := dlqaction.Select(ctx, req.e.inspector(), inspect.DeadLetterFilter{Refs: req.refs})
			if err != nil {
				return nil, err
			}
			if len(s.Missing) > 0 {
				return nil, fmt.Errorf("%w: %s no longer in their dead-letter queue (redriven or purged meanwhile?): %s",
					errConflict, plural(len(s.Missing), "selected message is"), dlqaction.JoinRefs(s.Missing))
			}
			sel = s
		}
		// The redrive's target is fixed by the console's configuration, never by the form: a form that
		// named a queue could send customer messages anywhere the client may send.
		if req.action == actionRedrive && req.e.target == "" {
			return nil, fmt.Errorf("%w: %s has no redrive target: no queue is known to reach its session consumer only (set Entity.RedriveTo)", inspect.ErrUnknownEntity, req.e.cfg.Path)
		}
		if req.action == actionRedrive {
			out.plan = dlqaction.NewRedrivePlan(sel, req.e.target, 0)
		} else {
			out.plan = dlqaction.NewPurgePlan(sel)
		}
		for _, it := range out.plan.Items {
			lines = append(lines, it.Ref().String()+"="+it.DeadLetter.MessageID)
		}
	}
	// Keyed with the process's secret, so a form cannot be given a digest for a selection it made up;
	// a restarted console refuses old previews, which is safe.
	out.digest = c.mac(append([]string{"action", req.action, req.e.cfg.Path, req.group, req.matched}, lines...)...)
	return out, nil
}

// errConflict marks an action refused because what it would act on changed since the preview.
var errConflict = errors.New("changed since the preview")

// count is the number of messages the plan acts on.
func (p *planned) count() int {
	switch {
	case p.plan != nil:
		return len(p.plan.Items)
	case p.release != nil:
		return 1
	}
	return len(p.pending)
}

// refs are the refs the plan acts on, for the preview's form.
func (p *planned) refs() []string {
	var out []string
	if p.plan != nil {
		for _, r := range p.plan.Refs() {
			out = append(out, r.String())
		}
	}
	for _, q := range p.pending {
		out = append(out, q.Ref().String())
	}
	return out
}

// actionContext bounds one action request by Options.ActionTimeout. An action cut short reports how
// far it got, and running it again finishes it (see internal/dlqaction).
func (c *Console) actionContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), c.opts.ActionTimeout)
}

// preview shows exactly what an action will do; it changes nothing.
func (c *Console) preview(w http.ResponseWriter, r *http.Request) {
	req, ok := c.readRequest(w, r, c.newAttempt(r, stepPreview))
	if !ok {
		return
	}
	ctx, cancel := c.actionContext(r)
	defer cancel()
	p, err := c.plan(ctx, req)
	if err != nil {
		c.planFailed(w, r, req, err)
		return
	}
	if p.count() == 0 {
		c.fail(w, r, http.StatusBadRequest, "nothing to %s", req.action)
		return
	}
	if p.release != nil {
		c.render(w, r, http.StatusOK, "release.html", "Preview: release", map[string]any{
			"Entity": req.e.cfg.Path, "Session": req.session, "Release": p.release, "PropWakeTo": inspect.PropWakeTo, "Digest": p.digest,
			"At": strconv.FormatInt(p.release.PlannedAt.UnixMilli(), 10), "Preview": true,
		})
		return
	}
	c.render(w, r, http.StatusOK, "preview.html", "Preview: "+req.action, map[string]any{
		"Action": req.action, "Entity": req.e.cfg.Path, "Group": req.group, "Plan": p.plan, "Pending": p.pending,
		"Refs": p.refs(), "Expect": req.expect.fields(p.refs()), "Digest": p.digest, "Count": p.count(), "Target": req.e.target, "Confirm": confirmWord,
		"Truncated": p.plan != nil && inspect.Truncated(p.plan.Scans), "Matched": req.matched, "More": p.more,
		"Batches": (p.count() + c.opts.BatchSize - 1) / c.opts.BatchSize, "BatchSize": c.opts.BatchSize,
	})
}

// planFailed shows why an action could not be planned: 409 when its messages changed since the
// preview, 404 or 400 for what the request named, 502 for Service Bus.
func (c *Console) planFailed(w http.ResponseWriter, r *http.Request, req *request, err error) {
	status := statusOf(err)
	switch {
	case errors.Is(err, errConflict), errors.Is(err, errStaleIndex):
		status = http.StatusConflict
	case req.action == actionRelease:
		status = releaseStatus(err)
	}
	c.fail(w, r, status, "%s; nothing was done", describeReadError(err))
}

// runAction carries out a previewed action, refusing it whole when its messages changed since. Every
// run is audited: refused, or started (before anything is done: a run whose record cannot be written
// is not carried out) and then done, partial or failed, with each message's outcome.
func (c *Console) runAction(w http.ResponseWriter, r *http.Request) {
	a := c.newAttempt(r, stepRun)
	req, ok := c.readRequest(w, r, a)
	if !ok {
		return
	}
	ctx, cancel := c.actionContext(r)
	defer cancel()
	// Plan again from Service Bus, then compare with the preview's digest: the run acts on exactly
	// the refs and MessageIDs the operator saw, or on nothing.
	var p *planned
	var err error
	if req.action == actionRelease {
		p, err = c.planRelease(ctx, req, r.PostFormValue("at"))
	} else {
		p, err = c.plan(ctx, req)
	}
	if err != nil {
		status := statusOf(err)
		switch {
		case errors.Is(err, errConflict), errors.Is(err, errStaleIndex):
			status = http.StatusConflict
		case req.action == actionRelease:
			status = releaseStatus(err)
		}
		a.refuse(w, r, status, "%s; nothing was done", describeReadError(err))
		return
	}
	if !hmacEqual(p.digest, r.PostFormValue("digest")) {
		if req.action == actionRelease {
			a.refuse(w, r, http.StatusConflict, "session %q changed since the preview: nothing was done; preview its release again", req.session)
			return
		}
		what := "the selection"
		if req.group != "" {
			what = "the failure group"
		}
		a.refuse(w, r, http.StatusConflict, "%s changed since the preview (it now holds %s): nothing was done; preview it again", what, plural(p.count(), "message"))
		return
	}
	// A purge cannot be undone: the operator types the word or the count, as the CLI asks for the
	// word. The count proves they read how many; "y" or "YES" prove nothing.
	if req.action == actionPurge {
		answer := strings.TrimSpace(r.PostFormValue("confirm"))
		if answer != confirmWord && answer != strconv.Itoa(p.count()) {
			a.refuse(w, r, http.StatusBadRequest, "purge not confirmed: type %q or the number of dead letters (%d); nothing was done", confirmWord, p.count())
			return
		}
	}
	if !a.start(r, p.auditItems(0)) {
		c.fail(w, r, http.StatusServiceUnavailable, "the audit record of this %s could not be written, so it was not carried out: nothing was done", req.action)
		return
	}
	if p.release == nil && p.count() > c.opts.BatchSize {
		c.runInBatches(w, r, req, p, a)
		return
	}
	var done int
	var warnings []string
	if p.release != nil {
		rel, rerr := req.e.sessionIn.Release(ctx, p.release)
		if rel != nil {
			p.release = rel
		}
		if rerr == nil {
			done = 1
		}
		if !a.finish(r, done, rerr, p.auditItems(done)) {
			warnings = append(warnings, "the audit record of this result could not be written: the server's log has the error")
		}
		c.renderReleased(w, r, req, p, rerr, warnings)
		return
	}
	if p.plan != nil {
		done, err = dlqaction.Execute(ctx, c.client, req.e.inspector(), p.plan, &dlqaction.Options{
			Wait: c.opts.ReceiveWait, Warn: func(m string) { warnings = append(warnings, m) },
		})
	} else {
		// Cancel re-checks each pending retry before cancelling it: one that activated or changed
		// since the preview stops the action there.
		done, err = dlqaction.Cancel(ctx, req.e.inspector(), p.pending)
	}
	if !a.finish(r, done, err, p.auditItems(done)) {
		warnings = append(warnings, "the audit record of this result could not be written: the server's log has the error")
	}
	c.renderResult(w, r, req, p, done, err, warnings)
}

// auditItems are the planned messages for the audit record; for a cancel, the first done were
// cancelled (it goes in order and stops at the first failure).
func (p *planned) auditItems(done int) []AuditItem {
	var out []AuditItem
	if rel := p.release; rel != nil {
		it := AuditItem{Ref: "session " + rel.SessionID, Done: done == 1}
		if h := rel.Plan.Before.Hold; h != nil {
			it.Ref = inspect.Ref{Entity: rel.Entity, SequenceNumber: h.SequenceNumber}.String()
			it.MessageID = redact.String(h.MessageID)
		}
		it.ResubmittedAs = rel.Plan.WakeID
		return []AuditItem{it}
	}
	if p.plan != nil {
		for _, it := range p.plan.Items {
			out = append(out, AuditItem{Ref: it.Ref().String(), MessageID: redact.String(it.DeadLetter.MessageID), ResubmittedAs: it.ResubmitID, Done: it.Done})
		}
		return out
	}
	for i, q := range p.pending {
		out = append(out, AuditItem{Ref: q.Ref().String(), MessageID: redact.String(q.MessageID), Done: i < done})
	}
	return out
}

// renderReleased shows what a release did: the wake-up sent and the state written, or how far it got
// and why it stopped.
func (c *Console) renderReleased(w http.ResponseWriter, r *http.Request, req *request, p *planned, err error, warnings []string) {
	status, msg := http.StatusOK, ""
	if err != nil {
		status = releaseStatus(err)
		if status == http.StatusBadGateway || status == http.StatusNotFound {
			status = http.StatusBadGateway
		}
		msg = redact.String(err.Error())
	}
	c.render(w, r, status, "release.html", "Result: release", map[string]any{
		"Entity": req.e.cfg.Path, "Session": req.session, "Release": p.release, "PropWakeTo": inspect.PropWakeTo, "Error": msg, "Warnings": warnings,
	})
}

// renderResult shows what an action did, item by item, and when it stopped part way, why and how to
// finish it. A refused dead letter (changed since its preview) is a 409, a Service Bus error a 502.
func (c *Console) renderResult(w http.ResponseWriter, r *http.Request, req *request, p *planned, done int, err error, warnings []string) {
	status, msg := http.StatusOK, ""
	if err != nil {
		status = http.StatusBadGateway
		if errors.Is(err, dlqaction.ErrChanged) {
			status = http.StatusConflict
		}
		msg = fmt.Sprintf("%s stopped after %d of %d: %s; the rest was not touched, and running the same action again finishes it", req.action, done, p.count(), redact.String(err.Error()))
	}
	c.render(w, r, status, "result.html", "Result: "+req.action, resultData(req, p, done, msg, warnings))
}

// resultData is what the result of a run shows.
func resultData(req *request, p *planned, done int, msg string, warnings []string) map[string]any {
	cancelled := make([]bool, len(p.pending))
	for i := range min(done, len(p.pending)) {
		cancelled[i] = true
	}
	return map[string]any{
		"Action": req.action, "Entity": req.e.cfg.Path, "Plan": p.plan, "Pending": p.pending, "Cancelled": cancelled,
		"Done": done, "Count": p.count(), "Error": msg, "Warnings": warnings, "Target": req.e.target,
	}
}

// hmacEqual compares two digests without leaking, through timing, how much of a guess was right.
func hmacEqual(a, b string) bool {
	return len(a) == len(b) && subtleEqual(a, b)
}
