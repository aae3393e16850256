package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/redact"
)

// pending prints one page of pending retries by due time.
func (a *app) pending(ctx context.Context, args []string) error {
	var c common
	fs := newFlagSet("pending", &c)
	limit := fs.Int("limit", defaultPageLimit, "")
	cursor := fs.String("cursor", "", "")
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
	s, ctx, closeAll, err := a.open(ctx, &c)
	if err != nil {
		return err
	}
	defer closeAll()
	// One page per invocation: the cursor printed at the end continues the listing, and is stable
	// while retries come and go (see inspect.Inspector.ListPending).
	page, err := s.inspector.ListPending(ctx, inspect.PageOptions{Limit: *limit, Cursor: *cursor})
	if err != nil {
		return err
	}
	a.warnTruncated(page.Scans...)
	if c.json {
		out := struct {
			Pending []jsonPending `json:"pending"`
			Next    string        `json:"next,omitempty"`
			Scans   []jsonScan    `json:"scans"`
		}{Pending: []jsonPending{}, Next: page.Next, Scans: scansJSON(page.Scans)}
		for _, p := range page.Items {
			out.Pending = append(out.Pending, pendingJSON(p))
		}
		return writeJSON(a.stdout, out)
	}
	if len(page.Items) == 0 {
		fmt.Fprintf(a.stdout, "no pending retries (read %s)\n", describeScans(page.Scans))
		return nil
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DUE\tATTEMPT\tSEQ\tKEY\tMESSAGE ID\tLAST ERROR")
	for _, p := range page.Items {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", formatTime(p.DueTime), p.Attempt, p.SequenceNumber,
			clip(p.Envelope.Key, 40), p.MessageID, clip(redact.String(p.LastError), 60))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if page.Next != "" {
		fmt.Fprintf(a.stdout, "more: sbretry pending --limit %d --cursor %s\n", *limit, page.Next)
	}
	return nil
}

// cancel cancels one pending retry. The inspector refuses a sequence number that is not a scheduled
// retry copy, so a typo cannot delete a live message.
func (a *app) cancel(ctx context.Context, args []string) error {
	var c common
	fs := newFlagSet("cancel", &c)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("cancel needs exactly one SEQ")
	}
	seqs, err := parseSeqs(pos[0])
	if err != nil || len(seqs) != 1 {
		return usagef("cancel needs one sequence number, got %q", pos[0])
	}
	s, ctx, closeAll, err := a.open(ctx, &c)
	if err != nil {
		return err
	}
	defer closeAll()
	p, err := s.inspector.Cancel(ctx, seqs[0])
	if err != nil {
		return err
	}
	if c.json {
		return writeJSON(a.stdout, pendingJSON(*p))
	}
	fmt.Fprintf(a.stdout, "cancelled the retry due at %s (attempt %d) of %s; sequence number %d, message id %s\n",
		formatTime(p.DueTime), p.Attempt, p.Envelope.Key, p.SequenceNumber, p.MessageID)
	return nil
}
