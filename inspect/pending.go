package inspect

import (
	"container/heap"
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// PageOptions selects one page of [Inspector.ListPending].
type PageOptions struct {
	// Limit is the page size. Zero means [DefaultPageLimit] (100); negative is invalid.
	Limit int
	// Cursor continues after the last item of an earlier page ([PendingPage.Next]); empty starts with
	// the earliest due retry. A cursor is a position in due order, so it continues a listing under
	// another filter just as well.
	Cursor string
	// Filter keeps only the pending retries that pass it; the zero filter keeps every one.
	Filter PendingFilter
}

// PendingPage is one page of pending retries, earliest due first.
type PendingPage struct {
	// Items are at most Limit pending retries.
	Items []Pending
	// Next is the cursor of the following page; empty when this page is the last one (among the
	// messages read: see Scans).
	Next string
	// Scans says what was read; see [Truncated].
	Scans []Scan
}

// Truncated reports whether a scan stopped at [Options.MaxPeek], so that the order is by due time among
// the messages read only.
func (p *PendingPage) Truncated() bool { return Truncated(p.Scans) }

// ListPending lists the pending retries (scheduled messages carrying a retry envelope) by due time,
// one page at a time. Service Bus can only be peeked in sequence-number order, so every page scans
// the retry copies' entity up to [Options.MaxPeek] messages and keeps, in memory proportional to
// Limit, the earliest Limit copies due after the cursor. A page therefore costs one bounded scan
// whatever its size: to list everything, ask for large pages. The cursor names the last item (its
// due time, entity and sequence number), so pages stay consistent while retries activate or are
// added: an item is never listed twice, and a copy added behind the cursor is not listed.
func (in *Inspector) ListPending(ctx context.Context, opts PageOptions) (*PendingPage, error) {
	limit := opts.Limit
	switch {
	case limit < 0:
		return nil, fmt.Errorf("%w: page limit %d is negative", ErrInvalidOptions, limit)
	case limit == 0:
		limit = DefaultPageLimit
	}
	var after *Pending
	if opts.Cursor != "" {
		c, err := decodeCursor(opts.Cursor)
		if err != nil {
			return nil, err
		}
		after = &c
	}
	// A max-heap of the limit+1 earliest candidates: the extra one says whether a next page exists.
	top := &pendingHeap{}
	page := &PendingPage{}
	for _, s := range in.liveSources() {
		entity := in.sourcePath(s)
		sc, err := in.scan(ctx, s, func(d decoded) {
			if !d.isScheduled() || !d.isRetryCopy() || d.isProbe() {
				return
			}
			p := d.pending(entity)
			if after != nil && comparePending(p, *after) <= 0 {
				return
			}
			if !opts.Filter.match(p, d.msg) {
				return
			}
			heap.Push(top, p)
			if top.Len() > limit+1 {
				heap.Pop(top)
			}
		})
		page.Scans = append(page.Scans, sc)
		if err != nil {
			return page, err
		}
	}
	items := []Pending(*top)
	slices.SortFunc(items, comparePending)
	if len(items) > limit {
		items = items[:limit]
		page.Next = encodeCursor(items[limit-1])
	}
	page.Items = items
	return page, nil
}

// pendingHeap is a max-heap by [comparePending]: its root is the latest due candidate.
type pendingHeap []Pending

func (h pendingHeap) Len() int           { return len(h) }
func (h pendingHeap) Less(i, j int) bool { return comparePending(h[i], h[j]) > 0 }
func (h pendingHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *pendingHeap) Push(x any)        { *h = append(*h, x.(Pending)) }
func (h *pendingHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// cursorVersion starts every cursor, so that a later format can tell old cursors apart. Version 1
// wrote the due time in Unix nanoseconds, which an int64 holds only until the year 2262: a retry any
// producer scheduled later (say for the year 9000) gave a cursor naming another time, and paging
// past it repeated or skipped items. Version 2 writes seconds and nanoseconds apart; version 1
// cursors (handed out before an upgrade) are still read.
const (
	cursorVersion   = "2"
	cursorVersionV1 = "1"
)

// encodeCursor names p's position: version, due time in Unix seconds and the nanoseconds within that
// second, sequence number, entity.
func encodeCursor(p Pending) string {
	raw := cursorVersion + "|" + strconv.FormatInt(p.DueTime.Unix(), 10) + "|" + strconv.Itoa(p.DueTime.Nanosecond()) +
		"|" + strconv.FormatInt(p.SequenceNumber, 10) + "|" + p.Entity
	return base64.RawURLEncoding.EncodeToString([]byte(raw))
}

func decodeCursor(s string) (Pending, error) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return Pending{}, fmt.Errorf("%w: %v", ErrInvalidCursor, err)
	}
	version, rest, _ := strings.Cut(string(raw), "|")
	switch version {
	case cursorVersionV1:
		parts := strings.SplitN(rest, "|", 3)
		if len(parts) != 3 {
			return Pending{}, fmt.Errorf("%w: unknown format", ErrInvalidCursor)
		}
		due, err1 := strconv.ParseInt(parts[0], 10, 64)
		seq, err2 := strconv.ParseInt(parts[1], 10, 64)
		if err1 != nil || err2 != nil {
			return Pending{}, fmt.Errorf("%w: malformed position", ErrInvalidCursor)
		}
		return Pending{DueTime: time.Unix(0, due), SequenceNumber: seq, Entity: parts[2]}, nil
	case cursorVersion:
		parts := strings.SplitN(rest, "|", 4)
		if len(parts) != 4 {
			return Pending{}, fmt.Errorf("%w: unknown format", ErrInvalidCursor)
		}
		sec, err1 := strconv.ParseInt(parts[0], 10, 64)
		nsec, err2 := strconv.ParseInt(parts[1], 10, 64)
		seq, err3 := strconv.ParseInt(parts[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil || nsec < 0 || nsec >= int64(time.Second) {
			return Pending{}, fmt.Errorf("%w: malformed position", ErrInvalidCursor)
		}
		return Pending{DueTime: time.Unix(sec, nsec), SequenceNumber: seq, Entity: parts[3]}, nil
	}
	return Pending{}, fmt.Errorf("%w: unknown format", ErrInvalidCursor)
}
