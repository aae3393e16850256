package postgres

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/retryindex"
	"github.com/sbretry/retry/retryindex/postgres/pgtest"
	"github.com/sbretry/retry/retryindex/storetest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Stop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

func open(t *testing.T, now func() time.Time) retryindex.Store {
	t.Helper()
	s, err := Open(context.Background(), pgtest.Database(t), &Options{Now: now})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestPostgresConformance runs the checks every store passes (retryindex/storetest) on a real
// PostgreSQL server.
func TestPostgresConformance(t *testing.T) {
	storetest.Run(t, open)
}

// TestSharedBySeveralProcesses: two stores on one database (as two consumers and a console would
// have) see each other's writes, and opening concurrently creates the tables once.
func TestSharedBySeveralProcesses(t *testing.T) {
	conn := pgtest.Database(t)
	ctx := context.Background()
	stores := make(chan *Store, 2)
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			s, err := Open(ctx, conn, nil)
			errs <- err
			stores <- s
		}()
	}
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	a, b := <-stores, <-stores
	defer a.Close()
	defer b.Close()
	r := storetest.Rec("order-1", 1, retryindex.KindScheduled, 1, 0)
	require.NoError(t, a.Apply(ctx, []retryindex.Record{r}))
	ans, err := b.Lookup(ctx, "order-1", nil)
	require.NoError(t, err)
	require.Len(t, ans.Events, 1)
	assert.Equal(t, retryindex.StatePending, ans.Events[0].State)
}

// TestOpenRefusals: invalid options and an unparsable connection string are errors that do not
// repeat the connection string (it may carry a password).
func TestOpenRefusals(t *testing.T) {
	_, err := Open(context.Background(), "host=x password=hunter2", &Options{MaxErrorLength: -1})
	assert.ErrorIs(t, err, retryindex.ErrInvalidOptions)
	_, err = Open(context.Background(), "postgres://u:hunter2@[bad", nil)
	require.ErrorIs(t, err, retryindex.ErrInvalidOptions)
	assert.NotContains(t, err.Error(), "hunter2")
}

// TestRecorderOnPostgres: a consumer's recorder keeps the shared index as it keeps the embedded one.
func TestRecorderOnPostgres(t *testing.T) {
	s := open(t, nil)
	rec, err := retryindex.NewRecorder(s, &retryindex.RecorderOptions{Process: "billing-1"})
	require.NoError(t, err)
	env := envelope.Envelope{Attempt: 1, Source: "orders", FirstSequenceNumber: 3, OriginalMessageID: "order-7", Key: "order-7", CorrelationID: "c-7"}
	due := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
	rec.Hooks(retry.Hooks{}).OnProcessed(retry.ProcessedParams{
		Message: &azservicebus.ReceivedMessage{MessageID: "order-7"}, Envelope: env, EntityPath: "orders",
		Result: retry.Result{Outcome: retry.OutcomeRetryScheduled, Attempt: 1, HandlerErr: errors.New("ledger down"), ScheduledFor: due, SequenceNumber: 9},
	})
	require.NoError(t, rec.Close(context.Background()))
	ans, err := s.Lookup(context.Background(), "c-7", nil)
	require.NoError(t, err)
	require.Len(t, ans.Events, 1)
	e := ans.Events[0]
	assert.Equal(t, retryindex.StatePending, e.State)
	assert.True(t, due.Equal(e.Due))
	assert.Equal(t, env.RetryMessageID(2), e.RetryMessageID())
	assert.Equal(t, "ledger down", e.LastError)
	assert.Equal(t, "billing-1", e.History[0].Process)
}

// TestClosedStoreRefuses: after Close (twice, harmlessly) every call returns retryindex.ErrClosed.
func TestClosedStoreRefuses(t *testing.T) {
	s, err := Open(context.Background(), pgtest.Database(t), nil)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
	ctx := context.Background()
	_, err = s.Lookup(ctx, "x", nil)
	assert.ErrorIs(t, err, retryindex.ErrClosed)
	assert.ErrorIs(t, s.Apply(ctx, []retryindex.Record{storetest.Rec("x", 1, retryindex.KindSucceeded, 2, 0)}), retryindex.ErrClosed)
	_, err = s.Cursor(ctx, "orders")
	assert.ErrorIs(t, err, retryindex.ErrClosed)
}

// TestOpenAddsCountsBySource: a database written before the counts by source entity existed gets
// them at the next Open, filled from its events, and later writes keep them exact.
func TestOpenAddsCountsBySource(t *testing.T) {
	conn := pgtest.Database(t)
	ctx := context.Background()
	s, err := Open(ctx, conn, nil)
	require.NoError(t, err)
	a, b := storetest.Rec("a", 1, retryindex.KindScheduled, 1, 0), storetest.Rec("b", 2, retryindex.KindScheduled, 1, 0)
	b.Source = "events/Subscriptions/billing"
	require.NoError(t, s.Apply(ctx, []retryindex.Record{a, b}))
	// The schema of the version before: no counts and no indexes by source.
	_, err = s.pool.Exec(ctx, `DROP TABLE sbretry_source_counts; DROP INDEX sbretry_events_source_pending; DROP INDEX sbretry_events_source_dead`)
	require.NoError(t, err)
	require.NoError(t, s.Close())

	s, err = Open(ctx, conn, nil)
	require.NoError(t, err)
	defer s.Close()
	var n int
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname IN ('sbretry_source_counts', 'sbretry_events_source_pending', 'sbretry_events_source_dead')`).Scan(&n))
	assert.Equal(t, 3, n)
	c, err := s.Counts(ctx, &retryindex.CountsOptions{Source: "events/Subscriptions/billing"})
	require.NoError(t, err)
	assert.Equal(t, map[retryindex.State]int64{retryindex.StatePending: 1}, c.ByState, "filled from the events")
	done := b
	done.Kind, done.Attempt, done.At = retryindex.KindSucceeded, 2, b.At.Add(time.Minute)
	require.NoError(t, s.Apply(ctx, []retryindex.Record{done}))
	c, err = s.Counts(ctx, &retryindex.CountsOptions{Source: "events/Subscriptions/billing"})
	require.NoError(t, err)
	assert.Equal(t, map[retryindex.State]int64{retryindex.StateSucceeded: 1}, c.ByState, "kept by the writes after")
	page, err := s.Pending(ctx, &retryindex.PendingOptions{Source: "orders"})
	require.NoError(t, err)
	assert.EqualValues(t, 1, page.Total)
}
