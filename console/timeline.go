package console

import (
	"context"
	"net/http"
	"time"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/redact"
)

// timelineBuckets is the number of bars of the pending-retry timeline: enough to see a burst, few
// enough that each bar stays readable at a laptop's width.
const timelineBuckets = 48

// timelineHorizon is how far from now the timeline reaches. A due time is whatever the message's
// sender scheduled, and any producer can schedule a message carrying a retry attempt for the year
// 9000: a chart spanning to it would put every real retry in its first bar (and the span overflowed a
// time.Duration, which panicked). Retries due later are counted apart, in timeline.Later.
const timelineHorizon = 30 * 24 * time.Hour

// timeline counts pending retries by due time in equal buckets from now to the latest due.
type timeline struct {
	Starts []int64 `json:"starts"` // bucket starts, Unix seconds
	Counts []int   `json:"counts"`
	Total  int     `json:"total"`
	// Later counts the retries due after Horizon (Unix seconds), which the buckets leave out.
	Later   int   `json:"later"`
	Horizon int64 `json:"horizon"`
	// Truncated says a read stopped at the peek bound: later retries are missing.
	Truncated bool `json:"truncated"`
	// FromIndex says the counts come from the retry-state index's counts of the whole backlog, as of
	// AsOf (Unix seconds).
	FromIndex bool  `json:"fromIndex"`
	AsOf      int64 `json:"asOf,omitempty"`
}

// timelineOf buckets the entity's pending retries by due time (see [bucketDueTimes]).
func (c *Console) timelineOf(ctx context.Context, e *entity) (*timeline, error) {
	// One page as large as the peek bound lists every pending retry read, earliest first; the scan is
	// the same whatever the page size, so asking for all costs memory, not round trips.
	pg, err := e.inspector().ListPending(ctx, inspect.PageOptions{Limit: c.opts.MaxPeek})
	if err != nil && c.recognise(ctx, e, err) {
		return &timeline{}, nil // a session entity's retries are held in its sessions
	}
	if err != nil {
		return nil, err
	}
	due := make([]time.Time, len(pg.Items))
	for i, p := range pg.Items {
		due[i] = p.DueTime
	}
	t := bucketDueTimes(c.now(), due)
	t.Truncated = pg.Truncated()
	return t, nil
}

// bucketDueTimes counts due times in at most timelineBuckets+1 buckets of whole minutes, from now (or
// the earliest overdue one, but not earlier than timelineHorizon before now: older ones count in the
// first bucket) to the latest one due within timelineHorizon of now; those due later are counted in
// Later. Every duration it computes is bounded by the horizon, so no due time, however far, overflows.
func bucketDueTimes(now time.Time, due []time.Time) *timeline {
	t := &timeline{Total: len(due)}
	if len(due) == 0 {
		return t
	}
	from := now
	for _, d := range due {
		if d.Before(from) {
			from = d
		}
	}
	from = maxTime(from, now.Add(-timelineHorizon)).Truncate(time.Minute)
	horizon := now.Add(timelineHorizon)
	t.Horizon = horizon.Unix()
	end := from
	for _, d := range due {
		switch {
		case d.After(horizon):
			t.Later++
		case d.After(end):
			end = d
		}
	}
	step, n := timelineSteps(from, end)
	t.Starts, t.Counts = make([]int64, n), make([]int, n)
	for i := range n {
		t.Starts[i] = from.Add(time.Duration(i) * step).Unix()
	}
	for _, d := range due {
		if d.After(horizon) {
			continue
		}
		// d.Sub saturates instead of overflowing for a due time centuries back; clamped to bucket 0.
		i := min(max(int(d.Sub(from)/step), 0), n-1)
		t.Counts[i]++
	}
	return t
}

// timelineSteps is the width and number of the buckets from from to end: at most timelineBuckets+1
// of whole minutes. from ≤ end ≤ the horizon, so the span is at most twice the horizon: far from
// overflowing.
func timelineSteps(from, end time.Time) (step time.Duration, n int) {
	span := end.Sub(from) + time.Minute
	step = ceilMinute((span + timelineBuckets - 1) / timelineBuckets)
	return step, int(span/step) + 1
}

// ceilMinute rounds d up to whole minutes, at least one.
func ceilMinute(d time.Duration) time.Duration {
	return max((d+time.Minute-1)/time.Minute, 1) * time.Minute
}

// maxTime is the later of a and b.
func maxTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return b
	}
	return a
}

// timelineJSON is the data of the pending page's chart.
func (c *Console) timelineJSON(w http.ResponseWriter, r *http.Request) {
	e, ok := c.entityOf(w, r)
	if !ok {
		return
	}
	ctx, cancel := readContext(r)
	defer cancel()
	var t *timeline
	var err error
	if c.fromIndex(r, e) {
		t, err = c.timelineFromIndex(ctx, e)
	} else {
		t, err = c.timelineOf(ctx, e)
	}
	if err != nil {
		http.Error(w, redact.String(err.Error()), http.StatusBadGateway)
		return
	}
	writeJSON(w, t)
}
