package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/retryindex"
)

// deadIndexFixture writes an index with five dead-lettered events dead-lettered a minute apart
// (dead-0 the oldest, dead-4 the newest; dead-1 and dead-3 for a reason of their own, dead-2 with
// two immediate retries), a pending one, and a loss of 3 records noted by the consumer's feed.
func deadIndexFixture(t *testing.T) (string, time.Time) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "index.db")
	s, err := retryindex.OpenSQLite(path, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	t0 := time.Now().UTC().Truncate(time.Millisecond).Add(-time.Hour)
	var records []retryindex.Record
	for i := range 6 {
		id := fmt.Sprintf("dead-%d", i)
		env := envelope.Envelope{Source: "orders", FirstSequenceNumber: int64(i + 1), OriginalMessageID: id}
		r := retryindex.Record{Chain: env.ChainID(), OriginalID: id, Key: id, CorrelationID: id, Source: "orders",
			Kind: retryindex.KindDeadLettered, Attempt: 3, At: t0.Add(time.Duration(i) * time.Minute), Process: "billing/1",
			Feed: retryindex.FeedConsumer, Error: "ledger said no", Reason: "RetryMaxAttemptsExceeded", Entity: "orders/$DeadLetterQueue"}
		if i%2 == 1 {
			r.Reason, r.Error = "PermanentFailure", "invalid amount"
		}
		if i == 2 {
			r.Immediate = 2
		}
		if i == 5 {
			r.OriginalID, r.Key, r.CorrelationID = "pending-5", "pending-5", "pending-5"
			r.Kind, r.Reason, r.NextAttempt, r.NextDue, r.Entity = retryindex.KindScheduled, "", 4, t0.Add(2*time.Hour), "orders"
		}
		records = append(records, r)
	}
	ctx := context.Background()
	require.NoError(t, s.Apply(ctx, records))
	require.NoError(t, s.NoteLost(ctx, "consumer billing/1", 3))
	return path, t0
}

// TestDlqListFromIndex pages through the dead-lettered events newest first from the index alone, with
// the exact total and the freshness (the feed's lost records included); the filters mean what they
// mean for a scan; a bad cursor is a usage error.
func TestDlqListFromIndex(t *testing.T) {
	t.Parallel()
	path, t0 := deadIndexFixture(t)
	var ids []string
	args := []string{"dlq", "list", "--index", path, "--limit", "2"}
	cursor := regexp.MustCompile(`--cursor (\S+)`)
	for range 5 {
		code, out, errOut := cliNoEntity(t, "", args...)
		require.Equal(t, exitOK, code, errOut)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		assert.Regexp(t, `^5 dead-lettered events, from index .*, as of `, lines[0])
		assert.Contains(t, lines[0], "LOST 3 records", "the feed's loss is in every answer")
		require.Regexp(t, `^ENTITY\s+SEQ\s+DEAD-LETTERED\s+REASON\s+ATTEMPT\s+ORIGINAL ID\s+LAST ERROR$`, lines[1])
		for _, l := range lines[2:] {
			if !strings.HasPrefix(l, "more:") {
				ids = append(ids, strings.Fields(l)[5])
			}
		}
		m := cursor.FindStringSubmatch(out)
		if m == nil {
			break
		}
		args = []string{"dlq", "list", "--index", path, "--limit", "2", "--cursor", m[1]}
	}
	assert.Equal(t, []string{"dead-4", "dead-3", "dead-2", "dead-1", "dead-0"}, ids, "newest first, each once, no pending event")

	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"reason", []string{"--reason", "permanentfailure"}, []string{"dead-3", "dead-1"}},
		{"reason, a page of one", []string{"--reason", "PermanentFailure", "--limit", "1"}, []string{"dead-3"}},
		{"contains", []string{"--contains", "LEDGER"}, []string{"dead-4", "dead-2", "dead-0"}},
		{"since", []string{"--since", t0.Add(150 * time.Second).Format(time.RFC3339Nano)}, []string{"dead-4", "dead-3"}},
		{"until", []string{"--until", t0.Add(2 * time.Minute).Format(time.RFC3339Nano)}, []string{"dead-1", "dead-0"}},
		{"nothing", []string{"--reason", "Nope"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := cliNoEntity(t, "", append([]string{"dlq", "list", "--index", path, "--json"}, tc.args...)...)
			require.Equal(t, exitOK, code, errOut)
			var page struct {
				From        string `json:"from"`
				Total       int64  `json:"total"`
				Next        string `json:"next"`
				DeadLetters []struct {
					OriginalMessageID string `json:"originalMessageId"`
				} `json:"deadLetters"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &page), out)
			assert.Equal(t, "index", page.From)
			assert.EqualValues(t, 5, page.Total)
			var got []string
			for _, d := range page.DeadLetters {
				got = append(got, d.OriginalMessageID)
			}
			assert.Equal(t, tc.want, got)
		})
	}
	code, out, _ := cliNoEntity(t, "", "dlq", "list", "--index", path, "--reason", "PermanentFailure", "--limit", "1")
	require.Equal(t, exitOK, code)
	m := cursor.FindStringSubmatch(out)
	require.NotNil(t, m, "a filtered page full before the index ended continues: %s", out)
	code, out, _ = cliNoEntity(t, "", "dlq", "list", "--index", path, "--reason", "PermanentFailure", "--cursor", m[1])
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "dead-1")
	assert.NotContains(t, out, "dead-3", "the continuation starts after the page")

	code, _, _ = cliNoEntity(t, "", "dlq", "list", "--index", path, "--cursor", "bogus")
	assert.Equal(t, exitUsage, code)
	// The index keeps neither properties nor bodies: filtering on them there is refused, not ignored.
	for _, flag := range [][]string{{"--property", "tenant=a"}, {"--body-contains", "x"}} {
		code, _, errOut := cliNoEntity(t, "", append([]string{"dlq", "list", "--index", path}, flag...)...)
		assert.Equal(t, exitUsage, code, "%v", flag)
		assert.Contains(t, errOut, "drop --index", "%v", flag)
	}
}

// TestIndexJSONHasImmediate: status and pending --index --json carry each event's and each history
// entry's immediate retries, zero included, and each feed's lost records.
func TestIndexJSONHasImmediate(t *testing.T) {
	t.Parallel()
	path, _ := deadIndexFixture(t)
	code, out, errOut := cliNoEntity(t, "", "status", "--index", path, "dead-2", "--json")
	require.Equal(t, exitOK, code, errOut)
	var st struct {
		Feeds  []map[string]any `json:"feeds"`
		Events []map[string]any `json:"events"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	require.Len(t, st.Events, 1)
	assert.EqualValues(t, 2, st.Events[0]["immediate"])
	history := st.Events[0]["history"].([]any)
	require.Len(t, history, 1)
	assert.EqualValues(t, 2, history[0].(map[string]any)["immediate"])
	require.Len(t, st.Feeds, 1)
	assert.EqualValues(t, 3, st.Feeds[0]["lost"])

	code, out, errOut = cliNoEntity(t, "", "pending", "--index", path, "--json")
	require.Equal(t, exitOK, code, errOut)
	var page struct {
		Pending []map[string]any `json:"pending"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &page), out)
	require.Len(t, page.Pending, 1)
	v, ok := page.Pending[0]["immediate"]
	assert.True(t, ok, "present when zero: %s", out)
	assert.EqualValues(t, 0, v)

	code, out, _ = cliNoEntity(t, "", "status", "--index", path, "dead-2")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "(after 2 immediate retries)")
}

// TestDlqListSaysPartial: a dead-letter listing read from a scan stopped by --max-peek says so, in
// text and in JSON.
func TestDlqListSaysPartial(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.seed(t, "perm-1", "perm-2", "perm-3")
	code, out, _ := h.cli(t, "", "dlq", "list", "--max-peek", "2")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "partial: read only 2 messages of orders/$DeadLetterQueue (--max-peek); dead letters beyond them are not listed")
	code, out, _ = h.cli(t, "", "dlq", "list", "--max-peek", "2", "--json")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, `"partial": true`)
	code, out, _ = h.cli(t, "", "dlq", "list")
	require.Equal(t, exitOK, code)
	assert.NotContains(t, out, "partial")
	code, _, _ = h.cli(t, "", "dlq", "list", "--cursor", "1.2")
	assert.Equal(t, exitUsage, code, "a scan has no cursor")
}
