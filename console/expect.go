package console

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/dlqaction"
)

// expectations are what an index-backed page said about the messages it offers for an action: for
// each selected ref, the MessageID the retry-state index names there. The form carries them as
// "expect" fields (REF=MESSAGEID), and both steps of the action peek each ref at its sequence number and
// go on only when the message there has that MessageID: an index is as fresh as its feeds, and acting
// on a sequence number it remembers wrongly would touch another message.
type expectations map[inspect.Ref]string

// errStaleIndex marks an action refused because the broker no longer holds, at a sequence number the
// index recorded, the message the index named. It is a conflict: nothing was done.
var errStaleIndex = errors.New("the retry-state index was stale")

// readExpectations parses the form's expect fields (at most max); a field that does not parse is an
// error, which the caller refuses with 400.
func readExpectations(fields []string, max int) (expectations, error) {
	if len(fields) == 0 {
		return nil, nil
	}
	if len(fields) > max {
		return nil, fmt.Errorf("%d expected messages given; at most %d can be", len(fields), max)
	}
	out := make(expectations, len(fields))
	for _, f := range fields {
		// An entity path has no "=", a MessageID may: the first "=" ends the ref.
		s, id, ok := strings.Cut(f, "=")
		if !ok || id == "" {
			return nil, fmt.Errorf("malformed expected message %q: want ENTITY:SEQ=MESSAGEID", f)
		}
		ref, err := parseQualifiedRef(s)
		if err != nil {
			return nil, err
		}
		out[ref] = id
	}
	return out, nil
}

// covers reports whether every ref has an expectation: a form from an index-backed page expects
// each message it selects; one that expects some but not all is refused.
func (x expectations) covers(refs []inspect.Ref) bool {
	for _, r := range refs {
		if _, ok := x[r]; !ok {
			return false
		}
	}
	return true
}

// check compares what the broker holds at ref (its MessageID, as just peeked) with what the index
// named there.
func (x expectations) check(ref inspect.Ref, messageID string) error {
	want, ok := x[ref]
	if !ok || want == messageID {
		return nil
	}
	return fmt.Errorf("%w: %s holds %q, not %q as the index said; search for the event to see where it is now", errStaleIndex, ref, messageID, want)
}

// fields are the expectations of refs as form values, in refs' order, for the preview's form.
func (x expectations) fields(refs []string) []string {
	if len(x) == 0 {
		return nil
	}
	out := make([]string, 0, len(refs))
	for _, s := range refs {
		if ref, err := inspect.ParseRef(s); err == nil {
			if id, ok := x[ref]; ok {
				out = append(out, s+"="+id)
			}
		}
	}
	return out
}

// checkPending checks pending retries just peeked at their refs against the expectations.
func (x expectations) checkPending(items []inspect.Pending) error {
	for _, p := range items {
		if err := x.check(p.Ref(), p.MessageID); err != nil {
			return err
		}
	}
	return nil
}

// selectExpected peeks each selected dead letter at its sequence number (one peek each, however deep
// in its queue: a scan would stop at MaxPeek, and an index names dead letters anywhere in it) and
// checks it against the expectations. One that is gone, or that is not the message the index named,
// makes the whole action a conflict: nothing is done.
//
// The selection's scans let a redrive or purge receive past up to MaxPeek other dead letters of each
// queue before the selected ones, as a selection made from a peek of MaxPeek would; a dead letter
// deeper than that is refused by the run with nothing done to it.
func (c *Console) selectExpected(ctx context.Context, e *entity, refs []inspect.Ref, x expectations) (*dlqaction.Selection, error) {
	sel := &dlqaction.Selection{}
	seen := map[string]bool{}
	for _, ref := range refs {
		d, err := e.inspector().DeadLetter(ctx, ref)
		if errors.Is(err, inspect.ErrNotFound) {
			return nil, fmt.Errorf("%w: %s is no longer in its dead-letter queue (redriven or purged meanwhile?)", errStaleIndex, ref)
		}
		if err != nil {
			return nil, err
		}
		if err := x.check(ref, d.MessageID); err != nil {
			return nil, err
		}
		sel.Items = append(sel.Items, *d)
		if !seen[d.Entity] {
			seen[d.Entity] = true
			sel.Scans = append(sel.Scans, inspect.Scan{Entity: d.Entity, Peeked: c.opts.MaxPeek})
		}
	}
	return sel, nil
}
