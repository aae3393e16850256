package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/retryindex"
	"github.com/sbretry/retry/retryindex/postgres"
	"github.com/sbretry/retry/retryindex/postgres/pgtest"
)

// indexFixture writes an index file with: order-42 failed twice and pending (attempt 3), order-43
// dead-lettered, and pending retries of other messages due at scattered times. It returns the path
// and the due time of order-42's retry.
func indexFixture(t *testing.T) (string, time.Time) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "index.db")
	s, err := retryindex.OpenSQLite(path, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	rec := func(id string, k retryindex.Kind, n int, at, due time.Duration) retryindex.Record {
		env := envelope.Envelope{Source: "orders", FirstSequenceNumber: int64(len(id)), OriginalMessageID: id}
		r := retryindex.Record{Chain: env.ChainID(), OriginalID: id, Key: "key-" + id, CorrelationID: "corr-" + id, Source: "orders",
			Kind: k, Attempt: n, At: t0.Add(at), Process: "billing-7f9c/1", Feed: retryindex.FeedConsumer, Error: "downstream unavailable"}
		if k == retryindex.KindScheduled {
			r.NextAttempt, r.NextDue, r.Entity, r.SequenceNumber = n+1, t0.Add(due), "orders", 100+int64(n)
		}
		if k == retryindex.KindDeadLettered {
			r.Reason, r.Entity = "RetryMaxAttemptsExceeded", "orders/$DeadLetterQueue"
		}
		return r
	}
	records := []retryindex.Record{
		rec("order-42", retryindex.KindScheduled, 1, -2*time.Minute, -time.Minute),
		rec("order-42", retryindex.KindScheduled, 2, -time.Minute, time.Hour),
		rec("order-43", retryindex.KindDeadLettered, 5, 0, 0),
	}
	for i, d := range []time.Duration{30 * time.Minute, 2 * time.Hour, 10 * time.Minute} {
		records = append(records, rec("other-"+string(rune('a'+i)), retryindex.KindScheduled, 1, 0, d))
	}
	require.NoError(t, s.Apply(context.Background(), records))
	return path, t0.Add(time.Hour)
}

// TestStatusFromIndex answers from the index without any broker: the state in status's words, the
// history, and the freshness line; by every name of the event; not found is exit 3 with what was
// searched.
func TestStatusFromIndex(t *testing.T) {
	t.Parallel()
	path, due := indexFixture(t)
	for _, id := range []string{"order-42", "key-order-42", "corr-order-42"} {
		code, out, errOut := cliNoEntity(t, "", "status", "--index", path, id)
		require.Equal(t, exitOK, code, errOut)
		assert.Contains(t, out, id+" on the index: from index "+path+", as of ")
		assert.Regexp(t, `feeds: consumer billing-7f9c/1 last wrote [0-9T:.\-]+Z \(`, out)
		assert.Contains(t, out, "will be retried at "+formatTime(due)+" (attempt 3), in ")
		assert.Contains(t, out, "sequence number 102 in orders, message id sbretry-")
		assert.Contains(t, out, "last error: downstream unavailable")
		assert.Regexp(t, `history:\n\s+\S+\s+attempt 1\s+retry scheduled, due \S+; error: downstream unavailable\s+billing-7f9c/1 \(consumer\)\n\s+\S+\s+attempt 2\s+retry scheduled`, out)
	}
	code, out, _ := cliNoEntity(t, "", "status", "--index", path, "order-43")
	require.Equal(t, exitOK, code)
	assert.Regexp(t, `dead-lettered at \S+: RetryMaxAttemptsExceeded \(attempt 5\)`, out)

	code, out, _ = cliNoEntity(t, "", "status", "--index", path, "order-42", "--json")
	require.Equal(t, exitOK, code)
	var st struct {
		From   string `json:"from"`
		AsOf   time.Time
		Events []struct {
			State   string `json:"state"`
			Attempt int    `json:"attempt"`
			Due     time.Time
			History []struct {
				Outcome string `json:"outcome"`
			} `json:"history"`
		} `json:"events"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	assert.Equal(t, "index", st.From)
	require.Len(t, st.Events, 1)
	assert.Equal(t, "pending", st.Events[0].State)
	assert.Equal(t, 3, st.Events[0].Attempt)
	assert.True(t, due.Equal(st.Events[0].Due))
	assert.Len(t, st.Events[0].History, 2)

	code, out, _ = cliNoEntity(t, "", "status", "--index", path, "nobody")
	assert.Equal(t, exitNotFound, code)
	assert.Contains(t, out, "no trace in the index: searched retry message ids, original message ids, idempotency keys and correlation ids")

	code, _, _ = cliNoEntity(t, "", "status", "--index", path, "order-42", "--queue", "another-queue")
	assert.Equal(t, exitNotFound, code, "entity flags keep only that entity's events")
	code, _, _ = cliNoEntity(t, "", "status", "--index", path, "order-42", "--queue", "orders")
	assert.Equal(t, exitOK, code)

	code, _, errOut := cliNoEntity(t, "", "status", "--index", path+".missing", "order-42")
	assert.Equal(t, exitUsage, code, "a missing index is never an empty answer")
	assert.Contains(t, errOut, ".missing")
}

// TestPendingFromIndex pages through every pending retry in due order, with the exact total, from the
// index alone.
func TestPendingFromIndex(t *testing.T) {
	t.Parallel()
	path, _ := indexFixture(t)
	var ids []string
	args := []string{"pending", "--index", path, "--limit", "2"}
	cursor := regexp.MustCompile(`--cursor (\S+)`)
	for range 4 {
		code, out, errOut := cliNoEntity(t, "", args...)
		require.Equal(t, exitOK, code, errOut)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		assert.Regexp(t, `^4 pending retries, from index .*, as of `, lines[0])
		require.Regexp(t, `^ENTITY\s+SEQ\s+DUE\s+ATTEMPT\s+ORIGINAL ID\s+LAST ERROR$`, lines[1])
		for _, l := range lines[2:] {
			if !strings.HasPrefix(l, "more:") {
				ids = append(ids, strings.Fields(l)[4])
			}
		}
		m := cursor.FindStringSubmatch(out)
		if m == nil {
			break
		}
		args = []string{"pending", "--index", path, "--limit", "2", "--cursor", m[1]}
	}
	assert.Equal(t, []string{"other-c", "other-a", "order-42", "other-b"}, ids, "due order")

	code, out, _ := cliNoEntity(t, "", "pending", "--index", path, "--json")
	require.Equal(t, exitOK, code)
	var page struct {
		Total   int64 `json:"total"`
		Pending []struct {
			OriginalMessageID string `json:"originalMessageId"`
			Ref               string `json:"ref"`
		} `json:"pending"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &page))
	assert.EqualValues(t, 4, page.Total)
	require.Len(t, page.Pending, 4)
	assert.Equal(t, "orders:101", page.Pending[0].Ref)

	code, _, _ = cliNoEntity(t, "", "pending", "--index", path, "--cursor", "bogus")
	assert.Equal(t, exitUsage, code)
}

// TestPendingSaysPartial: a page read from a scan stopped by --max-peek says so.
func TestPendingSaysPartial(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.seed(t, "pending-1", "pending-2", "pending-3")
	code, out, _ := h.cli(t, "", "pending", "--max-peek", "2")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "partial: read only 2 messages of orders (--max-peek); this page is in due order among those only")
	code, out, _ = h.cli(t, "", "pending")
	require.Equal(t, exitOK, code)
	assert.NotContains(t, out, "partial")
}

// TestIndexPostgresURLNeverPrintsThePassword: --index takes a PostgreSQL URL; what is printed about
// it (here, that it cannot be reached) names the database and host, never the password.
func TestIndexPostgresURLNeverPrintsThePassword(t *testing.T) {
	t.Parallel()
	for _, cmd := range [][]string{{"status", "order-42"}, {"pending"}} {
		code, out, errOut := cliNoEntity(t, "", append(cmd, "--index", "postgres://ops:hunter2@127.0.0.1:1/retries?connect_timeout=5")...)
		assert.Equal(t, exitError, code)
		assert.NotContains(t, out+errOut, "hunter2")
		assert.Contains(t, errOut, "opening the index in postgres database retries on 127.0.0.1")
	}
	code, _, errOut := cliNoEntity(t, "", "status", "x", "--index", "postgres://ops:hunter2@[::1")
	assert.Equal(t, exitUsage, code)
	assert.NotContains(t, errOut, "hunter2")
}

// TestStatusFromPostgresIndex answers from the shared store on a real PostgreSQL server, as from a
// file.
func TestStatusFromPostgresIndex(t *testing.T) {
	t.Parallel()
	conn := pgtest.Database(t)
	s, err := postgres.Open(context.Background(), conn, nil)
	require.NoError(t, err)
	env := envelope.Envelope{Source: "orders", FirstSequenceNumber: 5, OriginalMessageID: "order-42"}
	due := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
	require.NoError(t, s.Apply(context.Background(), []retryindex.Record{{
		Chain: env.ChainID(), OriginalID: "order-42", Key: "order-42", CorrelationID: "order-42", Source: "orders",
		Kind: retryindex.KindScheduled, Attempt: 1, NextAttempt: 2, At: time.Now(), NextDue: due, Entity: "orders", SequenceNumber: 8,
		Error: "downstream unavailable", Process: "billing-1", Feed: retryindex.FeedConsumer,
	}}))
	require.NoError(t, s.Close())
	// The harness's keyword form as a URL: postgres:///DB?host=SOCKETDIR&user=sbretry.
	var host, db string
	for _, kv := range strings.Fields(conn) {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "host":
			host = v
		case "dbname":
			db = v
		}
	}
	url := "postgres:///" + db + "?host=" + host + "&user=sbretry"
	code, out, errOut := cliNoEntity(t, "", "status", "--index", url, "order-42")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "order-42 on the index: from index postgres database "+db+" on "+host+", as of ")
	assert.Contains(t, out, "will be retried at "+formatTime(due)+" (attempt 2)")
	assert.Contains(t, out, "sequence number 8 in orders")
	code, out, _ = cliNoEntity(t, "", "pending", "--index", url)
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "1 pending retries, from index postgres database "+db)
}
