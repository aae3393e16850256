package inspect

import (
	"context"
	"slices"
	"strings"
	"time"
)

// DeadLetterFilter selects dead letters; a zero field selects everything.
type DeadLetterFilter struct {
	// Refs keeps only these dead letters, each named by its dead-letter queue and its sequence number
	// there (see [Ref]: the two dead-letter queues of a subscription layout number their messages each
	// on its own). [Inspector.DeadLetters] accepts a Ref without an entity when it reads one dead-letter
	// queue only; [DeadLetterFilter.Match] matches a Ref by entity (ignoring case) and number, so a Ref
	// without an entity matches nothing there.
	Refs []Ref
	// Reason keeps dead letters whose [DeadLetter.Reason] equals it, ignoring case.
	Reason string
	// Since and Until keep dead letters with Since <= DeadLetteredAt < Until.
	Since, Until time.Time
	// Contains keeps dead letters whose description or last error contains it, ignoring case.
	Contains string
	// Property keeps dead letters carrying an application property with a value (see
	// [PropertyFilter]).
	Property PropertyFilter
	// Body keeps dead letters whose body contains it (ignoring case for a UTF-8 body). Bodies are
	// customer data: a front end offers this only when its operator turned it on.
	Body string
}

// Selects reports whether f narrows the selection by what the dead letters hold: a reason, a time, a
// text, a property or a body (Refs aside).
func (f DeadLetterFilter) Selects() bool {
	return f.Reason != "" || !f.Since.IsZero() || !f.Until.IsZero() || f.Contains != "" || !f.Property.IsZero() || f.Body != ""
}

// Match reports whether dl passes every set field of f.
func (f DeadLetterFilter) Match(dl DeadLetter) bool {
	switch {
	case len(f.Refs) > 0 && !slices.ContainsFunc(f.Refs, func(r Ref) bool {
		return r.SequenceNumber == dl.SequenceNumber && r.Entity != "" && strings.EqualFold(r.Entity, dl.Entity)
	}):
		return false
	case f.Reason != "" && !strings.EqualFold(f.Reason, dl.Reason):
		return false
	case !f.Since.IsZero() && dl.DeadLetteredAt.Before(f.Since):
		return false
	case !f.Until.IsZero() && !dl.DeadLetteredAt.Before(f.Until):
		return false
	case f.Contains != "" && !containsFold(dl.Description, f.Contains) && !containsFold(dl.LastError, f.Contains):
		return false
	case !f.Property.match(dl.Message):
		return false
	}
	return bodyContains(dl.Message, f.Body)
}

// DeadLetterList is the result of [Inspector.DeadLetters].
type DeadLetterList struct {
	// Items are the matching dead letters: those of the entity's dead-letter queue, then those of the
	// retry queue's, each in sequence-number order (the order they were dead-lettered there). Numbers of
	// different queues are not comparable: each item's Entity says which queue it is in.
	Items []DeadLetter
	// Scan says what was read from the entity's dead-letter queue.
	Scan Scan
	// RetryQueueScan says what was read from the retry queue's dead-letter queue, when
	// [Options.RetryQueue] names another queue (nil otherwise): a chain whose last attempt came from the
	// retry queue is dead-lettered there.
	RetryQueueScan *Scan
	// Missing are the Refs of the filter (with their entities resolved) that no listed item has: not in
	// their dead-letter queue among the messages read, or not passing the other fields of the filter.
	Missing []Ref
}

// Scans returns Scan and, when there is one, RetryQueueScan.
func (l *DeadLetterList) Scans() []Scan {
	if l.RetryQueueScan == nil {
		return []Scan{l.Scan}
	}
	return []Scan{l.Scan, *l.RetryQueueScan}
}

// DeadLetters lists the dead letters that pass f, reading each dead-letter queue up to
// [Options.MaxPeek] messages. The Refs of f are resolved first (see [Ref]); one without an entity while
// two dead-letter queues are read returns [ErrAmbiguousRef], one naming another entity
// [ErrUnknownEntity], and nothing is read.
func (in *Inspector) DeadLetters(ctx context.Context, f DeadLetterFilter) (*DeadLetterList, error) {
	if len(f.Refs) > 0 {
		refs, err := in.resolveAll(f.Refs, in.deadSources(), "dead letter")
		if err != nil {
			return nil, err
		}
		f.Refs = refs
	}
	out := &DeadLetterList{}
	defer func() { out.Missing = missingRefs(f.Refs, out.Items) }()
	for i, src := range in.deadSources() {
		entity := in.sourcePath(src)
		sc, err := in.scan(ctx, src, func(d decoded) {
			if dl := d.deadLetter(entity); f.Match(dl) {
				out.Items = append(out.Items, dl)
			}
		})
		if i == 0 {
			out.Scan = sc
		} else {
			out.RetryQueueScan = &sc
		}
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// missingRefs are the refs no item has.
func missingRefs(refs []Ref, items []DeadLetter) []Ref {
	var out []Ref
	for _, r := range refs {
		if !slices.ContainsFunc(items, func(d DeadLetter) bool { return d.Ref() == r }) {
			out = append(out, r)
		}
	}
	return out
}

// DeadLetter returns the dead letter r names, with its body and properties in [DeadLetter.Message]. r
// names one of [Inspector.DeadLetterQueues] (a Ref without an entity is accepted when there is only
// one) and the dead letter's sequence number there. It costs one peek of one message; a number not in
// that dead-letter queue returns an error wrapping [ErrNotFound], a Ref the inspector cannot place
// [ErrAmbiguousRef] or [ErrUnknownEntity].
func (in *Inspector) DeadLetter(ctx context.Context, r Ref) (*DeadLetter, error) {
	src, rr, err := in.resolve(r, in.deadSources(), "dead letter")
	if err != nil {
		return nil, err
	}
	d, err := in.peekAt(ctx, src, rr)
	if err != nil {
		return nil, err
	}
	dl := d.deadLetter(rr.Entity)
	return &dl, nil
}
