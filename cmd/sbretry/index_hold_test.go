package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/retryindex"
)

// TestStatusFromIndexTellsHoldsApart: a session's durable hold and the outage breaker's hold are both
// pending, and status says which one holds the event, in text and in --json ("hold").
func TestStatusFromIndexTellsHoldsApart(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "index.db")
	s, err := retryindex.OpenSQLite(path, nil)
	require.NoError(t, err)
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	rec := func(id string, k retryindex.Kind, n, next int, entity string) retryindex.Record {
		env := envelope.Envelope{Source: entity, FirstSequenceNumber: 1, OriginalMessageID: id}
		return retryindex.Record{Chain: env.ChainID(), OriginalID: id, Key: id, CorrelationID: id, Source: entity, Kind: k,
			Attempt: n, NextAttempt: next, At: t0, NextDue: t0.Add(time.Hour), Entity: entity, Process: "p/1",
			Feed: retryindex.FeedConsumer, Error: "boom"}
	}
	require.NoError(t, s.Apply(context.Background(), []retryindex.Record{
		rec("in-session", retryindex.KindDeferred, 2, 3, "sessions-q"),
		rec("outage", retryindex.KindHeld, 2, 2, "orders"),
		rec("copy", retryindex.KindScheduled, 2, 3, "orders"),
	}))
	require.NoError(t, s.Close())
	cases := []struct{ id, text, hold string }{
		{"in-session", "held in its session until " + formatTime(t0.Add(time.Hour)) + " (a session consumer's durable hold; then attempt 3)", "session"},
		{"outage", "held by the outage breaker until " + formatTime(t0.Add(time.Hour)) + " (attempt 2 again: a hold spends no attempt)", "outage"},
		{"copy", "will be retried at " + formatTime(t0.Add(time.Hour)) + " (attempt 3)", ""},
	}
	for _, tc := range cases {
		code, out, errOut := cliNoEntity(t, "", "status", "--index", path, tc.id)
		require.Equal(t, exitOK, code, errOut)
		assert.Contains(t, out, tc.text, tc.id)
		code, out, errOut = cliNoEntity(t, "", "status", "--index", path, tc.id, "--json")
		require.Equal(t, exitOK, code, errOut)
		var st struct {
			Events []struct {
				State          string `json:"state"`
				Hold           string `json:"hold"`
				RetryMessageID string `json:"retryMessageId"`
			} `json:"events"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &st), out)
		require.Len(t, st.Events, 1)
		assert.Equal(t, "pending", st.Events[0].State, tc.id)
		assert.Equal(t, tc.hold, st.Events[0].Hold, tc.id)
		assert.Equal(t, tc.hold != "session", st.Events[0].RetryMessageID != "", "%s: a session's hold has no retry copy", tc.id)
	}
}
