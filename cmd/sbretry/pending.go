package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/dlqaction"
	"github.com/sbretry/retry/internal/redact"
)

// pendingFilterFlags are the filters of pending, inspect.PendingFilter's fields: the last error, an
// application property, the due time, and the body (customer data, read only when asked for).
type pendingFilterFlags struct {
	contains, property, dueAfter, dueBefore, body string
}

func (f *pendingFilterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.contains, "contains", "", "")
	fs.StringVar(&f.property, "property", "", "")
	fs.StringVar(&f.dueAfter, "due-after", "", "")
	fs.StringVar(&f.dueBefore, "due-before", "", "")
	fs.StringVar(&f.body, "body-contains", "", "")
}

// set reports whether any filter was given.
func (f *pendingFilterFlags) set() bool {
	return f.contains != "" || f.property != "" || f.dueAfter != "" || f.dueBefore != "" || f.body != ""
}

// filter builds the inspect filter: --due-after T keeps retries due at or after T, --due-before T those
// due before T, each an RFC 3339 time or a duration ahead of now ("2h": due within the next two hours).
func (f *pendingFilterFlags) filter(now time.Time) (inspect.PendingFilter, error) {
	out := inspect.PendingFilter{Contains: f.contains, Body: f.body}
	var err error
	if f.property != "" {
		if out.Property, err = inspect.ParsePropertyFilter(f.property); err != nil {
			return out, usagef("--property %s is not NAME=VALUE", printable(f.property))
		}
	}
	if out.Since, err = parseDue(f.dueAfter, now); err != nil {
		return out, usagef("--due-after: %v", err)
	}
	if out.Until, err = parseDue(f.dueBefore, now); err != nil {
		return out, usagef("--due-before: %v", err)
	}
	if !out.Since.IsZero() && !out.Until.IsZero() && !out.Since.Before(out.Until) {
		return out, usagef("--due-after %s is not before --due-before %s: no retry is due in between", formatTime(out.Since), formatTime(out.Until))
	}
	return out, nil
}

// args are the flags that give the filter again, for the command that continues the listing.
func (f *pendingFilterFlags) args() string {
	var b strings.Builder
	for _, fl := range []struct{ name, v string }{
		{"--contains", f.contains}, {"--property", f.property}, {"--due-after", f.dueAfter}, {"--due-before", f.dueBefore}, {"--body-contains", f.body},
	} {
		if fl.v != "" {
			b.WriteString(" " + fl.name + " " + shellQuote(fl.v))
		}
	}
	return b.String()
}

// shellQuote is s as one shell word: as it is when it is plain, else in single quotes, and quoted
// with Go escapes when it holds what a terminal would act on (the operator then retypes it).
func shellQuote(s string) string {
	if q := printable(s); q != s {
		return q
	}
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.,:/=+@%", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// parseDue parses an RFC 3339 time or a duration ahead of now ("2h"); empty is the zero time.
func parseDue(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%s is neither an RFC 3339 time nor a positive duration from now", strconv.Quote(s))
	}
	return now.Add(d), nil
}

// pending prints one page of pending retries by due time, those that pass the filters. With --index
// PATH the page comes from the retry-state index (pendingFromIndex): in true due order over the whole
// backlog, with the exact total, and no filters. Without it, a scan that stopped at --max-peek says
// that its page is partial.
func (a *app) pending(ctx context.Context, args []string) error {
	var c common
	var f pendingFilterFlags
	fs := newFlagSet("pending", &c)
	limit := fs.Int("limit", defaultPageLimit, "")
	cursor := fs.String("cursor", "", "")
	wide := fs.Bool("wide", false, "")
	index := fs.String("index", "", "")
	f.register(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("pending takes no arguments, got %q", pos)
	}
	if *limit <= 0 {
		return usagef("--limit must be positive")
	}
	filter, err := f.filter(a.now())
	if err != nil {
		return err
	}
	if *index != "" {
		if f.set() {
			// Never a page that looks filtered and is not.
			return usagef("pending --index lists the whole backlog in due order and takes no filters: drop --index to scan the broker with --contains, --property, --due-after, --due-before or --body-contains")
		}
		if c.timeout <= 0 {
			return usagef("--timeout must be positive")
		}
		return a.pendingFromIndex(ctx, &c, *index, *limit, *cursor, *wide)
	}
	s, ctx, closeAll, err := a.open(ctx, &c)
	if err != nil {
		return err
	}
	defer closeAll()
	// One page per invocation: the cursor printed at the end continues the listing, and is stable
	// while retries come and go (see inspect.Inspector.ListPending).
	page, err := s.inspector.ListPending(ctx, inspect.PageOptions{Limit: *limit, Cursor: *cursor, Filter: filter})
	if err != nil {
		return err
	}
	a.warnTruncated(page.Scans...)
	if c.json {
		out := struct {
			Pending []jsonPending `json:"pending"`
			Next    string        `json:"next,omitempty"`
			Scans   []jsonScan    `json:"scans"`
			Partial bool          `json:"partial"`
		}{Pending: []jsonPending{}, Next: page.Next, Scans: scansJSON(page.Scans), Partial: inspect.Truncated(page.Scans)}
		for _, p := range page.Items {
			out.Pending = append(out.Pending, pendingJSON(p))
		}
		return writeJSON(a.stdout, out)
	}
	partial := inspect.Truncated(page.Scans)
	if partial {
		// A peek reads in sequence order, not due order: a retry beyond the bound may be due before
		// every one listed.
		fmt.Fprintf(a.stdout, "partial: read only %s (--max-peek); this page is in due order among those only, and retries beyond them may be due earlier (raise --max-peek or use --index)\n", describeScans(page.Scans))
	}
	if len(page.Items) == 0 {
		if !partial {
			what := "pending retries"
			if f.set() {
				what = "matching pending retries"
			}
			fmt.Fprintf(a.stdout, "no %s (read %s)\n", what, describeScans(page.Scans))
		}
		return nil
	}
	// ENTITY and SEQ first: together they are the REF that cancel takes.
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	head := "ENTITY\tSEQ\tDUE\tATTEMPT\tORIGINAL ID"
	if *wide {
		head += "\tMESSAGE ID\tKEY"
	}
	fmt.Fprintln(tw, head+"\tLAST ERROR")
	for _, p := range page.Items {
		// The ids, the key and the last error are any producer's or handler's text: quoted when they
		// hold what a terminal would act on (printable).
		line := fmt.Sprintf("%s\t%d\t%s\t%d\t%s", p.Entity, p.SequenceNumber, formatTime(p.DueTime), p.Attempt, printable(clip(p.Envelope.OriginalMessageID, 60)))
		if *wide {
			line += "\t" + printable(p.MessageID) + "\t" + printable(clip(p.Envelope.Key, 60))
		}
		fmt.Fprintln(tw, line+"\t"+printable(clip(redact.String(p.LastError), 60)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if page.Next != "" {
		fmt.Fprintf(a.stdout, "more: sbretry pending --limit %d --cursor %s%s\n", *limit, page.Next, f.args())
	}
	return nil
}

// cancelReport is a cancel, as --json prints it: the pending retries previewed, and which were
// cancelled.
type cancelReport struct {
	dryRun bool
	items  []inspect.Pending
	done   int
}

type jsonCancel struct {
	Action   string        `json:"action"`
	DryRun   bool          `json:"dryRun"`
	Selected int           `json:"selected"`
	Done     int           `json:"done"`
	Items    []jsonPending `json:"items"`
	Error    string        `json:"error,omitempty"`
}

func (r *cancelReport) toJSON(err error) any {
	out := jsonCancel{Action: "cancel", DryRun: r.dryRun, Selected: len(r.items), Done: r.done, Items: make([]jsonPending, len(r.items))}
	for i, p := range r.items {
		out.Items[i] = pendingJSON(p)
	}
	if err != nil {
		out.Error = redact.String(err.Error())
	}
	return out
}

// cancel cancels pending retries, each named by a REF. Every one is first checked by the inspector,
// which refuses a message that is not a scheduled retry copy, so a typo cannot delete a live message;
// the checked list is the preview, printed by the dry run and before the confirmation, and the real run
// cancels exactly that list, in order, stopping at the first failure.
func (a *app) cancel(ctx context.Context, args []string) error {
	var c common
	var af auditFlags
	fs := newFlagSet("cancel", &c)
	af.register(fs)
	dryRun := fs.Bool("dry-run", false, "")
	yes := fs.Bool("yes", false, "")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("cancel needs at least one REF (ENTITY:SEQ, or SEQ)")
	}
	var refs []inspect.Ref
	for _, p := range pos {
		rs, err := parseRefs(p)
		if err != nil {
			return usagef("cancel: %v", err)
		}
		refs = append(refs, rs...)
	}
	s, ctx, closeAll, err := a.open(ctx, &c)
	if err != nil {
		return err
	}
	defer closeAll()
	items, err := dlqaction.PreviewCancel(ctx, s.inspector, refs)
	if err != nil {
		return err // nothing was cancelled yet
	}
	rep := &cancelReport{dryRun: *dryRun, items: items}
	if !c.json || !*yes {
		w := a.stdout
		if c.json {
			w = a.stderr // the preview for the confirmation; stdout is the JSON
		}
		verb := "cancelling"
		if *dryRun {
			verb = "would cancel"
		}
		fmt.Fprintf(w, "%s %d pending retries:\n", verb, len(rep.items))
		if err := printPending(w, rep.items); err != nil {
			return err
		}
	}
	if *dryRun {
		return a.finish(c.json, rep, nil, "")
	}
	au := a.newAuditor(&af, "cancel")
	planned := make([]inspect.Ref, len(rep.items))
	for i, q := range rep.items {
		planned[i] = q.Ref()
	}
	au.selection(s.entity.Path(), planned)
	if !*yes {
		if err := a.confirm(fmt.Sprintf("Cancel the %d pending retries listed above? They will never run.", len(rep.items)), "cancel"); err != nil {
			return a.finish(c.json, rep, au.refuse(err, pendingAuditItems(rep.items, 0)), "")
		}
	}
	if err := au.start(pendingAuditItems(rep.items, 0)); err != nil {
		return a.finish(c.json, rep, err, "")
	}
	done, err := dlqaction.Cancel(ctx, s.inspector, rep.items)
	rep.done = done
	if err != nil {
		err = stopped(err)
	}
	if err = au.end(done, err, pendingAuditItems(rep.items, done)); err != nil {
		return a.finish(c.json, rep, err, "")
	}
	return a.finish(c.json, rep, nil, fmt.Sprintf("cancelled %d pending retries", rep.done))
}

// printPending writes the preview of a cancel, one pending retry a line.
func printPending(w io.Writer, items []inspect.Pending) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  ENTITY\tSEQ\tDUE\tATTEMPT\tKEY\tMESSAGE ID")
	for _, p := range items {
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%d\t%s\t%s\n", p.Entity, p.SequenceNumber, formatTime(p.DueTime), p.Attempt, printable(clip(p.Envelope.Key, 60)), printable(p.MessageID))
	}
	return tw.Flush()
}
