package main

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/retryindex"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, sbtest.IgnoreSDKLeak())
}

// The fill leaves what it says: each message a pending retry in the index (and the queue), or with
// -max-attempts 1 a dead letter.
func TestFillMakesPendingRetriesAndDeadLetters(t *testing.T) {
	h := sbtest.New(t)
	path := filepath.Join(t.TempDir(), "index.db")
	require.NoError(t, run(h.Em.ConnectionString(), sbtest.Queue, 30, path, "order-", 0, time.Hour, false))
	require.NoError(t, run(h.Em.ConnectionString(), sbtest.Queue, 5, path, "dead-", 1, time.Hour, false))
	store, err := retryindex.OpenSQLite(path, &retryindex.SQLiteOptions{ReadOnly: true})
	require.NoError(t, err)
	defer store.Close()
	for id, want := range map[string]retryindex.State{"order-00000000": retryindex.StatePending, "order-00000029": retryindex.StatePending, "dead-00000004": retryindex.StateDeadLettered} {
		ans, err := store.Lookup(sbtest.Context(t), id, nil)
		require.NoError(t, err)
		require.Len(t, ans.Events, 1, id)
		assert.Equal(t, want, ans.Events[0].State, id)
	}
	assert.Error(t, run(h.Em.ConnectionString(), sbtest.Queue, 0, path, "x-", 0, time.Hour, false), "nothing to wait for")
	st := h.QueueStats(t, sbtest.Queue)
	assert.Equal(t, 30, st.Scheduled, "the retry copies, scheduled")
	assert.Equal(t, 5, st.DeadLettered)
}
