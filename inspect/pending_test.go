package inspect

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/sbtest"
)

// seedPending sends n messages "job-<i>" whose first attempt fails with a delay chosen so that due
// order differs from sequence order, and waits until every retry is scheduled.
func seedPending(tb testing.TB, h *harness, n int) []retry.Result {
	tb.Helper()
	msgs := make([]*azservicebus.Message, n)
	for i := range msgs {
		msgs[i] = sbtest.Message("job-" + strconv.Itoa(i))
	}
	h.Send(tb, msgs...)
	c := h.StartConsumer(tb, func(_ context.Context, m *azservicebus.ReceivedMessage) error {
		i, _ := strconv.Atoi(m.MessageID[len("job-"):])
		// (i*7) mod n is a permutation of 0..n-1 for n not divisible by 7: due order != send order.
		return retry.RetryAfter(time.Hour+time.Duration((i*7)%n)*time.Minute, errBoom)
	}, retry.Options{MaxConcurrency: 32})
	c.Out.WaitFor(tb, "every retry scheduled", func(ps []retry.ProcessedParams) bool {
		return sbtest.CountOutcome(ps, retry.OutcomeRetryScheduled) >= n
	})
	c.Stop()
	var out []retry.Result
	for _, p := range c.Out.Snapshot() {
		if p.Result.Outcome == retry.OutcomeRetryScheduled {
			out = append(out, p.Result)
		}
	}
	require.Len(tb, out, n, "each message was scheduled exactly once")
	return out
}

func TestListPendingPagesByDueTime(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const n = 25
	results := seedPending(t, h, n)
	slices.SortFunc(results, func(a, b retry.Result) int { return a.ScheduledFor.Compare(b.ScheduledFor) })
	in := h.inspector(t, &Options{PeekBatchSize: 6})
	ctx := sbtest.Context(t)

	for _, limit := range []int{1, 7, 25, 100} {
		t.Run(fmt.Sprintf("limit %d", limit), func(t *testing.T) {
			var got []Pending
			cursor := ""
			pages := 0
			for {
				page, err := in.ListPending(ctx, PageOptions{Limit: limit, Cursor: cursor})
				require.NoError(t, err)
				require.LessOrEqual(t, len(page.Items), limit)
				assert.False(t, page.Truncated())
				got = append(got, page.Items...)
				pages++
				if page.Next == "" {
					break
				}
				cursor = page.Next
				require.LessOrEqual(t, pages, n+1, "paging must end")
			}
			assert.Equal(t, (n+limit-1)/limit, pages)
			require.Len(t, got, n)
			for i, p := range got {
				assert.Equal(t, results[i].SequenceNumber, p.SequenceNumber, "item %d in due order", i)
				assert.Equal(t, results[i].RetryMessageID, p.MessageID)
				assert.WithinDuration(t, results[i].ScheduledFor, p.DueTime, time.Millisecond)
				assert.Equal(t, 2, p.Attempt)
			}
		})
	}

	page, err := in.ListPending(ctx, PageOptions{})
	require.NoError(t, err)
	assert.Len(t, page.Items, n, "the default limit (100) holds them all")
	require.Len(t, page.Scans, 1)
	assert.Equal(t, Scan{Entity: sbtest.Queue, Peeked: n, Requests: 6}, page.Scans[0], "5 full batches of 6, then the empty reply")

	_, err = in.ListPending(ctx, PageOptions{Cursor: "not-a-cursor"})
	assert.ErrorIs(t, err, ErrInvalidCursor)
	_, err = in.ListPending(ctx, PageOptions{Limit: -1})
	assert.ErrorIs(t, err, ErrInvalidOptions)
}

func TestListPendingBoundedRead(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const n = 12
	seedPending(t, h, n)
	ctx := sbtest.Context(t)
	cases := []struct {
		name            string
		maxPeek, batch  int
		peeked, reqs    int
		truncated       bool
		itemsAtMostSeen int
	}{
		{name: "bound below the entity", maxPeek: 5, batch: 2, peeked: 5, reqs: 3, truncated: true, itemsAtMostSeen: 5},
		{name: "bound equal to the entity", maxPeek: n, batch: 5, peeked: n, reqs: 3, truncated: true, itemsAtMostSeen: n},
		{name: "bound above the entity", maxPeek: n + 1, batch: 5, peeked: n, reqs: 4, truncated: false, itemsAtMostSeen: n},
		{name: "batch larger than bound", maxPeek: 3, batch: 50, peeked: 3, reqs: 1, truncated: true, itemsAtMostSeen: 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := h.inspector(t, &Options{MaxPeek: tc.maxPeek, PeekBatchSize: tc.batch})
			page, err := in.ListPending(ctx, PageOptions{Limit: 100})
			require.NoError(t, err)
			require.Len(t, page.Scans, 1)
			assert.Equal(t, Scan{Entity: sbtest.Queue, Peeked: tc.peeked, Requests: tc.reqs, Truncated: tc.truncated}, page.Scans[0])
			assert.Equal(t, tc.truncated, page.Truncated())
			assert.Len(t, page.Items, tc.itemsAtMostSeen)
			st, err := in.Status(ctx, "job-0")
			require.NoError(t, err)
			assert.Equal(t, tc.truncated, st.Truncated())
			assert.LessOrEqual(t, st.Scans[0].Peeked, tc.maxPeek)
		})
	}
}

// TestListPendingPagesPastYear2262: retries due after 2262 (any producer can schedule one carrying
// sbretry-attempt) page one by one, each once, in due order: the cursor of a page ending on one used
// to overflow its Unix nanoseconds and name a time in the past, so the next page began again.
func TestListPendingPagesPastYear2262(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := sbtest.Context(t)
	s, err := h.Client.NewSender(sbtest.Queue, nil)
	require.NoError(t, err)
	defer func() { _ = s.Close(ctx) }()
	var want []string
	for i, year := range []int{9000, 3000, 2263} {
		id := "far-" + strconv.Itoa(i)
		m := &azservicebus.Message{MessageID: &id, Body: []byte("x"), ApplicationProperties: map[string]any{envelope.PropAttempt: int64(2)}}
		_, err := s.ScheduleMessages(ctx, []*azservicebus.Message{m}, time.Date(year, 1, 1, 0, 0, 0, 0, time.UTC), nil)
		require.NoError(t, err)
		want = append([]string{id}, want...) // due order is the reverse of send order
	}
	in := h.inspector(t, nil)
	var got []string
	cursor := ""
	for range 10 {
		page, err := in.ListPending(ctx, PageOptions{Limit: 1, Cursor: cursor})
		require.NoError(t, err)
		for _, p := range page.Items {
			got = append(got, p.MessageID)
		}
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	assert.Equal(t, want, got)
}

// TestListPendingFilter lists, through the real SDK, only the pending retries that pass a filter: by
// last error, by application property, by due time and by body text, each alone and together.
func TestListPendingFilter(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var msgs []*azservicebus.Message
	for i := range 6 {
		m := sbtest.Message("job-" + strconv.Itoa(i))
		m.Body = []byte(`{"customer":"` + []string{"ACME", "Globex"}[i%2] + `"}`)
		m.ApplicationProperties = map[string]any{"tenant": []string{"north", "south", "east"}[i%3]}
		msgs = append(msgs, m)
	}
	h.Send(t, msgs...)
	start := time.Now()
	c := h.StartConsumer(t, func(_ context.Context, m *azservicebus.ReceivedMessage) error {
		i, _ := strconv.Atoi(m.MessageID[len("job-"):])
		err := errBoom
		if i >= 4 {
			err = fmt.Errorf("ledger timeout for job %d", i)
		}
		return retry.RetryAfter(time.Duration(i+1)*time.Hour, err)
	}, retry.Options{})
	c.Out.WaitFor(t, "every retry scheduled", func(ps []retry.ProcessedParams) bool {
		return sbtest.CountOutcome(ps, retry.OutcomeRetryScheduled) >= 6
	})
	c.Stop()
	in := h.inspector(t, nil)
	ctx := sbtest.Context(t)
	cases := []struct {
		name string
		f    PendingFilter
		want []string
	}{
		{"none", PendingFilter{}, []string{"job-0", "job-1", "job-2", "job-3", "job-4", "job-5"}},
		{"last error", PendingFilter{Contains: "LEDGER"}, []string{"job-4", "job-5"}},
		{"property", PendingFilter{Property: PropertyFilter{Name: "tenant", Value: "north"}}, []string{"job-0", "job-3"}},
		{"due from", PendingFilter{Since: start.Add(4*time.Hour + 30*time.Minute)}, []string{"job-4", "job-5"}},
		{"due before", PendingFilter{Until: start.Add(2*time.Hour + 30*time.Minute)}, []string{"job-0", "job-1"}},
		{"body", PendingFilter{Body: "globex"}, []string{"job-1", "job-3", "job-5"}},
		{"all together", PendingFilter{Body: "acme", Property: PropertyFilter{Name: "tenant", Value: "east"}, Contains: "ledger"}, nil},
		{"together, one left", PendingFilter{Body: "acme", Contains: "ledger"}, []string{"job-4"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			page, err := in.ListPending(ctx, PageOptions{Filter: tc.f})
			require.NoError(t, err)
			var got []string
			for _, p := range page.Items {
				got = append(got, p.Envelope.OriginalMessageID)
			}
			if len(tc.want) == 0 {
				assert.Empty(t, got)
				return
			}
			assert.Equal(t, tc.want, got)
		})
	}
}
