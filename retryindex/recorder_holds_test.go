package retryindex

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
)

// The holds of the outage breaker and of a session's durable holds are recorded as what they are
// (found by a review): a follower set aside behind a hold is no retry state; a durable hold is pending
// for its next attempt, at its due time; a first attempt held and then successful ends succeeded; a
// hold after the tailer saw the copy active shows as held. A durable hold and the outage breaker's
// hold are told apart (Event.Kind).
func TestRecorderHolds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	record := func(t *testing.T, ps ...retry.ProcessedParams) *SQLite {
		t.Helper()
		s, _ := openTemp(t, nil)
		r, err := NewRecorder(s, &RecorderOptions{Process: "p", Now: fixedClock(t0)})
		require.NoError(t, err)
		h := r.Hooks(retry.Hooks{})
		for _, p := range ps {
			h.OnProcessed(p)
		}
		require.NoError(t, r.Close(ctx))
		return s
	}
	t.Run("a follower deferred behind a hold, then completed", func(t *testing.T) {
		s := record(t,
			processed("follower-1", 1, retry.Result{Outcome: retry.OutcomeDeferred}),
			processed("follower-1", 1, retry.Result{Outcome: retry.OutcomeCompleted}))
		ans, err := s.Lookup(ctx, "follower-1", nil)
		require.NoError(t, err)
		assert.Empty(t, ans.Events, "no retry state: nothing recorded")
		page, err := s.Pending(ctx, nil)
		require.NoError(t, err)
		assert.Zero(t, page.Total)
	})
	t.Run("a durable hold", func(t *testing.T) {
		due := t0.Add(time.Hour)
		s := record(t, processed("order-7", 2, retry.Result{Outcome: retry.OutcomeDeferred, HandlerErr: errors.New("boom"), ScheduledFor: due}))
		ans, err := s.Lookup(ctx, "order-7", nil)
		require.NoError(t, err)
		require.Len(t, ans.Events, 1)
		e := ans.Events[0]
		assert.Equal(t, StatePending, e.State)
		assert.Equal(t, KindDeferred, e.Kind, "a session's durable hold, not the outage breaker's")
		require.Len(t, e.History, 1)
		assert.Equal(t, KindDeferred, e.History[0].Kind)
		assert.Equal(t, "orders", e.Entity, "deferred in the session entity")
		assert.Equal(t, 3, e.Attempt, "the hold resumes as attempt 3")
		assert.True(t, due.Equal(e.Due), "due %v", e.Due)
		page, err := s.Pending(ctx, nil)
		require.NoError(t, err)
		assert.Len(t, page.Items, 1)
		assert.Equal(t, int64(1), page.Total)
	})
	t.Run("the outage breaker's hold", func(t *testing.T) {
		s := record(t, processed("order-8", 2, retry.Result{Outcome: retry.OutcomeHeld, ScheduledFor: t0.Add(time.Minute)}))
		ans, err := s.Lookup(ctx, "order-8", nil)
		require.NoError(t, err)
		require.Len(t, ans.Events, 1)
		assert.Equal(t, StatePending, ans.Events[0].State)
		assert.Equal(t, KindHeld, ans.Events[0].Kind, "the outage breaker's, not a session's")
		assert.Equal(t, 2, ans.Events[0].Attempt, "a hold spends no attempt")
	})
	t.Run("a first attempt held, then successful", func(t *testing.T) {
		again := processed("order-1", 1, retry.Result{Outcome: retry.OutcomeCompleted})
		again.Message.ApplicationProperties = map[string]any{envelope.PropHeld: t0}
		s := record(t, processed("order-1", 1, retry.Result{Outcome: retry.OutcomeHeld, ScheduledFor: t0.Add(time.Minute)}), again)
		ans, err := s.Lookup(ctx, "order-1", nil)
		require.NoError(t, err)
		require.Len(t, ans.Events, 1)
		assert.Equal(t, StateSucceeded, ans.Events[0].State)
	})
	t.Run("held after the tailer saw the copy active", func(t *testing.T) {
		s, _ := openTemp(t, nil)
		act := rec("order-9", 1, KindActive, 2, 0)
		act.Feed, act.Entity = FeedTailer, "orders"
		require.NoError(t, s.Apply(ctx, []Record{rec("order-9", 1, KindScheduled, 1, -time.Hour)}))
		require.NoError(t, s.Apply(ctx, []Record{act}))
		held := rec("order-9", 1, KindHeld, 2, time.Minute)
		held.At = act.At.Add(time.Second)
		require.NoError(t, s.Apply(ctx, []Record{held}))
		ans, err := s.Lookup(ctx, "order-9", nil)
		require.NoError(t, err)
		assert.Equal(t, StatePending, ans.Events[0].State, "held for the breaker until %v", held.NextDue)
	})
}
