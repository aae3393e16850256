// Package storetest checks that a [retryindex.Store] answers as the index must, whatever keeps it: the
// embedded SQLite store and the Postgres one run the same checks, so that they fold records, look up,
// page, count and prune alike. It is for tests only; it fails the test it is given.
package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/retryindex"
)

// Open returns an empty store for one test whose clock (for "as of" and feed times) is now; the
// store is closed when the test ends.
type Open func(t *testing.T, now func() time.Time) retryindex.Store

// t0 is the fixed time the checks start at.
var t0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

// Rec is a consumer record of kind k for the chain of message id (started at sequence number seq on
// "orders"), about attempt n, at t0 plus at; a scheduled retry is due an hour later, in "orders".
func Rec(id string, seq int64, k retryindex.Kind, n int, at time.Duration) retryindex.Record {
	env := envelope.Envelope{Source: "orders", FirstSequenceNumber: seq, OriginalMessageID: id}
	r := retryindex.Record{Chain: env.ChainID(), OriginalID: id, Key: id, CorrelationID: id, Source: "orders", Kind: k, Attempt: n,
		At: t0.Add(at), Process: "test/1", Feed: retryindex.FeedConsumer, SequenceNumber: -1}
	switch k {
	case retryindex.KindScheduled:
		r.NextAttempt, r.NextDue, r.Entity = n+1, t0.Add(at+time.Hour), "orders"
	case retryindex.KindHeld:
		r.NextAttempt, r.NextDue, r.Entity = n, t0.Add(at+time.Minute), "orders"
	}
	return r
}

// Run runs every check against stores from open, each as a subtest.
func Run(t *testing.T, open Open) {
	t.Run("fold", func(t *testing.T) { fold(t, open) })
	t.Run("lookup", func(t *testing.T) { lookup(t, open) })
	t.Run("pending", func(t *testing.T) { pending(t, open) })
	t.Run("counts and prune", func(t *testing.T) { countsAndPrune(t, open) })
	t.Run("tailer cursor and gone", func(t *testing.T) { cursorAndGone(t, open) })
	t.Run("refusals", func(t *testing.T) { refusals(t, open) })
	t.Run("concurrent writers", func(t *testing.T) { concurrent(t, open) })
	t.Run("a batch folds as its records one by one", func(t *testing.T) { batches(t, open) })
	t.Run("lost records", func(t *testing.T) { lost(t, open) })
	t.Run("dead-lettered", func(t *testing.T) { deadLettered(t, open) })
	t.Run("by source", func(t *testing.T) { bySource(t, open) })
	t.Run("histogram", func(t *testing.T) { histogram(t, open) })
}

// billing is the second source entity of the checks by source.
const billing = "events/Subscriptions/billing"

// bySource: in an index holding two entities' events, the counts, the listings and their totals of
// one entity are exact through every kind of change (new events, a state changed, a prune, copies
// marked gone), the listings in their order with their cursors, and a source never recorded has none.
func bySource(t *testing.T, open Open) {
	s := open(t, fixed(t0.Add(48*time.Hour)))
	ctx := context.Background()
	var rs []retryindex.Record
	for i := range 30 {
		r := Rec(fmt.Sprintf("s-%d", i), int64(i+1), retryindex.KindScheduled, 1, time.Duration(i)*time.Second)
		r.NextDue = t0.Add(time.Duration((i*7)%30) * time.Minute)
		if i%3 == 0 {
			r.Source = billing
		}
		rs = append(rs, r)
	}
	require.NoError(t, s.Apply(ctx, rs))
	// Changes: s-0 (billing) and s-1 (orders) succeed, s-3 (billing) and s-4 (orders) are dead-lettered
	// (recorded by the tailer, which knows no source), s-6's copy (billing) is gone.
	var changes []retryindex.Record
	for _, c := range []struct {
		i int
		k retryindex.Kind
	}{{0, retryindex.KindSucceeded}, {1, retryindex.KindSucceeded}, {3, retryindex.KindDeadLettered}, {4, retryindex.KindDeadLettered}} {
		r := rs[c.i]
		r.Kind, r.Attempt, r.At, r.NextDue, r.NextAttempt = c.k, 2, t0.Add(time.Hour+time.Duration(c.i)*time.Second), time.Time{}, 0
		if c.k == retryindex.KindDeadLettered {
			r.Feed, r.Source, r.Entity, r.Reason = retryindex.FeedTailer, "", "orders/$DeadLetterQueue", "RetryMaxAttemptsExceeded"
		}
		changes = append(changes, r)
	}
	require.NoError(t, s.Apply(ctx, changes))
	_, err := s.MarkGone(ctx, "orders", t0.Add(time.Hour), func(chain string) bool { return chain != rs[6].Chain })
	require.NoError(t, err)
	want := map[string]map[retryindex.State]int64{
		billing:   {retryindex.StatePending: 7, retryindex.StateSucceeded: 1, retryindex.StateDeadLettered: 1, retryindex.StateGone: 1},
		"orders":  {retryindex.StatePending: 18, retryindex.StateSucceeded: 1, retryindex.StateDeadLettered: 1},
		"nowhere": {},
	}
	check := func(when string) {
		for source, w := range want {
			c, err := s.Counts(ctx, &retryindex.CountsOptions{Source: source})
			require.NoError(t, err)
			assert.Equal(t, w, c.ByState, "%s: counts of %s", when, source)
			for _, l := range []struct {
				st   retryindex.State
				list func(context.Context, *retryindex.PendingOptions) (*retryindex.PendingPage, error)
			}{{retryindex.StatePending, s.Pending}, {retryindex.StateDeadLettered, s.DeadLettered}} {
				var got []retryindex.Event
				cursor := ""
				for {
					page, err := l.list(ctx, &retryindex.PendingOptions{Source: source, Limit: 4, Cursor: cursor})
					require.NoError(t, err)
					assert.Equal(t, w[l.st], page.Total, "%s: %v total of %s", when, l.st, source)
					got = append(got, page.Items...)
					if page.Next == "" {
						break
					}
					cursor = page.Next
				}
				assert.Len(t, got, int(w[l.st]), "%s: %v of %s", when, l.st, source)
				for i, e := range got {
					assert.Equal(t, source, e.Source)
					assert.Equal(t, l.st, e.State)
					if i > 0 && l.st == retryindex.StatePending {
						assert.False(t, e.Due.Before(got[i-1].Due), "due order")
					}
					if i > 0 && l.st == retryindex.StateDeadLettered {
						assert.False(t, e.Updated.After(got[i-1].Updated), "newest first")
					}
				}
			}
		}
		all, err := s.Counts(ctx, nil)
		require.NoError(t, err)
		assert.Equal(t, map[retryindex.State]int64{retryindex.StatePending: 25, retryindex.StateSucceeded: 2, retryindex.StateDeadLettered: 2,
			retryindex.StateGone: 1}, all.ByState, "%s: every source", when)
	}
	check("after the changes")
	n, err := s.Prune(ctx, t0.Add(2*time.Hour))
	require.NoError(t, err)
	assert.EqualValues(t, 4, n, "the gone copy was marked at the store's clock, after the cut")
	want[billing] = map[retryindex.State]int64{retryindex.StatePending: 7, retryindex.StateGone: 1}
	want["orders"] = map[retryindex.State]int64{retryindex.StatePending: 18}
	for source, w := range want {
		c, err := s.Counts(ctx, &retryindex.CountsOptions{Source: source})
		require.NoError(t, err)
		assert.Equal(t, w, c.ByState, "after the prune: counts of %s", source)
	}
}

// histogram: pending retries counted by due time in buckets, with those before and after the range,
// its first and last due times, by source; the bounds alone without buckets; refusals.
func histogram(t *testing.T, open Open) {
	s := open(t, fixed(t0))
	ctx := context.Background()
	// Due at minute i of the day for i in 0..59 (and an hour back for i%10 == 9): billing for i%4 == 0.
	var rs []retryindex.Record
	wantAll, wantBilling := map[int]int64{}, map[int]int64{}
	for i := range 60 {
		r := Rec(fmt.Sprintf("h-%d", i), int64(i+1), retryindex.KindScheduled, 1, 0)
		r.NextDue = t0.Add(time.Duration(i) * time.Minute)
		if i%10 == 9 {
			r.NextDue = t0.Add(-time.Hour)
		}
		if i%4 == 0 {
			r.Source = billing
		}
		rs = append(rs, r)
	}
	rs = append(rs, Rec("dead", 99, retryindex.KindDeadLettered, 3, 0))
	require.NoError(t, s.Apply(ctx, rs))
	// Buckets of 10 minutes from minute 5 to minute 44: minutes 5-14, 15-24, 25-34, 35-44.
	from, to := t0.Add(5*time.Minute), t0.Add(44*time.Minute)
	var beforeAll, afterAll, beforeBilling, afterBilling int64
	for i, r := range rs[:60] {
		m := int(r.NextDue.Sub(t0) / time.Minute)
		var b *int64
		var bucket = -1
		switch {
		case m < 5:
			b = &beforeAll
		case m > 44:
			b = &afterAll
		default:
			bucket = (m - 5) / 10
		}
		if bucket >= 0 {
			wantAll[bucket]++
			if i%4 == 0 {
				wantBilling[bucket]++
			}
		} else {
			*b++
			if i%4 == 0 && b == &beforeAll {
				beforeBilling++
			} else if i%4 == 0 {
				afterBilling++
			}
		}
	}
	for _, c := range []struct {
		source        string
		want          map[int]int64
		before, after int64
		total         int64
		first, last   time.Duration
	}{
		{"", wantAll, beforeAll, afterAll, 60, 5 * time.Minute, 44 * time.Minute},
		{billing, wantBilling, beforeBilling, afterBilling, 15, 8 * time.Minute, 44 * time.Minute},
	} {
		h, err := s.PendingHistogram(ctx, &retryindex.HistogramOptions{Source: c.source, From: from, To: to, Width: 10 * time.Minute})
		require.NoError(t, err)
		require.Len(t, h.Counts, 4, c.source)
		var sum int64
		for i, n := range h.Counts {
			assert.Equal(t, c.want[i], n, "%q bucket %d", c.source, i)
			sum += n
		}
		assert.Equal(t, c.before, h.Before, c.source)
		assert.Equal(t, c.after, h.After, c.source)
		assert.Equal(t, c.total, h.Total, c.source)
		assert.Equal(t, h.Total, h.Before+sum+h.After, "%q: everything counted once", c.source)
		assert.Equal(t, t0.Add(c.first), h.First, c.source)
		assert.Equal(t, t0.Add(c.last), h.Last, c.source)
		assert.Equal(t, t0, h.AsOf)
	}
	// Without buckets: the bounds and the total only; from the start of time when From is zero.
	h, err := s.PendingHistogram(ctx, &retryindex.HistogramOptions{To: t0.Add(30 * time.Minute)})
	require.NoError(t, err)
	assert.Empty(t, h.Counts)
	assert.Equal(t, t0.Add(-time.Hour), h.First)
	assert.Equal(t, t0.Add(30*time.Minute), h.Last)
	assert.EqualValues(t, 60, h.Total)
	h, err = s.PendingHistogram(ctx, &retryindex.HistogramOptions{From: t0.Add(time.Minute)})
	require.NoError(t, err)
	assert.Equal(t, t0.Add(time.Minute), h.First, "no upper bound when To is zero")
	assert.Equal(t, t0.Add(58*time.Minute), h.Last)
	h, err = s.PendingHistogram(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, t0.Add(-time.Hour), h.First, "nil options: every due time")
	assert.Equal(t, t0.Add(58*time.Minute), h.Last)
	assert.EqualValues(t, 60, h.Total)
	h, err = s.PendingHistogram(ctx, &retryindex.HistogramOptions{Source: "nowhere", From: from, To: to, Width: time.Minute})
	require.NoError(t, err)
	assert.Equal(t, make([]int64, 40), h.Counts)
	assert.True(t, h.First.IsZero())
	assert.Zero(t, h.Total)
	for name, o := range map[string]retryindex.HistogramOptions{
		"negative width":       {From: from, To: to, Width: -time.Minute},
		"part of a ms":         {From: from, To: to, Width: 1500 * time.Microsecond},
		"buckets without From": {To: to, Width: time.Minute},
		"buckets without To":   {From: from, Width: time.Minute},
		"To before From":       {From: to, To: from},
		"too many buckets":     {From: from, To: from.Add(retryindex.MaxHistogramBuckets * time.Millisecond), Width: time.Millisecond},
	} {
		_, err := s.PendingHistogram(ctx, &o)
		assert.ErrorIs(t, err, retryindex.ErrInvalidOptions, name)
	}
}

func fixed(t time.Time) func() time.Time { return func() time.Time { return t } }

// fold: the state each sequence of records leaves, late records of the other feed included.
func fold(t *testing.T, open Open) {
	tailerActive := Rec("a", 1, retryindex.KindActive, 2, 30*time.Minute)
	tailerActive.Feed = retryindex.FeedTailer
	lateTailer := Rec("a", 1, retryindex.KindScheduled, 1, 0)
	lateTailer.Feed, lateTailer.At = retryindex.FeedTailer, t0.Add(3*time.Hour)
	deferred := Rec("a", 1, retryindex.KindDeferred, 1, 0)
	deferred.NextAttempt, deferred.NextDue = 2, t0.Add(time.Hour)
	cases := []struct {
		name        string
		records     []retryindex.Record
		wantState   retryindex.State
		wantAttempt int
		wantHistory []retryindex.Kind
		wantKind    retryindex.Kind
	}{
		{"pending", []retryindex.Record{Rec("a", 1, retryindex.KindScheduled, 1, 0)}, retryindex.StatePending, 2, []retryindex.Kind{retryindex.KindScheduled}, retryindex.KindScheduled},
		{"held by the outage breaker", []retryindex.Record{Rec("a", 1, retryindex.KindScheduled, 1, 0), Rec("a", 1, retryindex.KindHeld, 2, time.Hour)},
			retryindex.StatePending, 2, []retryindex.Kind{retryindex.KindScheduled, retryindex.KindHeld}, retryindex.KindHeld},
		{"held in its session", []retryindex.Record{deferred}, retryindex.StatePending, 2, []retryindex.Kind{retryindex.KindDeferred}, retryindex.KindDeferred},
		{"a session's hold, then its next attempt succeeds", []retryindex.Record{deferred, Rec("a", 1, retryindex.KindSucceeded, 2, time.Hour)},
			retryindex.StateSucceeded, 2, []retryindex.Kind{retryindex.KindDeferred, retryindex.KindSucceeded}, retryindex.KindSucceeded},
		{"succeeded after a retry", []retryindex.Record{Rec("a", 1, retryindex.KindScheduled, 1, 0), Rec("a", 1, retryindex.KindSucceeded, 2, time.Hour)},
			retryindex.StateSucceeded, 2, []retryindex.Kind{retryindex.KindScheduled, retryindex.KindSucceeded}, retryindex.KindSucceeded},
		{"late tailer record changes no state", []retryindex.Record{Rec("a", 1, retryindex.KindScheduled, 1, 0), Rec("a", 1, retryindex.KindSucceeded, 2, time.Hour), lateTailer},
			retryindex.StateSucceeded, 2, []retryindex.Kind{retryindex.KindScheduled, retryindex.KindSucceeded}, retryindex.KindSucceeded},
		{"active once due", []retryindex.Record{Rec("a", 1, retryindex.KindScheduled, 1, 0), tailerActive},
			retryindex.StateActive, 2, []retryindex.Kind{retryindex.KindScheduled, retryindex.KindActive}, retryindex.KindActive},
		{"out of order", []retryindex.Record{Rec("a", 1, retryindex.KindDeadLettered, 3, 3*time.Hour), Rec("a", 1, retryindex.KindScheduled, 2, time.Hour)},
			retryindex.StateDeadLettered, 3, []retryindex.Kind{retryindex.KindScheduled, retryindex.KindDeadLettered}, retryindex.KindDeadLettered},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t, fixed(t0))
			ctx := context.Background()
			for _, r := range tc.records {
				require.NoError(t, s.Apply(ctx, []retryindex.Record{r}))
			}
			ans, err := s.Lookup(ctx, "a", nil)
			require.NoError(t, err)
			require.Len(t, ans.Events, 1)
			e := ans.Events[0]
			assert.Equal(t, tc.wantState, e.State)
			assert.Equal(t, tc.wantAttempt, e.Attempt)
			if tc.wantKind != 0 {
				assert.Equal(t, tc.wantKind, e.Kind, "the kind of record the state is")
			}
			var kinds []retryindex.Kind
			for _, h := range e.History {
				kinds = append(kinds, h.Kind)
			}
			assert.Equal(t, tc.wantHistory, kinds)
		})
	}
}

// lookup: one event by every name, with its history, the redacted and bounded error, and freshness.
func lookup(t *testing.T, open Open) {
	s := open(t, fixed(t0.Add(time.Hour)))
	ctx := context.Background()
	r := Rec("order-42", 7, retryindex.KindScheduled, 1, 0)
	r.Key, r.CorrelationID, r.SequenceNumber, r.Immediate = "key-42", "corr-42", 55, 3
	r.Error = "SharedAccessKey=c2VjcmV0c2VjcmV0 rejected; " + strings.Repeat("x", 2000)
	require.NoError(t, s.Apply(ctx, []retryindex.Record{r, Rec("order-43", 8, retryindex.KindSucceeded, 2, 0)}))
	env := envelope.Envelope{Source: "orders", FirstSequenceNumber: 7, OriginalMessageID: "order-42"}
	for _, id := range []string{"order-42", "key-42", "corr-42", env.RetryMessageID(2), r.Chain} {
		ans, err := s.Lookup(ctx, id, nil)
		require.NoError(t, err)
		require.Len(t, ans.Events, 1, id)
		e := ans.Events[0]
		assert.Equal(t, "order-42", e.OriginalID)
		assert.Equal(t, "key-42", e.Key)
		assert.Equal(t, "corr-42", e.CorrelationID)
		assert.Equal(t, retryindex.StatePending, e.State)
		assert.True(t, t0.Add(time.Hour).Equal(e.Due))
		assert.EqualValues(t, 55, e.SequenceNumber)
		assert.Equal(t, "orders", e.Entity)
		assert.NotContains(t, e.LastError, "c2VjcmV0c2VjcmV0")
		assert.LessOrEqual(t, len(e.LastError), retryindex.DefaultMaxErrorLength)
		assert.Equal(t, env.RetryMessageID(2), e.RetryMessageID())
		require.Len(t, e.History, 1)
		assert.Equal(t, "test/1", e.History[0].Process)
		assert.Equal(t, 3, e.History[0].Immediate, "the attempt's immediate retries")
		assert.Equal(t, 3, e.Immediate, "the last attempt's immediate retries")
		assert.Equal(t, t0.Add(time.Hour), ans.AsOf)
		require.Len(t, ans.Feeds, 1)
		assert.Equal(t, "consumer test/1", ans.Feeds[0].Name)
	}
	ans, err := s.Lookup(ctx, "nobody", nil)
	require.NoError(t, err)
	assert.Empty(t, ans.Events)

	// New events stored together (a store may insert them in bulk) are stored as one alone is.
	var run []retryindex.Record
	for i := range 5 {
		r := Rec(fmt.Sprintf("bulk-%d", i), int64(100+i), retryindex.KindScheduled, 1, 0)
		r.Key, r.CorrelationID, r.SequenceNumber, r.Immediate = fmt.Sprintf("bulk-key-%d", i), fmt.Sprintf("bulk-corr-%d", i), int64(200+i), i
		r.Error = "SharedAccessKey=c2VjcmV0c2VjcmV0 rejected; " + strings.Repeat("y", 2000)
		run = append(run, r)
	}
	require.NoError(t, s.Apply(ctx, run))
	for i := range 5 {
		ans, err := s.Lookup(ctx, fmt.Sprintf("bulk-corr-%d", i), nil)
		require.NoError(t, err)
		require.Len(t, ans.Events, 1)
		e := ans.Events[0]
		assert.Equal(t, fmt.Sprintf("bulk-key-%d", i), e.Key)
		assert.EqualValues(t, 200+i, e.SequenceNumber)
		assert.Equal(t, i, e.Immediate)
		assert.Equal(t, retryindex.KindScheduled, e.Kind)
		assert.NotContains(t, e.LastError, "c2VjcmV0c2VjcmV0")
		assert.LessOrEqual(t, len(e.LastError), retryindex.DefaultMaxErrorLength)
		require.Len(t, e.History, 1)
		assert.Equal(t, "test/1", e.History[0].Process)
	}
}

// pending: pages in due order, no item twice, the exact total; by source.
func pending(t *testing.T, open Open) {
	s := open(t, fixed(t0))
	ctx := context.Background()
	const n = 13
	var rs []retryindex.Record
	for i := range n {
		r := Rec(fmt.Sprintf("m-%d", i), int64(i+1), retryindex.KindScheduled, 1, 0)
		r.NextDue = t0.Add(time.Duration((i*5)%n) * time.Minute)
		if i%4 == 0 {
			r.NextDue = t0.Add(2 * time.Minute)
		}
		if i == 3 {
			r.Source = "events/Subscriptions/billing"
		}
		rs = append(rs, r)
	}
	rs = append(rs, Rec("done", 99, retryindex.KindSucceeded, 2, 0))
	require.NoError(t, s.Apply(ctx, rs))
	seen := map[string]bool{}
	var last time.Time
	cursor := ""
	for {
		page, err := s.Pending(ctx, &retryindex.PendingOptions{Limit: 3, Cursor: cursor})
		require.NoError(t, err)
		assert.EqualValues(t, n, page.Total)
		for _, e := range page.Items {
			assert.False(t, e.Due.Before(last), "due order")
			last = e.Due
			assert.False(t, seen[e.Chain])
			seen[e.Chain] = true
		}
		if page.Next == "" {
			break
		}
		cursor = page.Next
	}
	assert.Len(t, seen, n)
	page, err := s.Pending(ctx, &retryindex.PendingOptions{Source: "events/Subscriptions/billing"})
	require.NoError(t, err)
	require.Len(t, page.Items, 1)
	assert.Equal(t, "m-3", page.Items[0].OriginalID)
	assert.EqualValues(t, 1, page.Total)
}

// countsAndPrune: exact counts through changes and a prune of finished events only, with history.
func countsAndPrune(t *testing.T, open Open) {
	s := open(t, fixed(t0.Add(24*time.Hour)))
	ctx := context.Background()
	require.NoError(t, s.Apply(ctx, []retryindex.Record{
		Rec("old-ok", 1, retryindex.KindScheduled, 1, 0),
		Rec("old-ok", 1, retryindex.KindSucceeded, 2, time.Minute),
		Rec("old-dead", 2, retryindex.KindDeadLettered, 3, 0),
		Rec("old-pending", 3, retryindex.KindScheduled, 1, 0),
		Rec("new-ok", 4, retryindex.KindSucceeded, 2, 10*time.Hour),
	}))
	c, err := s.Counts(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, map[retryindex.State]int64{retryindex.StateSucceeded: 2, retryindex.StateDeadLettered: 1, retryindex.StatePending: 1}, c.ByState)
	assert.Equal(t, t0.Add(24*time.Hour), c.AsOf)
	n, err := s.Prune(ctx, t0.Add(time.Hour))
	require.NoError(t, err)
	assert.EqualValues(t, 2, n)
	c, err = s.Counts(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, map[retryindex.State]int64{retryindex.StateSucceeded: 1, retryindex.StatePending: 1}, c.ByState)
	for id, want := range map[string]int{"old-ok": 0, "old-dead": 0, "old-pending": 1, "new-ok": 1} {
		ans, err := s.Lookup(ctx, id, nil)
		require.NoError(t, err)
		assert.Len(t, ans.Events, want, id)
	}
}

// cursorAndGone: the tailer's cursor with its records in one write, and the marking of gone copies.
func cursorAndGone(t *testing.T, open Open) {
	s := open(t, fixed(t0.Add(time.Hour)))
	ctx := context.Background()
	next, err := s.Cursor(ctx, "orders")
	require.NoError(t, err)
	assert.Zero(t, next)
	seenCopy := Rec("seen", 1, retryindex.KindScheduled, 1, 0)
	seenCopy.Feed = retryindex.FeedTailer
	goneCopy := Rec("gone", 2, retryindex.KindScheduled, 1, 0)
	require.NoError(t, s.SetCursor(ctx, "orders", 42, []retryindex.Record{seenCopy}))
	require.NoError(t, s.Apply(ctx, []retryindex.Record{goneCopy}))
	recent := Rec("recent", 3, retryindex.KindScheduled, 1, 2*time.Hour) // changed after the rebuild began
	require.NoError(t, s.Apply(ctx, []retryindex.Record{recent}))
	next, err = s.Cursor(ctx, "orders")
	require.NoError(t, err)
	assert.EqualValues(t, 42, next)
	n, err := s.MarkGone(ctx, "orders", t0.Add(time.Hour), func(chain string) bool { return chain == seenCopy.Chain })
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)
	for id, want := range map[string]retryindex.State{"seen": retryindex.StatePending, "gone": retryindex.StateGone, "recent": retryindex.StatePending} {
		ans, err := s.Lookup(ctx, id, nil)
		require.NoError(t, err)
		require.Len(t, ans.Events, 1, id)
		assert.Equal(t, want, ans.Events[0].State, id)
	}
	c, err := s.Counts(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, map[retryindex.State]int64{retryindex.StatePending: 2, retryindex.StateGone: 1}, c.ByState)
	f, err := s.Freshness(ctx)
	require.NoError(t, err)
	var names []string
	for _, fd := range f.Feeds {
		names = append(names, fd.Name)
	}
	assert.Equal(t, []string{"consumer test/1", "tailer orders"}, names)
}

// refusals: invalid records, options and cursors are errors, and a refused batch writes nothing.
func refusals(t *testing.T, open Open) {
	s := open(t, fixed(t0))
	ctx := context.Background()
	err := s.Apply(ctx, []retryindex.Record{Rec("good", 1, retryindex.KindSucceeded, 2, 0), {Chain: "nope", Kind: retryindex.KindSucceeded, At: t0}})
	assert.ErrorIs(t, err, retryindex.ErrInvalidRecord)
	ans, err := s.Lookup(ctx, "good", nil)
	require.NoError(t, err)
	assert.Empty(t, ans.Events)
	_, err = s.Pending(ctx, &retryindex.PendingOptions{Cursor: "x"})
	assert.ErrorIs(t, err, retryindex.ErrInvalidCursor)
	_, err = s.Pending(ctx, &retryindex.PendingOptions{Limit: -1})
	assert.ErrorIs(t, err, retryindex.ErrInvalidOptions)
	_, err = s.Lookup(ctx, "x", &retryindex.LookupOptions{MaxHistory: -1})
	assert.ErrorIs(t, err, retryindex.ErrInvalidOptions)
}

// concurrent: writers racing on the same events lose no record and keep the counts exact.
func concurrent(t *testing.T, open Open) {
	s := open(t, fixed(t0))
	ctx := context.Background()
	const writers, events = 4, 40
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var rs []retryindex.Record
			for i := range events {
				r := Rec(fmt.Sprintf("e-%d", (i+w*7)%events), int64((i+w*7)%events+1), retryindex.KindScheduled, w+1, time.Duration(w)*time.Second)
				r.Process = fmt.Sprintf("writer-%d", w)
				rs = append(rs, r)
			}
			errs <- s.Apply(ctx, rs)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	c, err := s.Counts(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, map[retryindex.State]int64{retryindex.StatePending: events}, c.ByState)
	ans, err := s.Lookup(ctx, "e-0", nil)
	require.NoError(t, err)
	require.Len(t, ans.Events, 1)
	assert.Len(t, ans.Events[0].History, writers, "one entry per writer's attempt")
	assert.Equal(t, writers+1, ans.Events[0].Attempt, "the highest attempt wins")
}

// batches: one Apply of many records, in batches of any size, leaves every event as applying its
// records one at a time does: state, attempt, due, history and counts. The mix has what a store may
// store in bulk (first attempts of new events, more than 64 of them in a row) between what it must
// not reorder around (a first attempt's record of a chain seen earlier in the batch, later attempts,
// the tailer's records, events that exist before the batch).
func batches(t *testing.T, open Open) {
	rng := rand.New(rand.NewPCG(7, 33))
	kinds := []retryindex.Kind{retryindex.KindScheduled, retryindex.KindSucceeded, retryindex.KindDeadLettered,
		retryindex.KindHeld, retryindex.KindLeftForRedelivery, retryindex.KindDiscarded, retryindex.KindActive}
	var before, records []retryindex.Record
	for i := range 20 { // events that exist before the batch
		before = append(before, Rec(fmt.Sprintf("old-%d", i), int64(1000+i), retryindex.KindScheduled, 1, 0))
	}
	for i := range 150 { // a run of new events longer than any multi-row statement
		records = append(records, Rec(fmt.Sprintf("new-%d", i), int64(i+1), retryindex.KindScheduled, 1, time.Duration(i)*time.Second))
	}
	for i := range 400 {
		n := rng.IntN(200) // new-150 and later first appear here
		id, seq := fmt.Sprintf("new-%d", n), int64(n+1)
		if rng.IntN(3) == 0 {
			n = rng.IntN(20)
			id, seq = fmt.Sprintf("old-%d", n), int64(1000+n)
		}
		r := Rec(id, seq, kinds[rng.IntN(len(kinds))], 1+rng.IntN(3), time.Duration(i)*time.Second)
		if r.Kind == retryindex.KindActive || rng.IntN(5) == 0 {
			r.Feed = retryindex.FeedTailer
		}
		records = append(records, r)
	}
	ctx := context.Background()
	fill := func(size int) retryindex.Store {
		s := open(t, fixed(t0))
		require.NoError(t, s.Apply(ctx, before))
		for rest := records; len(rest) > 0; {
			n := min(size, len(rest))
			require.NoError(t, s.Apply(ctx, rest[:n]))
			rest = rest[n:]
		}
		return s
	}
	read := func(s retryindex.Store) (map[retryindex.State]int64, []retryindex.Event) {
		c, err := s.Counts(ctx, nil)
		require.NoError(t, err)
		var events []retryindex.Event
		for i := range 200 {
			for _, id := range []string{fmt.Sprintf("new-%d", i), fmt.Sprintf("old-%d", i)} {
				ans, err := s.Lookup(ctx, id, nil)
				require.NoError(t, err)
				events = append(events, ans.Events...)
			}
		}
		return c.ByState, events
	}
	wantCounts, want := read(fill(1))
	ids := map[string]bool{}
	for _, r := range append(before, records...) {
		ids[r.OriginalID] = true
	}
	require.Equal(t, len(ids), len(want), "every event found once")
	byState := map[retryindex.State]int64{}
	for _, e := range want {
		byState[e.State]++
	}
	assert.Equal(t, byState, wantCounts, "the counts are the events' states")
	for _, size := range []int{7, 100, len(records)} {
		gotCounts, got := read(fill(size))
		assert.Equal(t, wantCounts, gotCounts, "batches of %d", size)
		assert.Equal(t, want, got, "batches of %d", size)
	}
}

// lost: a feed's noted losses add up, show in every answer's freshness with when, and are cleared by
// a rebuild that started after them, not before.
func lost(t *testing.T, open Open) {
	s := open(t, fixed(t0))
	ctx := context.Background()
	require.NoError(t, s.Apply(ctx, []retryindex.Record{Rec("a", 1, retryindex.KindScheduled, 1, 0)}))
	require.NoError(t, s.NoteLost(ctx, "consumer test/1", 3))
	require.NoError(t, s.NoteLost(ctx, "consumer test/1", 2))
	ans, err := s.Lookup(ctx, "a", nil)
	require.NoError(t, err)
	require.Len(t, ans.Feeds, 1)
	assert.EqualValues(t, 5, ans.Feeds[0].Lost)
	assert.Equal(t, t0, ans.Feeds[0].LostAt)
	require.NoError(t, s.ClearLost(ctx, t0), "a rebuild that started with the loss")
	page, err := s.Pending(ctx, nil)
	require.NoError(t, err)
	assert.EqualValues(t, 5, page.Feeds[0].Lost, "not repaired by a rebuild that started before it was noted")
	require.NoError(t, s.ClearLost(ctx, t0.Add(time.Millisecond)))
	c, err := s.Counts(ctx, nil)
	require.NoError(t, err)
	assert.Zero(t, c.Feeds[0].Lost)
	assert.True(t, c.Feeds[0].LostAt.IsZero())
}

// deadLettered: pages of dead-lettered events, newest first (ties by insertion, newest first), no item
// twice, only dead-lettered ones, the exact total; by source; a bad cursor refused.
func deadLettered(t *testing.T, open Open) {
	s := open(t, fixed(t0))
	ctx := context.Background()
	const n = 11
	var rs []retryindex.Record
	for i := range n {
		r := Rec(fmt.Sprintf("d-%d", i), int64(i+1), retryindex.KindDeadLettered, 3, time.Duration((i*7)%n)*time.Minute)
		r.Reason, r.Entity = "RetryMaxAttemptsExceeded", "orders/$DeadLetterQueue"
		if i%3 == 0 {
			r.At = t0.Add(30 * time.Second) // ties
		}
		if i == 4 {
			r.Source = "events/Subscriptions/billing"
		}
		rs = append(rs, r)
	}
	rs = append(rs, Rec("p", 99, retryindex.KindScheduled, 1, 0), Rec("ok", 98, retryindex.KindSucceeded, 2, time.Hour))
	require.NoError(t, s.Apply(ctx, rs))
	seen := map[string]bool{}
	last := t0.Add(24 * time.Hour)
	cursor := ""
	for {
		page, err := s.DeadLettered(ctx, &retryindex.PendingOptions{Limit: 4, Cursor: cursor})
		require.NoError(t, err)
		assert.EqualValues(t, n, page.Total)
		for _, e := range page.Items {
			assert.Equal(t, retryindex.StateDeadLettered, e.State)
			assert.Equal(t, "RetryMaxAttemptsExceeded", e.Reason)
			assert.False(t, e.Updated.After(last), "newest first")
			last = e.Updated
			assert.False(t, seen[e.Chain], "no item twice")
			seen[e.Chain] = true
		}
		if page.Next == "" {
			break
		}
		cursor = page.Next
	}
	assert.Len(t, seen, n)
	page, err := s.DeadLettered(ctx, &retryindex.PendingOptions{Source: "events/Subscriptions/billing"})
	require.NoError(t, err)
	require.Len(t, page.Items, 1)
	assert.Equal(t, "d-4", page.Items[0].OriginalID)
	assert.EqualValues(t, 1, page.Total)
	_, err = s.DeadLettered(ctx, &retryindex.PendingOptions{Cursor: "x"})
	assert.ErrorIs(t, err, retryindex.ErrInvalidCursor)
}
