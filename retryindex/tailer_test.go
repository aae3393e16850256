package retryindex

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/internal/sbtest"
)

// TestTailerIndexesWhatTheBrokerHolds seeds the emulator with a consumer that records nothing (a
// pending retry, a permanent failure, a failure at the last attempt), then polls: the index answers
// for all three as the broker holds them; a second poll resumes after the last sequence number read
// and reads nothing again.
func TestTailerIndexesWhatTheBrokerHolds(t *testing.T) {
	t.Parallel()
	for _, layout := range []struct {
		name  string
		start func(testing.TB) *sbtest.Harness
	}{{"queue", sbtest.New}, {"subscription with a retry queue", sbtest.NewSubscription}} {
		t.Run(layout.name, func(t *testing.T) {
			t.Parallel()
			h := layout.start(t)
			ps := h.Seed(t, "pending-1", "perm-1", "max-1")
			pending, ok := sbtest.Result(ps, "pending-1", retry.OutcomeRetryScheduled)
			require.True(t, ok)
			s, _ := openTemp(t, nil)
			tl, err := NewTailer(h.Client, s, h.Entity, &TailerOptions{RetryQueue: h.RetryQueue, PeekBatchSize: 2})
			require.NoError(t, err)
			ctx := sbtest.Context(t)
			res, err := tl.Poll(ctx)
			require.NoError(t, err)
			assert.Equal(t, 3, res.Recorded, "%+v", res)

			ans, err := s.Lookup(ctx, "pending-1", nil)
			require.NoError(t, err)
			require.Len(t, ans.Events, 1)
			e := ans.Events[0]
			assert.Equal(t, StatePending, e.State)
			assert.Equal(t, 2, e.Attempt)
			assert.True(t, pending.ScheduledFor.Truncate(time.Millisecond).Equal(e.Due), "index %v, consumer %v", e.Due, pending.ScheduledFor)
			assert.Equal(t, pending.SequenceNumber, e.SequenceNumber)
			assert.Equal(t, sbtest.ErrDownstream.Error(), e.LastError)
			assert.Equal(t, FeedTailer, e.Feed)
			assert.Equal(t, pending.RetryMessageID, e.RetryMessageID(), "the tailer names the chain as the consumer does")

			for id, attempt := range map[string]int{"perm-1": 1, "max-1": 2} {
				ans, err := s.Lookup(ctx, "corr-"+id, nil)
				require.NoError(t, err)
				require.Len(t, ans.Events, 1, id)
				assert.Equal(t, StateDeadLettered, ans.Events[0].State, id)
				assert.Equal(t, attempt, ans.Events[0].Attempt, id)
				assert.NotEmpty(t, ans.Events[0].Reason, id)
			}
			require.Len(t, ans.Feeds, len(tl.Entities()), "one feed per entity read")

			again, err := tl.Poll(ctx)
			require.NoError(t, err)
			for _, e := range tl.Entities() {
				assert.Zero(t, again.Peeked[e], "%s read again", e)
			}
		})
	}
}

// TestTailerRebuildMarksGoneCopies cancels one of two pending copies behind the index's back, then
// rebuilds from a fresh cursor: the cancelled one is gone, the other still pending, and an event a
// feed changed after the rebuild started is left alone.
func TestTailerRebuildMarksGoneCopies(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	ps := h.Seed(t, "pending-1", "pending-2")
	cancelled, ok := sbtest.Result(ps, "pending-2", retry.OutcomeRetryScheduled)
	require.True(t, ok)
	s, _ := openTemp(t, nil)
	start := time.Now()
	tl, err := NewTailer(h.Client, s, h.Entity, &TailerOptions{Now: func() time.Time { return start }})
	require.NoError(t, err)
	ctx := sbtest.Context(t)
	_, err = tl.Poll(ctx)
	require.NoError(t, err)
	late := rec("late", 99, KindScheduled, 1, 0)
	late.At, late.Entity = start.Add(time.Second), sbtest.Queue // recorded while the rebuild runs
	require.NoError(t, s.Apply(ctx, []Record{late}))

	sender, err := h.Client.NewSender(sbtest.Queue, nil)
	require.NoError(t, err)
	require.NoError(t, sender.CancelScheduledMessages(ctx, []int64{cancelled.SequenceNumber}, nil))
	require.NoError(t, sender.Close(ctx))

	res, err := tl.Rebuild(ctx)
	require.NoError(t, err)
	if !assert.EqualValues(t, 1, res.Gone, "%+v", res) {
		for _, id := range []string{"pending-1", "pending-2"} {
			ans, _ := s.Lookup(ctx, id, nil)
			t.Logf("%s: %+v (start %v)", id, ans.Events, start)
		}
	}
	for id, want := range map[string]State{"pending-1": StatePending, "pending-2": StateGone, "late": StatePending} {
		ans, err := s.Lookup(ctx, id, nil)
		require.NoError(t, err)
		require.Len(t, ans.Events, 1, id)
		assert.Equal(t, want, ans.Events[0].State, id)
	}
	c, err := s.Counts(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, map[State]int64{StatePending: 2, StateGone: 1}, c.ByState, "counts follow the marks")
	ans, err := s.Lookup(ctx, "pending-2", nil)
	require.NoError(t, err)
	h2 := ans.Events[0].History
	assert.Equal(t, KindGone, h2[len(h2)-1].Kind)
}

// TestNewTailerRefusesInvalidOptions returns errors, never panics.
func TestNewTailerRefusesInvalidOptions(t *testing.T) {
	t.Parallel()
	s, _ := openTemp(t, nil)
	cases := map[string]struct {
		entity string
		opts   *TailerOptions
	}{
		"empty entity":                     {"", nil},
		"a dead-letter queue":              {"orders/$DeadLetterQueue", nil},
		"subscription without retry queue": {"t/Subscriptions/s", nil},
		"retry queue not a queue":          {"t/Subscriptions/s", &TailerOptions{RetryQueue: "a/b"}},
		"negative batch":                   {"orders", &TailerOptions{PeekBatchSize: -1}},
	}
	for name, tc := range cases {
		_, err := newTailer(s, tc.entity, tc.opts, nil)
		assert.ErrorIs(t, err, ErrInvalidOptions, name)
	}
	_, err := newTailer(nil, "orders", nil, nil)
	assert.ErrorIs(t, err, ErrInvalidOptions)
	_, err = NewTailer(nil, s, "orders", nil)
	assert.ErrorIs(t, err, ErrInvalidOptions)
	tl, err := newTailer(s, "t/Subscriptions/s", &TailerOptions{RetryQueue: "rq"}, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"rq", "t/Subscriptions/s/$DeadLetterQueue", "rq/$DeadLetterQueue"}, tl.Entities())
}

// TestTailerAndRecorderAgree: with both feeds on, a pending retry is one event with one history entry
// per attempt, whichever feed wrote first.
func TestTailerAndRecorderAgree(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	s, _ := openTemp(t, nil)
	r, err := NewRecorder(s, nil)
	require.NoError(t, err)
	h.Send(t, sbtest.Message("order-1"))
	runConsumer(t, h, func(context.Context, *azservicebus.ReceivedMessage) error { return sbtest.ErrDownstream },
		retry.Options{Backoff: backoff.Constant{Interval: time.Hour}, Hooks: r.Hooks(retry.Hooks{})},
		func(ps []retry.ProcessedParams) bool { return len(ps) >= 1 })
	require.NoError(t, r.Close(context.Background()))
	tl, err := NewTailer(h.Client, s, h.Entity, nil)
	require.NoError(t, err)
	ctx := sbtest.Context(t)
	_, err = tl.Poll(ctx)
	require.NoError(t, err)
	ans, err := s.Lookup(ctx, "order-1", nil)
	require.NoError(t, err)
	require.Len(t, ans.Events, 1)
	assert.Len(t, ans.Events[0].History, 1, "%+v", ans.Events[0].History)
	assert.Equal(t, StatePending, ans.Events[0].State)
}

// emptyPeeker is an entity with nothing in it.
type emptyPeeker struct{}

func (emptyPeeker) PeekMessages(context.Context, int, *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	return nil, nil
}
func (emptyPeeker) Close(context.Context) error { return nil }

// TestTailerRebuildClearsLosses: a rebuild clears the losses feeds noted before it started (it read
// the broker again), and keeps one noted while it ran.
func TestTailerRebuildClearsLosses(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	now := t0
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	s, _ := openTemp(t, &SQLiteOptions{Now: clock})
	ctx := context.Background()
	require.NoError(t, s.NoteLost(ctx, "consumer a/1", 5))
	tl, err := newTailer(s, "orders", &TailerOptions{Now: func() time.Time { return t0.Add(time.Minute) }},
		func(string) (peeker, error) { return emptyPeeker{}, nil })
	require.NoError(t, err)
	mu.Lock()
	now = t0.Add(2 * time.Minute) // noted after the rebuild started
	mu.Unlock()
	require.NoError(t, s.NoteLost(ctx, "consumer b/1", 2))
	_, err = tl.Rebuild(ctx)
	require.NoError(t, err)
	f, err := s.Freshness(ctx)
	require.NoError(t, err)
	lost := map[string]int64{}
	for _, fd := range f.Feeds {
		lost[fd.Name] = fd.Lost
	}
	assert.Equal(t, int64(0), lost["consumer a/1"], "repaired by the rebuild")
	assert.Equal(t, int64(2), lost["consumer b/1"], "noted after the rebuild started: kept")
}
