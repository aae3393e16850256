package retryindex

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestApplyFoldsRecordsIntoState checks the state each sequence of records leaves, including records
// that arrive late from the other feed.
func TestApplyFoldsRecordsIntoState(t *testing.T) {
	t.Parallel()
	tailerActive := rec("a", 1, KindActive, 2, 30*time.Minute)
	tailerActive.Feed = FeedTailer
	lateTailerPending := rec("a", 1, KindScheduled, 1, 0)
	lateTailerPending.Feed, lateTailerPending.At = FeedTailer, t0.Add(3*time.Hour)
	cases := []struct {
		name        string
		records     []Record
		wantState   State
		wantAttempt int
		wantDue     time.Time
		wantHistory []Kind
	}{
		{name: "first failure schedules attempt 2", records: []Record{rec("a", 1, KindScheduled, 1, 0)},
			wantState: StatePending, wantAttempt: 2, wantDue: t0.Add(time.Hour), wantHistory: []Kind{KindScheduled}},
		{name: "success after a retry", records: []Record{rec("a", 1, KindScheduled, 1, 0), rec("a", 1, KindSucceeded, 2, 2*time.Hour)},
			wantState: StateSucceeded, wantAttempt: 2, wantHistory: []Kind{KindScheduled, KindSucceeded}},
		{name: "dead-lettered at the last attempt", records: []Record{rec("a", 1, KindScheduled, 1, 0), rec("a", 1, KindDeadLettered, 2, 2*time.Hour)},
			wantState: StateDeadLettered, wantAttempt: 2, wantHistory: []Kind{KindScheduled, KindDeadLettered}},
		{name: "a late tailer record of an older stage changes no state", records: []Record{rec("a", 1, KindScheduled, 1, 0), rec("a", 1, KindSucceeded, 2, 2*time.Hour), lateTailerPending},
			wantState: StateSucceeded, wantAttempt: 2, wantHistory: []Kind{KindScheduled, KindSucceeded}},
		{name: "the copy fell due and is receivable", records: []Record{rec("a", 1, KindScheduled, 1, 0), tailerActive},
			wantState: StateActive, wantAttempt: 2, wantHistory: []Kind{KindScheduled, KindActive}},
		{name: "records out of order settle on the later stage, history in attempt order", records: []Record{rec("a", 1, KindSucceeded, 3, 3*time.Hour), rec("a", 1, KindScheduled, 2, time.Hour)},
			wantState: StateSucceeded, wantAttempt: 3, wantHistory: []Kind{KindScheduled, KindSucceeded}},
		{name: "held by the outage breaker keeps the attempt", records: []Record{rec("a", 1, KindHeld, 1, 0)},
			wantState: StatePending, wantAttempt: 1, wantDue: t0.Add(time.Minute), wantHistory: []Kind{KindHeld}},
		{name: "left for redelivery", records: []Record{rec("a", 1, KindLeftForRedelivery, 1, 0)},
			wantState: StateActive, wantAttempt: 1, wantHistory: []Kind{KindLeftForRedelivery}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, _ := openTemp(t, nil)
			ctx := context.Background()
			for _, r := range tc.records {
				require.NoError(t, s.Apply(ctx, []Record{r}))
			}
			ans, err := s.Lookup(ctx, "a", nil)
			require.NoError(t, err)
			require.Len(t, ans.Events, 1)
			e := ans.Events[0]
			assert.Equal(t, tc.wantState, e.State)
			assert.Equal(t, tc.wantAttempt, e.Attempt)
			assert.True(t, tc.wantDue.Equal(e.Due), "due %v, want %v", e.Due, tc.wantDue)
			var kinds []Kind
			for _, h := range e.History {
				kinds = append(kinds, h.Kind)
			}
			assert.Equal(t, tc.wantHistory, kinds)
		})
	}
}

// TestLookupByEveryName finds one event by its original id, key, correlation id, a retry MessageID
// and its chain id, and nothing by another id.
func TestLookupByEveryName(t *testing.T) {
	t.Parallel()
	s, _ := openTemp(t, nil)
	ctx := context.Background()
	r := rec("order-42", 7, KindScheduled, 1, 0)
	r.Key, r.CorrelationID = "key-42", "corr-42"
	r.Error = "downstream unavailable"
	other := rec("order-43", 8, KindScheduled, 1, 0)
	require.NoError(t, s.Apply(ctx, []Record{r, other}))
	env := envOf("order-42", 7)
	for _, id := range []string{"order-42", "key-42", "corr-42", env.RetryMessageID(2), env.RetryMessageID(5), r.Chain} {
		t.Run(id, func(t *testing.T) {
			ans, err := s.Lookup(ctx, id, nil)
			require.NoError(t, err)
			require.Len(t, ans.Events, 1)
			e := ans.Events[0]
			assert.Equal(t, "order-42", e.OriginalID)
			assert.Equal(t, "key-42", e.Key)
			assert.Equal(t, "corr-42", e.CorrelationID)
			assert.Equal(t, "orders", e.Source)
			assert.Equal(t, "downstream unavailable", e.LastError)
			assert.Equal(t, env.RetryMessageID(2), e.RetryMessageID())
			assert.Equal(t, FeedConsumer, e.Feed)
			assert.Equal(t, "test/1", e.History[0].Process)
		})
	}
	ans, err := s.Lookup(ctx, "order-44", nil)
	require.NoError(t, err)
	assert.Empty(t, ans.Events)
	assert.False(t, ans.AsOf.IsZero(), "every answer says as of when")
	require.Len(t, ans.Feeds, 1)
	assert.Equal(t, "consumer test/1", ans.Feeds[0].Name)
}

// TestLookupBoundsEvents returns at most MaxEvents of the events sharing a correlation id, newest
// first, and says it cut.
func TestLookupBoundsEvents(t *testing.T) {
	t.Parallel()
	s, _ := openTemp(t, nil)
	ctx := context.Background()
	var rs []Record
	for i := range 5 {
		r := rec(fmt.Sprintf("m-%d", i), int64(i+1), KindSucceeded, 1, time.Duration(i)*time.Second)
		r.CorrelationID = "batch-1"
		rs = append(rs, r)
	}
	require.NoError(t, s.Apply(ctx, rs))
	ans, err := s.Lookup(ctx, "batch-1", &LookupOptions{MaxEvents: 3})
	require.NoError(t, err)
	require.Len(t, ans.Events, 3)
	assert.True(t, ans.Truncated)
	assert.Equal(t, "m-4", ans.Events[0].OriginalID)
	ans, err = s.Lookup(ctx, "batch-1", nil)
	require.NoError(t, err)
	assert.Len(t, ans.Events, 5)
	assert.False(t, ans.Truncated)
	_, err = s.Lookup(ctx, "batch-1", &LookupOptions{MaxEvents: -1})
	assert.ErrorIs(t, err, ErrInvalidOptions)
}

// TestPendingPagesInDueOrder writes pending retries in an order unrelated to their due times and pages
// through them: every page in due order, no item twice, the total exact.
func TestPendingPagesInDueOrder(t *testing.T) {
	t.Parallel()
	s, _ := openTemp(t, nil)
	ctx := context.Background()
	const n = 25
	var rs []Record
	for i := range n {
		r := rec(fmt.Sprintf("m-%d", i), int64(i+1), KindScheduled, 1, 0)
		r.NextDue = t0.Add(time.Duration((i*7)%n) * time.Minute) // a permutation of due times
		if i%5 == 0 {
			r.NextDue = t0.Add(3 * time.Minute) // ties, broken by id
		}
		rs = append(rs, r)
	}
	rs = append(rs, rec("done", 99, KindSucceeded, 1, 0))
	require.NoError(t, s.Apply(ctx, rs))
	seen := map[string]bool{}
	var last time.Time
	cursor := ""
	pages := 0
	for {
		page, err := s.Pending(ctx, &PendingOptions{Limit: 4, Cursor: cursor})
		require.NoError(t, err)
		pages++
		assert.EqualValues(t, n, page.Total)
		for _, e := range page.Items {
			assert.False(t, e.Due.Before(last), "due order")
			last = e.Due
			assert.False(t, seen[e.Chain], "twice: %s", e.OriginalID)
			seen[e.Chain] = true
			assert.Equal(t, StatePending, e.State)
		}
		if page.Next == "" {
			break
		}
		cursor = page.Next
	}
	assert.Len(t, seen, n)
	assert.Equal(t, 7, pages)
	_, err := s.Pending(ctx, &PendingOptions{Cursor: "nonsense"})
	assert.ErrorIs(t, err, ErrInvalidCursor)
	_, err = s.Pending(ctx, &PendingOptions{Limit: -1})
	assert.ErrorIs(t, err, ErrInvalidOptions)
}

// TestCountsAndPrune counts events by state and prunes only finished events older than the cutoff,
// with their history.
func TestCountsAndPrune(t *testing.T) {
	t.Parallel()
	s, _ := openTemp(t, &SQLiteOptions{Now: fixedClock(t0.Add(24 * time.Hour))})
	ctx := context.Background()
	require.NoError(t, s.Apply(ctx, []Record{
		rec("old-ok", 1, KindSucceeded, 1, 0),
		rec("old-dead", 2, KindDeadLettered, 3, 0),
		rec("old-pending", 3, KindScheduled, 1, 0),
		rec("new-ok", 4, KindSucceeded, 1, 10*time.Hour),
	}))
	c, err := s.Counts(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, map[State]int64{StateSucceeded: 2, StateDeadLettered: 1, StatePending: 1}, c.ByState)
	assert.Equal(t, t0.Add(24*time.Hour), c.AsOf)

	n, err := s.Prune(ctx, t0.Add(time.Hour))
	require.NoError(t, err)
	assert.EqualValues(t, 2, n)
	for id, want := range map[string]int{"old-ok": 0, "old-dead": 0, "old-pending": 1, "new-ok": 1} {
		ans, err := s.Lookup(ctx, id, nil)
		require.NoError(t, err)
		assert.Len(t, ans.Events, want, id)
	}
	c, err = s.Counts(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, map[State]int64{StateSucceeded: 1, StatePending: 1}, c.ByState, "counts follow the prune")
	var orphans int
	require.NoError(t, s.read.QueryRow(`SELECT count(*) FROM attempts WHERE event NOT IN (SELECT id FROM events)`).Scan(&orphans))
	assert.Zero(t, orphans, "the history goes with its event")
}

// TestErrorTextRedactedAndBounded stores no secret and no more than MaxErrorLength bytes of error.
func TestErrorTextRedactedAndBounded(t *testing.T) {
	t.Parallel()
	s, _ := openTemp(t, &SQLiteOptions{MaxErrorLength: 64})
	ctx := context.Background()
	r := rec("a", 1, KindScheduled, 1, 0)
	r.Error = "connecting with Endpoint=sb://x/;SharedAccessKeyName=root;SharedAccessKey=c2VjcmV0c2VjcmV0 failed: " + strings.Repeat("é", 100)
	require.NoError(t, s.Apply(ctx, []Record{r}))
	ans, err := s.Lookup(ctx, "a", nil)
	require.NoError(t, err)
	got := ans.Events[0].History[0].Error
	assert.NotContains(t, got, "c2VjcmV0c2VjcmV0")
	assert.LessOrEqual(t, len(got), 64)
	assert.True(t, strings.HasSuffix(got, "…"), got)
}

// TestApplyRefusesInvalidRecordsAtomically refuses a batch with one bad record and stores none of it.
func TestApplyRefusesInvalidRecordsAtomically(t *testing.T) {
	t.Parallel()
	s, _ := openTemp(t, nil)
	ctx := context.Background()
	bad := []Record{
		{Chain: "not-a-chain", Kind: KindSucceeded, At: t0},
		{Chain: rec("a", 1, KindSucceeded, 1, 0).Chain, Kind: Kind(99), At: t0},
		{Chain: rec("a", 1, KindSucceeded, 1, 0).Chain, Kind: KindSucceeded},
		{Chain: rec("a", 1, KindSucceeded, 1, 0).Chain, Kind: KindGone, At: t0},
	}
	for _, b := range bad {
		err := s.Apply(ctx, []Record{rec("good", 2, KindSucceeded, 1, 0), b})
		assert.ErrorIs(t, err, ErrInvalidRecord)
	}
	ans, err := s.Lookup(ctx, "good", nil)
	require.NoError(t, err)
	assert.Empty(t, ans.Events)
}

// TestReadOnlyAndClosed: a read-only handle reads what a writer wrote and refuses writes; a closed
// store refuses everything.
func TestReadOnlyAndClosed(t *testing.T) {
	t.Parallel()
	s, path := openTemp(t, nil)
	ctx := context.Background()
	require.NoError(t, s.Apply(ctx, []Record{rec("a", 1, KindScheduled, 1, 0)}))
	ro, err := OpenSQLite(path, &SQLiteOptions{ReadOnly: true})
	require.NoError(t, err)
	ans, err := ro.Lookup(ctx, "a", nil)
	require.NoError(t, err)
	assert.Len(t, ans.Events, 1)
	assert.Error(t, ro.Apply(ctx, []Record{rec("b", 2, KindScheduled, 1, 0)}))
	require.NoError(t, ro.Close())
	require.NoError(t, ro.Close(), "idempotent")
	_, err = ro.Lookup(ctx, "a", nil)
	assert.ErrorIs(t, err, ErrClosed)

	_, err = OpenSQLite(path+".missing", &SQLiteOptions{ReadOnly: true})
	assert.Error(t, err, "read-only never creates a file")
}

// TestOpenSQLiteRefusesInvalidOptions returns errors, never panics.
func TestOpenSQLiteRefusesInvalidOptions(t *testing.T) {
	t.Parallel()
	_, err := OpenSQLite("", nil)
	assert.ErrorIs(t, err, ErrInvalidOptions)
	_, err = OpenSQLite(t.TempDir()+"/x.db", &SQLiteOptions{MaxErrorLength: -1})
	assert.ErrorIs(t, err, ErrInvalidOptions)
}

// TestNamesCacheForgetsRolledBackNames: a name interned by a write that failed is not reused for
// another name by the cache.
func TestNamesCacheForgetsRolledBackNames(t *testing.T) {
	t.Parallel()
	s, _ := openTemp(t, nil)
	ctx := context.Background()
	failing := errors.New("fail")
	err := s.writeTx(ctx, func(tx *sqlTx) error {
		_, err := s.nameID(ctx, tx, "entity-that-rolls-back")
		require.NoError(t, err)
		return failing
	})
	require.ErrorIs(t, err, failing)
	r := rec("a", 1, KindScheduled, 1, 0)
	r.Entity = "entity-kept"
	require.NoError(t, s.Apply(ctx, []Record{r}))
	ans, err := s.Lookup(ctx, "a", nil)
	require.NoError(t, err)
	assert.Equal(t, "entity-kept", ans.Events[0].Entity)
}

// TestChainOfMessageID parses retry MessageIDs and refuses everything else.
func TestChainOfMessageID(t *testing.T) {
	t.Parallel()
	env := envOf("x", 1)
	chain, ok := ChainOfMessageID(env.RetryMessageID(3))
	assert.True(t, ok)
	assert.Equal(t, env.ChainID(), chain)
	for _, id := range []string{"", "order-1", "sbretry-", "sbretry-" + env.ChainID(), "sbretry-" + env.ChainID() + "-x",
		"sbretry-" + strings.ToUpper(env.ChainID()) + "-2", "sbretry-" + strings.Repeat("g", 40) + "-2"} {
		_, ok := ChainOfMessageID(id)
		assert.False(t, ok, id)
	}
}

// TestPendingBySource lists and counts only the pending retries of one entity's chains.
func TestPendingBySource(t *testing.T) {
	t.Parallel()
	s, _ := openTemp(t, nil)
	ctx := context.Background()
	a := rec("a", 1, KindScheduled, 1, 0)
	b := rec("b", 2, KindScheduled, 1, time.Minute)
	b.Source = "events/Subscriptions/billing"
	require.NoError(t, s.Apply(ctx, []Record{a, b}))
	for source, want := range map[string][]string{"": {"a", "b"}, "orders": {"a"}, "events/Subscriptions/billing": {"b"}, "never-seen": nil} {
		page, err := s.Pending(ctx, &PendingOptions{Source: source})
		require.NoError(t, err)
		var got []string
		for _, e := range page.Items {
			got = append(got, e.OriginalID)
		}
		assert.Equal(t, want, got, source)
		assert.EqualValues(t, len(want), page.Total, source)
	}
}

// TestOpenSQLiteUpgradesAnOlderFile: an index written before the feeds counted lost records and the
// history kept immediate retries and the events their kind opens, keeps its feeds, notes losses and
// records immediate retries and kinds.
func TestOpenSQLiteUpgradesAnOlderFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", path)
	require.NoError(t, err)
	_, err = db.Exec(`CREATE TABLE feeds (name TEXT PRIMARY KEY, last INTEGER NOT NULL, cursor INTEGER NOT NULL DEFAULT 0);
		CREATE TABLE events (id INTEGER PRIMARY KEY, chain BLOB NOT NULL UNIQUE, original_id TEXT NOT NULL, key TEXT, corr TEXT,
			source INTEGER, state INTEGER NOT NULL, pos INTEGER NOT NULL, attempt INTEGER NOT NULL, due INTEGER, entity INTEGER, seq INTEGER,
			updated INTEGER NOT NULL, feed INTEGER NOT NULL);
		CREATE TABLE attempts (event INTEGER NOT NULL, attempt INTEGER NOT NULL, kind INTEGER NOT NULL, at INTEGER NOT NULL, error TEXT,
			reason TEXT, next_due INTEGER, process INTEGER, feed INTEGER NOT NULL, PRIMARY KEY (event, attempt, kind, at)) WITHOUT ROWID;
		INSERT INTO feeds(name, last, cursor) VALUES ('tailer orders', 1000, 42)`)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	s, err := OpenSQLite(path, &SQLiteOptions{Now: fixedClock(t0)})
	require.NoError(t, err)
	defer func() { _ = s.Close() }()
	ctx := context.Background()
	require.NoError(t, s.NoteLost(ctx, "consumer a/1", 4))
	f, err := s.Freshness(ctx)
	require.NoError(t, err)
	require.Len(t, f.Feeds, 2)
	assert.EqualValues(t, 4, f.Feeds[0].Lost)
	assert.EqualValues(t, 42, f.Feeds[1].Cursor)
	assert.Zero(t, f.Feeds[1].Lost)
	r := rec("order-1", 1, KindScheduled, 1, 0)
	r.Immediate = 2
	require.NoError(t, s.Apply(ctx, []Record{r}), "the history gains its immediate column")
	ans, err := s.Lookup(ctx, "order-1", nil)
	require.NoError(t, err)
	require.Len(t, ans.Events, 1)
	assert.Equal(t, 2, ans.Events[0].Immediate)
	assert.Equal(t, KindScheduled, ans.Events[0].Kind, "the events gain their kind column")
}

// TestOpenSQLiteAddsCountsBySource: a file written before the indexes and counts by source entity
// answers by source exactly when opened read-only before any writer of this version (by scanning), and
// a writer's open adds them, filled from the events, which later writes keep exact.
func TestOpenSQLiteAddsCountsBySource(t *testing.T) {
	t.Parallel()
	s, path := openTemp(t, &SQLiteOptions{Now: fixedClock(t0)})
	ctx := context.Background()
	var rs []Record
	for i := range 9 {
		r := rec(fmt.Sprintf("m-%d", i), int64(i+1), KindScheduled, 1, time.Duration(i)*time.Minute)
		if i%3 == 0 {
			r.Source = "events/Subscriptions/billing"
		}
		if i == 4 {
			r.Kind, r.Reason, r.Entity = KindDeadLettered, "RetryMaxAttemptsExceeded", "orders/$DeadLetterQueue"
		}
		rs = append(rs, r)
	}
	require.NoError(t, s.Apply(ctx, rs))
	// The schema of the version before: no counts and no indexes by source.
	_, err := s.write.Exec(`DROP TABLE source_counts; DROP INDEX events_source_pending; DROP INDEX events_source_dead`)
	require.NoError(t, err)
	require.NoError(t, s.Close())

	want := map[string]map[State]int64{
		"events/Subscriptions/billing": {StatePending: 3},
		"orders":                       {StatePending: 5, StateDeadLettered: 1},
	}
	check := func(s *SQLite, when string) {
		for source, w := range want {
			c, err := s.Counts(ctx, &CountsOptions{Source: source})
			require.NoError(t, err, when)
			assert.Equal(t, w, c.ByState, "%s: %s", when, source)
			page, err := s.Pending(ctx, &PendingOptions{Source: source, Limit: 2})
			require.NoError(t, err, when)
			assert.Equal(t, w[StatePending], page.Total, "%s: %s", when, source)
			assert.Len(t, page.Items, 2)
			dead, err := s.DeadLettered(ctx, &PendingOptions{Source: source})
			require.NoError(t, err, when)
			assert.Equal(t, w[StateDeadLettered], dead.Total, "%s: %s", when, source)
			h, err := s.PendingHistogram(ctx, &HistogramOptions{Source: source, From: t0, To: t0.Add(3 * time.Hour), Width: time.Hour})
			require.NoError(t, err, when)
			assert.Equal(t, w[StatePending], h.Before+h.Counts[0]+h.Counts[1]+h.Counts[2]+h.Counts[3]+h.After, "%s: %s", when, source)
		}
	}
	old, err := OpenSQLite(path, &SQLiteOptions{ReadOnly: true})
	require.NoError(t, err)
	assert.False(t, old.bySource)
	check(old, "read-only, before an upgrade")
	require.NoError(t, old.Close())

	s, err = OpenSQLite(path, &SQLiteOptions{Now: fixedClock(t0)})
	require.NoError(t, err)
	defer func() { _ = s.Close() }()
	var n int
	require.NoError(t, s.read.QueryRow(`SELECT count(*) FROM sqlite_master WHERE name IN ('source_counts', 'events_source_pending', 'events_source_dead')`).Scan(&n))
	assert.Equal(t, 3, n, "the counts and indexes by source were added")
	check(s, "upgraded")
	done := rs[0] // billing: pending → succeeded
	done.Kind, done.Attempt, done.At = KindSucceeded, 2, t0.Add(time.Hour)
	require.NoError(t, s.Apply(ctx, []Record{done}))
	want["events/Subscriptions/billing"] = map[State]int64{StatePending: 2, StateSucceeded: 1}
	check(s, "written after the upgrade")
}
