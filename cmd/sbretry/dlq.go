package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/redact"
)

// filterFlags are the dead-letter filters every dlq command takes.
type filterFlags struct {
	seq, reason, since, until, contains, property, body string
	all                                                 bool
}

func (f *filterFlags) register(fs *flag.FlagSet, selection bool) {
	fs.StringVar(&f.reason, "reason", "", "")
	fs.StringVar(&f.since, "since", "", "")
	fs.StringVar(&f.until, "until", "", "")
	fs.StringVar(&f.contains, "contains", "", "")
	fs.StringVar(&f.property, "property", "", "")
	fs.StringVar(&f.body, "body-contains", "", "")
	if selection {
		fs.StringVar(&f.seq, "seq", "", "")
		fs.BoolVar(&f.all, "all", false, "")
	}
}

// filter builds the inspect filter. With selection set (redrive, purge), the command must say what to
// touch: --seq, --reason, --property or --all, so that a forgotten flag never means "everything".
func (f *filterFlags) filter(now time.Time, selection bool) (inspect.DeadLetterFilter, error) {
	var out inspect.DeadLetterFilter
	if selection {
		switch {
		case f.all && (f.seq != "" || f.reason != "" || f.property != ""):
			return out, usagef("--all selects every dead letter; do not combine it with --seq, --reason or --property")
		case !f.all && f.seq == "" && f.reason == "" && f.property == "":
			return out, usagef("say which dead letters: --seq N,M, --reason R, --property NAME=VALUE or --all")
		}
	}
	if f.seq != "" {
		refs, err := parseRefs(f.seq)
		if err != nil {
			return out, usagef("--seq: %v", err)
		}
		out.Refs = refs
	}
	out.Reason, out.Contains, out.Body = f.reason, f.contains, f.body
	var err error
	if f.property != "" {
		if out.Property, err = inspect.ParsePropertyFilter(f.property); err != nil {
			return out, usagef("--property %q: want NAME=VALUE (an application property and its value as text)", f.property)
		}
	}
	if out.Since, err = parseWhen(f.since, now); err != nil {
		return out, usagef("--since: %v", err)
	}
	if out.Until, err = parseWhen(f.until, now); err != nil {
		return out, usagef("--until: %v", err)
	}
	return out, nil
}

// parseRefs parses a comma-separated list of REFs ("5,7" or "billing-retry/$DeadLetterQueue:5,...")
// into distinct refs in the order given. Entity names never contain a comma.
func parseRefs(s string) ([]inspect.Ref, error) {
	var out []inspect.Ref
	for _, part := range strings.Split(s, ",") {
		r, err := inspect.ParseRef(part)
		if err != nil {
			return nil, fmt.Errorf("%q is not a sequence number or ENTITY:SEQ", strings.TrimSpace(part))
		}
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out, nil
}

// parseWhen parses an RFC 3339 time or a duration back from now ("2h"); empty is the zero time.
func parseWhen(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a positive duration", s)
	}
	return now.Add(-d), nil
}

// dlqList prints the dead letters that pass the filters: a table for people, or with --json every
// field for jq. The descriptions are clipped in the table only.
func (a *app) dlqList(ctx context.Context, args []string) error {
	var c common
	var f filterFlags
	fs := newFlagSet("dlq list", &c)
	f.register(fs, false)
	wide := fs.Bool("wide", false, "")
	index := fs.String("index", "", "")
	limit := fs.Int("limit", defaultPageLimit, "")
	cursor := fs.String("cursor", "", "")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("dlq list takes no arguments, got %q", pos)
	}
	filter, err := f.filter(a.now(), false)
	if err != nil {
		return err
	}
	if *index != "" {
		if f.property != "" || f.body != "" {
			return usagef("--property and --body-contains read the dead letters themselves, which the index does not keep: drop --index to scan the broker")
		}
		if *limit <= 0 {
			return usagef("--limit must be positive")
		}
		if c.timeout <= 0 {
			return usagef("--timeout must be positive")
		}
		return a.dlqFromIndex(ctx, &c, *index, filter, *limit, *cursor, *wide)
	}
	if *cursor != "" {
		return usagef("--cursor continues a listing of dlq list --index; a scan lists every match at once")
	}
	s, ctx, closeAll, err := a.open(ctx, &c)
	if err != nil {
		return err
	}
	defer closeAll()
	list, err := s.inspector.DeadLetters(ctx, filter)
	if err != nil {
		return err
	}
	scans := list.Scans()
	a.warnTruncated(scans...)
	partial := inspect.Truncated(scans)
	if c.json {
		out := struct {
			Entity      string           `json:"entity"`
			DeadLetters []jsonDeadLetter `json:"deadLetters"`
			Scans       []jsonScan       `json:"scans"`
			Partial     bool             `json:"partial"`
		}{Entity: s.entity.Path(), DeadLetters: []jsonDeadLetter{}, Scans: scansJSON(scans), Partial: partial}
		for _, d := range list.Items {
			out.DeadLetters = append(out.DeadLetters, deadLetterJSON(d))
		}
		return writeJSON(a.stdout, out)
	}
	if partial {
		fmt.Fprintf(a.stdout, "partial: read only %s (--max-peek); dead letters beyond them are not listed (raise --max-peek or use --index)\n", describeScans(scans))
	}
	if len(list.Items) == 0 {
		if !partial {
			fmt.Fprintf(a.stdout, "no matching dead letters (read %s)\n", describeScans(scans))
		}
		return nil
	}
	// ENTITY and SEQ first: together they are the REF that dlq show, redrive and purge take.
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	head := "ENTITY\tSEQ\tDEAD-LETTERED\tREASON\tATTEMPT\tORIGINAL ID"
	if *wide {
		head += "\tMESSAGE ID\tKEY"
	}
	fmt.Fprintln(tw, head+"\tDESCRIPTION")
	for _, d := range list.Items {
		// The reason, the ids, the key and the description are any producer's text: quoted when they
		// hold what a terminal would act on (printable).
		line := fmt.Sprintf("%s\t%d\t%s\t%s\t%d\t%s", d.Entity, d.SequenceNumber, formatTime(d.DeadLetteredAt), printable(clip(d.Reason, 60)), d.Attempt,
			printable(clip(d.OriginalMessageID(), 60)))
		if *wide {
			line += "\t" + printable(d.MessageID) + "\t" + printable(clip(d.Key, 60))
		}
		fmt.Fprintln(tw, line+"\t"+printable(clip(redact.String(d.Description), 60)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "%d dead letters\n", len(list.Items))
	return nil
}

// orUnknown says "not recorded" for an empty field, rather than printing nothing.
func orUnknown(s string) string {
	if s == "" {
		return "(not recorded)"
	}
	return s
}

// dlqShow prints one dead letter in full: what the retry library recorded, every application
// property, and the body (text redacted, binary summarised), so an operator can decide between a
// redrive and a purge without another tool.
func (a *app) dlqShow(ctx context.Context, args []string) error {
	var c common
	fs := newFlagSet("dlq show", &c)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("dlq show needs exactly one REF (ENTITY:SEQ, or SEQ)")
	}
	ref, err := inspect.ParseRef(pos[0])
	if err != nil {
		return usagef("dlq show: %q is not a sequence number or ENTITY:SEQ", pos[0])
	}
	s, ctx, closeAll, err := a.open(ctx, &c)
	if err != nil {
		return err
	}
	defer closeAll()
	d, err := s.inspector.DeadLetter(ctx, ref)
	if err != nil {
		return err
	}
	m := d.Message
	if c.json {
		j := deadLetterJSON(*d)
		j.Properties = map[string]any{}
		for k, v := range m.ApplicationProperties {
			j.Properties[k] = displayValue(v)
		}
		body := displayBody(m.Body)
		j.Body = &body
		return writeJSON(a.stdout, j)
	}
	w := a.stdout
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	// Every text a producer or the broker set is quoted when it holds what a terminal would act on.
	row := func(k string, v any) {
		if t, ok := v.(string); ok {
			v = printable(t)
		}
		fmt.Fprintf(tw, "%s:\t%v\n", k, v)
	}
	row("entity", d.Entity)
	row("sequence number", d.SequenceNumber)
	row("message id", d.MessageID)
	row("original message id", d.OriginalMessageID())
	row("reason", d.Reason)
	row("description", redact.String(d.Description))
	row("attempt", d.Attempt)
	row("dead-lettered at", formatTime(d.DeadLetteredAt))
	row("last error", redact.String(d.LastError))
	row("source", d.Source)
	row("key", orUnknown(d.Key))
	row("correlation id", orUnknown(d.CorrelationID))
	if d.EnvelopeErr != nil {
		row("envelope", redact.String(d.EnvelopeErr.Error()))
	} else {
		if _, ok := m.ApplicationProperties[envelope.PropFirstEnqueuedTime]; ok {
			// Without the property, the envelope falls back to this delivery's (the dead letter's) own
			// enqueue time, which is not the first one.
			row("first enqueued", formatTime(d.Envelope.FirstEnqueuedTime))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// Sorted, so that two dead letters can be compared line by line.
	keys := make([]string, 0, len(m.ApplicationProperties))
	for k := range m.ApplicationProperties {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Fprintln(w, "properties:")
	for _, k := range keys {
		fmt.Fprintf(w, "  %s = %s\n", printable(k), printable(fmt.Sprint(displayValue(m.ApplicationProperties[k]))))
	}
	fmt.Fprintf(w, "body (%d bytes):\n%s\n", len(m.Body), printableBody(displayBody(m.Body)))
	return nil
}

// printableBody is a body's text with the characters a terminal would act on written as Go escapes,
// line by line, so that a text body keeps its lines and stays readable.
func printableBody(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if q := printable(l); q != l {
			lines[i] = q
		}
	}
	return strings.Join(lines, "\n")
}
