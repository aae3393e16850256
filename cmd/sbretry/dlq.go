package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/redact"
)

// filterFlags are the dead-letter filters every dlq command takes.
type filterFlags struct {
	seq, reason, since, until, contains string
	all                                 bool
}

func (f *filterFlags) register(fs *flag.FlagSet, selection bool) {
	fs.StringVar(&f.reason, "reason", "", "")
	fs.StringVar(&f.since, "since", "", "")
	fs.StringVar(&f.until, "until", "", "")
	fs.StringVar(&f.contains, "contains", "", "")
	if selection {
		fs.StringVar(&f.seq, "seq", "", "")
		fs.BoolVar(&f.all, "all", false, "")
	}
}

// filter builds the inspect filter. With selection set (redrive, purge), the command must say what to
// touch: --seq, --reason or --all, so that a forgotten flag never means "everything".
func (f *filterFlags) filter(now time.Time, selection bool) (inspect.DeadLetterFilter, error) {
	var out inspect.DeadLetterFilter
	if selection {
		switch {
		case f.all && (f.seq != "" || f.reason != ""):
			return out, usagef("--all selects every dead letter; do not combine it with --seq or --reason")
		case !f.all && f.seq == "" && f.reason == "":
			return out, usagef("say which dead letters: --seq N,M, --reason R or --all")
		}
	}
	if f.seq != "" {
		seqs, err := parseSeqs(f.seq)
		if err != nil {
			return out, usagef("--seq: %v", err)
		}
		out.SequenceNumbers = seqs
	}
	out.Reason, out.Contains = f.reason, f.contains
	var err error
	if out.Since, err = parseWhen(f.since, now); err != nil {
		return out, usagef("--since: %v", err)
	}
	if out.Until, err = parseWhen(f.until, now); err != nil {
		return out, usagef("--until: %v", err)
	}
	return out, nil
}

// parseSeqs parses "5,7,9" into distinct sequence numbers in ascending order.
func parseSeqs(s string) ([]int64, error) {
	var out []int64
	for _, part := range strings.Split(s, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(part), 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a sequence number", part)
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
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
	s, ctx, closeAll, err := a.open(ctx, &c)
	if err != nil {
		return err
	}
	defer closeAll()
	list, err := s.inspector.DeadLetters(ctx, filter)
	if err != nil {
		return err
	}
	a.warnTruncated(list.Scan)
	if c.json {
		out := struct {
			Entity      string           `json:"entity"`
			DeadLetters []jsonDeadLetter `json:"deadLetters"`
			Scan        jsonScan         `json:"scan"`
		}{Entity: s.entity.DeadLetterPath(), DeadLetters: []jsonDeadLetter{}, Scan: scansJSON([]inspect.Scan{list.Scan})[0]}
		for _, d := range list.Items {
			out.DeadLetters = append(out.DeadLetters, deadLetterJSON(d))
		}
		return writeJSON(a.stdout, out)
	}
	if len(list.Items) == 0 {
		fmt.Fprintf(a.stdout, "no matching dead letters (read %d messages of %s)\n", list.Scan.Peeked, list.Scan.Entity)
		return nil
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tDEAD-LETTERED\tREASON\tATTEMPT\tMESSAGE ID\tDESCRIPTION")
	for _, d := range list.Items {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\n", d.SequenceNumber, formatTime(d.DeadLetteredAt), d.Reason, d.Attempt,
			d.MessageID, clip(redact.String(d.Description), 60))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "%d dead letters\n", len(list.Items))
	return nil
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
		return usagef("dlq show needs exactly one SEQ")
	}
	seq, err := strconv.ParseInt(pos[0], 10, 64)
	if err != nil || seq < 0 {
		return usagef("dlq show: %q is not a sequence number", pos[0])
	}
	s, ctx, closeAll, err := a.open(ctx, &c)
	if err != nil {
		return err
	}
	defer closeAll()
	d, err := s.inspector.DeadLetter(ctx, seq)
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
	row := func(k string, v any) { fmt.Fprintf(tw, "%s:\t%v\n", k, v) }
	row("sequence number", d.SequenceNumber)
	row("message id", d.MessageID)
	row("reason", d.Reason)
	row("description", redact.String(d.Description))
	row("attempt", d.Attempt)
	row("dead-lettered at", formatTime(d.DeadLetteredAt))
	row("last error", redact.String(d.LastError))
	row("source", d.Source)
	if d.EnvelopeErr != nil {
		row("envelope", redact.String(d.EnvelopeErr.Error()))
	} else {
		row("key", d.Envelope.Key)
		row("correlation id", d.Envelope.CorrelationID)
		row("original message id", d.Envelope.OriginalMessageID)
		if _, ok := m.ApplicationProperties[retry.PropFirstEnqueuedTime]; ok {
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
		fmt.Fprintf(w, "  %s = %v\n", k, displayValue(m.ApplicationProperties[k]))
	}
	fmt.Fprintf(w, "body (%d bytes):\n%s\n", len(m.Body), displayBody(m.Body))
	return nil
}
