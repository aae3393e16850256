package retryindex

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
)

// processed is what the consumer's OnProcessed hook gets for message id (chain of (id, 1)) at
// attempt n with res.
func processed(id string, n int, res retry.Result) retry.ProcessedParams {
	env := envOf(id, 1)
	env.Attempt = n
	res.Attempt = n
	return retry.ProcessedParams{Context: context.Background(), Message: &azservicebus.ReceivedMessage{MessageID: id}, Envelope: env, Result: res, EntityPath: "orders"}
}

// TestRecorderRecordsEachOutcome maps each outcome of a delivery to the event state the index then
// answers with.
func TestRecorderRecordsEachOutcome(t *testing.T) {
	t.Parallel()
	boom := errors.New("downstream unavailable")
	due := t0.Add(time.Hour)
	cases := []struct {
		name      string
		res       retry.Result
		wantState State
		wantKind  Kind
		check     func(t *testing.T, e Event)
	}{
		{name: "retry scheduled", res: retry.Result{Outcome: retry.OutcomeRetryScheduled, HandlerErr: boom, ScheduledFor: due, SequenceNumber: 17, ImmediateRetries: 2},
			wantState: StatePending, wantKind: KindScheduled, check: func(t *testing.T, e Event) {
				assert.Equal(t, 2, e.Immediate, "the delivery's immediate retries")
				assert.Equal(t, 2, e.History[0].Immediate)
				assert.Equal(t, 3, e.Attempt, "the copy runs as attempt 3")
				assert.True(t, due.Equal(e.Due))
				assert.EqualValues(t, 17, e.SequenceNumber)
				assert.Equal(t, "orders", e.Entity)
				assert.Equal(t, boom.Error(), e.LastError)
			}},
		{name: "succeeded", res: retry.Result{Outcome: retry.OutcomeCompleted}, wantState: StateSucceeded, wantKind: KindSucceeded},
		{name: "dead-lettered", res: retry.Result{Outcome: retry.OutcomeDeadLettered, HandlerErr: boom, DeadLetterReason: "RetryMaxAttemptsExceeded"},
			wantState: StateDeadLettered, wantKind: KindDeadLettered, check: func(t *testing.T, e Event) {
				assert.Equal(t, "RetryMaxAttemptsExceeded", e.Reason)
				assert.Equal(t, "orders/$DeadLetterQueue", e.Entity)
			}},
		{name: "discarded", res: retry.Result{Outcome: retry.OutcomeDiscarded, HandlerErr: boom}, wantState: StateDiscarded, wantKind: KindDiscarded},
		{name: "left for redelivery", res: retry.Result{Outcome: retry.OutcomeLeftForRedelivery, SettleErr: retry.ErrLockLost},
			wantState: StateActive, wantKind: KindLeftForRedelivery, check: func(t *testing.T, e Event) {
				assert.Equal(t, retry.ErrLockLost.Error(), e.LastError)
			}},
		{name: "held", res: retry.Result{Outcome: retry.OutcomeHeld, ScheduledFor: due}, wantState: StatePending, wantKind: KindHeld, check: func(t *testing.T, e Event) {
			assert.Equal(t, 2, e.Attempt, "a hold spends no attempt")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, _ := openTemp(t, nil)
			r, err := NewRecorder(s, &RecorderOptions{Process: "host-a/7", Now: fixedClock(t0)})
			require.NoError(t, err)
			r.Hooks(retry.Hooks{}).OnProcessed(processed("order-42", 2, tc.res))
			require.NoError(t, r.Close(context.Background()))
			assert.Equal(t, RecorderStats{Stored: 1}, r.Stats())
			ans, err := s.Lookup(context.Background(), "order-42", nil)
			require.NoError(t, err)
			require.Len(t, ans.Events, 1)
			e := ans.Events[0]
			assert.Equal(t, tc.wantState, e.State)
			require.Len(t, e.History, 1)
			assert.Equal(t, tc.wantKind, e.History[0].Kind)
			assert.Equal(t, "host-a/7", e.History[0].Process)
			assert.Equal(t, t0, e.History[0].At)
			if tc.check != nil {
				tc.check(t, e)
			}
		})
	}
}

// TestRecorderHooksCompose: the recorder's hooks call next's, and pass next's other hooks through.
func TestRecorderHooksCompose(t *testing.T) {
	t.Parallel()
	s, _ := openTemp(t, nil)
	r, err := NewRecorder(s, nil)
	require.NoError(t, err)
	defer func() { _ = r.Close(context.Background()) }()
	var calls []string
	h := r.Hooks(retry.Hooks{
		OnProcessed: func(retry.ProcessedParams) { calls = append(calls, "processed") },
		OnSettle:    func(retry.SettleParams) { calls = append(calls, "settle") },
	})
	h.OnProcessed(processed("a", 1, retry.Result{Outcome: retry.OutcomeCompleted}))
	h.OnSettle(retry.SettleParams{})
	assert.Equal(t, []string{"processed", "settle"}, calls)
	assert.Nil(t, r.Hooks(retry.Hooks{}).OnStart, "no hook is invented")
}

// TestRecorderSkipsProbes records nothing for a connection check's probe.
func TestRecorderSkipsProbes(t *testing.T) {
	t.Parallel()
	s, _ := openTemp(t, nil)
	r, err := NewRecorder(s, nil)
	require.NoError(t, err)
	p := processed("probe", 2, retry.Result{Outcome: retry.OutcomeCompleted})
	p.Message.ApplicationProperties = map[string]any{retry.PropProbe: retry.ProbeValue}
	r.Hooks(retry.Hooks{}).OnProcessed(p)
	require.NoError(t, r.Close(context.Background()))
	assert.Equal(t, RecorderStats{}, r.Stats())
}

// gatedStore blocks Apply until gate is closed, so a test can fill the recorder's buffer.
type gatedStore struct {
	Store
	entered chan struct{}
	gate    chan struct{}
	once    sync.Once
}

func (g *gatedStore) Apply(ctx context.Context, rs []Record) error {
	g.once.Do(func() { close(g.entered) })
	<-g.gate
	return g.Store.Apply(ctx, rs)
}

// TestRecorderDropsInsteadOfBlocking: with the writer stuck, the hook returns at once and counts what
// it could not queue; what was queued is stored once the writer moves again.
func TestRecorderDropsInsteadOfBlocking(t *testing.T) {
	t.Parallel()
	s, _ := openTemp(t, nil)
	g := &gatedStore{Store: s, entered: make(chan struct{}), gate: make(chan struct{})}
	r, err := NewRecorder(g, &RecorderOptions{Buffer: 2, BatchSize: 1})
	require.NoError(t, err)
	hook := r.Hooks(retry.Hooks{}).OnProcessed
	hook(processed("first", 2, retry.Result{Outcome: retry.OutcomeCompleted}))
	<-g.entered // the writer holds "first" and waits at the gate
	for _, id := range []string{"q1", "q2", "d1", "d2", "d3"} {
		hook(processed(id, 2, retry.Result{Outcome: retry.OutcomeCompleted}))
	}
	assert.EqualValues(t, 3, r.Stats().Dropped)
	close(g.gate)
	require.NoError(t, r.Close(context.Background()))
	assert.Equal(t, RecorderStats{Stored: 3, Dropped: 3}, r.Stats())
	f, err := s.Freshness(context.Background())
	require.NoError(t, err)
	require.Len(t, f.Feeds, 1)
	assert.EqualValues(t, 3, f.Feeds[0].Lost, "every answer says the feed lost 3 records: %+v", f.Feeds[0])
	assert.False(t, f.Feeds[0].LostAt.IsZero())
	hook(processed("late", 2, retry.Result{Outcome: retry.OutcomeCompleted}))
	assert.EqualValues(t, 4, r.Stats().Dropped, "after Close a record is dropped, not sent on a closed channel")
	require.NoError(t, r.Close(context.Background()), "idempotent")
}

// failingStore refuses every write.
type failingStore struct{ Store }

var errDiskFull = errors.New("disk full")

func (failingStore) Apply(context.Context, []Record) error { return errDiskFull }

// TestRecorderCountsFailedWrites keeps going after a failed write and reports it.
func TestRecorderCountsFailedWrites(t *testing.T) {
	t.Parallel()
	s, _ := openTemp(t, nil)
	r, err := NewRecorder(failingStore{s}, nil)
	require.NoError(t, err)
	r.Hooks(retry.Hooks{}).OnProcessed(processed("a", 2, retry.Result{Outcome: retry.OutcomeCompleted}))
	require.NoError(t, r.Close(context.Background()))
	st := r.Stats()
	assert.EqualValues(t, 1, st.Failed)
	assert.ErrorIs(t, st.LastErr, errDiskFull)
	f, err := s.Freshness(context.Background())
	require.NoError(t, err)
	require.Len(t, f.Feeds, 1, "the store took the note of the loss though it refused the records")
	assert.EqualValues(t, 1, f.Feeds[0].Lost)
}

// TestRecorderPrunesOnSchedule prunes finished events past the retention as it writes.
func TestRecorderPrunesOnSchedule(t *testing.T) {
	t.Parallel()
	s, _ := openTemp(t, nil)
	require.NoError(t, s.Apply(context.Background(), []Record{rec("ancient", 9, KindSucceeded, 1, -30*24*time.Hour)}))
	var mu sync.Mutex
	now := t0
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	r, err := NewRecorder(s, &RecorderOptions{Now: clock, PruneInterval: time.Minute})
	require.NoError(t, err)
	mu.Lock()
	now = t0.Add(2 * time.Minute)
	mu.Unlock()
	r.Hooks(retry.Hooks{}).OnProcessed(processed("fresh", 2, retry.Result{Outcome: retry.OutcomeCompleted}))
	require.NoError(t, r.Close(context.Background()))
	c, err := s.Counts(context.Background(), nil)
	require.NoError(t, err)
	assert.EqualValues(t, 1, c.ByState[StateSucceeded], "the 30-day-old event is pruned, the fresh one kept")
}

// TestNewRecorderRefusesInvalidOptions returns errors, never panics.
func TestNewRecorderRefusesInvalidOptions(t *testing.T) {
	t.Parallel()
	s, _ := openTemp(t, nil)
	for name, o := range map[string]*RecorderOptions{
		"buffer": {Buffer: -1}, "batch": {BatchSize: -1}, "retention": {Retention: -time.Second}, "flush": {FlushInterval: -time.Second},
	} {
		_, err := NewRecorder(s, o)
		assert.ErrorIs(t, err, ErrInvalidOptions, name)
	}
	_, err := NewRecorder(nil, nil)
	assert.ErrorIs(t, err, ErrInvalidOptions)
}

// TestRecorderSkipsFirstAttemptSuccess: by default a delivery that succeeded at its first attempt is
// not recorded (no retry state, and most of the writer's work); everything about a retried event is,
// and RecordFirstAttempts records the rest too.
func TestRecorderSkipsFirstAttemptSuccess(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	cases := []struct {
		name   string
		all    bool
		n      int
		res    retry.Result
		stored int64
	}{
		{"first-attempt success skipped", false, 1, retry.Result{Outcome: retry.OutcomeCompleted}, 0},
		{"first-attempt shutdown without error skipped", false, 1, retry.Result{Outcome: retry.OutcomeLeftForRedelivery, SettleErr: retry.ErrLockLost}, 0},
		{"first-attempt failure recorded", false, 1, retry.Result{Outcome: retry.OutcomeRetryScheduled, HandlerErr: boom}, 1},
		{"first-attempt failure left for redelivery recorded", false, 1, retry.Result{Outcome: retry.OutcomeLeftForRedelivery, HandlerErr: boom}, 1},
		{"first-attempt dead letter recorded", false, 1, retry.Result{Outcome: retry.OutcomeDeadLettered, HandlerErr: boom}, 1},
		{"success of a retry recorded", false, 2, retry.Result{Outcome: retry.OutcomeCompleted}, 1},
		{"first-attempt success with RecordFirstAttempts", true, 1, retry.Result{Outcome: retry.OutcomeCompleted}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, _ := openTemp(t, nil)
			r, err := NewRecorder(s, &RecorderOptions{RecordFirstAttempts: tc.all})
			require.NoError(t, err)
			r.Hooks(retry.Hooks{}).OnProcessed(processed("a", tc.n, tc.res))
			require.NoError(t, r.Close(context.Background()))
			assert.Equal(t, tc.stored, r.Stats().Stored)
		})
	}
}
