package console

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/retryindex"
)

// The index-backed pages' benchmarks read an SQLite index of CONSOLE_BENCH_PENDING (1,000,000)
// pending retries and CONSOLE_BENCH_DEAD (100,000) dead letters of the queue "orders", built once per
// process in a temporary directory and deleted at its end. With CONSOLE_BENCH_INDEX=PATH the index is
// built in that file instead, kept, and reused by later runs when it exists (the build takes about a
// minute on 2 cores).
var benchIdx struct {
	once          sync.Once
	dir, path     string
	pending, dead int
	err           error
}

// benchIndexT0 is the fill's "now": pending retries fall due over the following day.
var benchIndexT0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

// benchIndexRecords are the records of the i-th event of the fill: a pending retry of attempt 2 (its
// copy at sequence number i+1 of orders, due at a pseudo-random second of the next day), or an event
// dead-lettered at its third attempt (at sequence number i+1 of the dead-letter queue, as a tailer
// records it), its last error one of 8 kinds with numbers in it.
func benchIndexRecords(i int, dead bool) []retryindex.Record {
	id := fmt.Sprintf("order-%08d", i)
	env := envelope.Envelope{Source: "orders", FirstSequenceNumber: int64(i + 1), OriginalMessageID: id}
	base := retryindex.Record{Chain: env.ChainID(), OriginalID: id, Key: id, CorrelationID: id, Source: "orders",
		Process: "billing-7f9c4d/1", Feed: retryindex.FeedConsumer, Entity: "orders", SequenceNumber: int64(i + 1),
		Error: fmt.Sprintf("ledger kind %d: POST /entries/%d: 503 Service Unavailable after %dms", i%8, i, 100+i%900)}
	at := benchIndexT0.Add(-time.Duration(i%3600) * time.Second)
	if !dead {
		r := base
		r.Kind, r.Attempt, r.NextAttempt, r.At = retryindex.KindScheduled, 1, 2, at
		r.NextDue = benchIndexT0.Add(time.Duration((i*7919)%86400) * time.Second)
		return []retryindex.Record{r}
	}
	r := base
	r.Kind, r.Attempt, r.At, r.Reason = retryindex.KindDeadLettered, 3, at.Add(3*time.Minute), "RetryMaxAttemptsExceeded"
	r.Entity, r.Feed = "orders/$DeadLetterQueue", retryindex.FeedTailer
	return []retryindex.Record{r}
}

// benchIndexPath returns the path of the filled index, building it on first use.
func benchIndexPath(b *testing.B) string {
	b.Helper()
	benchIdx.once.Do(func() {
		benchIdx.pending = benchEnvInt("CONSOLE_BENCH_PENDING", 1_000_000)
		benchIdx.dead = benchEnvInt("CONSOLE_BENCH_DEAD", 100_000)
		if benchIdx.path = os.Getenv("CONSOLE_BENCH_INDEX"); benchIdx.path != "" {
			if _, err := os.Stat(benchIdx.path); err == nil {
				return // built by an earlier run
			}
		} else {
			if benchIdx.dir, benchIdx.err = os.MkdirTemp("", "console-bench-"); benchIdx.err != nil {
				return
			}
			benchIdx.path = filepath.Join(benchIdx.dir, "index.db")
		}
		s, err := retryindex.OpenSQLite(benchIdx.path, nil)
		if err != nil {
			benchIdx.err = err
			return
		}
		defer func() { _ = s.Close() }()
		const batch = 10_000
		var rs []retryindex.Record
		total := benchIdx.pending + benchIdx.dead
		for i := range total {
			rs = append(rs, benchIndexRecords(i, i >= benchIdx.pending)...)
			if len(rs) >= batch || i == total-1 {
				if benchIdx.err = s.Apply(context.Background(), rs); benchIdx.err != nil {
					return
				}
				rs = rs[:0]
			}
		}
	})
	if benchIdx.err != nil {
		b.Fatal(benchIdx.err)
	}
	return benchIdx.path
}

// removeBenchIndex deletes the benchmarks' temporary index, if one was built; TestMain calls it.
func removeBenchIndex() {
	if benchIdx.dir != "" {
		_ = os.RemoveAll(benchIdx.dir)
	}
}

// benchEnvInt reads a count from the environment, def when unset.
func benchEnvInt(name string, def int) int {
	var n int
	if _, err := fmt.Sscan(os.Getenv(name), &n); err == nil && n > 0 {
		return n
	}
	return def
}

// BenchmarkPagesFromIndex times each index-backed page on 1,000,000 pending retries and 100,000 dead
// letters in the embedded SQLite index (opened read-only, as sbretry serve --index opens it), through
// the handler (no network; the overview's broker sample is taken once, before the timing):
//
//	CONSOLE_BENCH_INDEX=/tmp/console-bench.db go test -run='^$' -bench=BenchmarkPagesFromIndex -benchtime=5x -count=7 ./console
//
// "dedicated" is a console with Options.IndexDedicated (deprecated: the index holds its entity's
// events only); "by-source" one without, whose pages list and count by source entity, as on a shared
// index, through the stores' indexes and counts by source. "overview" counts both states of the
// entity; "pending" is the first page (50 rows in due order, the exact total); "pending-deep" the page
// after the 500,000th retry (by the index's cursor); "timeline" the chart's data (every pending retry,
// counted by due time); "deadletters" the first page of dead letters newest first, with the failure
// groups of the most recent 2,000; "group" the largest group's first page.
func BenchmarkPagesFromIndex(b *testing.B) {
	path := benchIndexPath(b)
	store, err := retryindex.OpenSQLite(path, &retryindex.SQLiteOptions{ReadOnly: true})
	require.NoError(b, err)
	b.Cleanup(func() { _ = store.Close() })
	_, client := benchEmulator(b, []string{"orders"})
	// A cursor half way through the backlog: the index's own, as the 10,000th page's Next link has it.
	deep, err := store.Pending(context.Background(), &retryindex.PendingOptions{Limit: benchIdx.pending / 2})
	require.NoError(b, err)
	pendingTotal := regexp.MustCompile(fmt.Sprintf(`<h2 id="pending-total">%d pending retries`, benchIdx.pending))
	pages := []struct {
		name, path string
		want       *regexp.Regexp
	}{
		{"overview", "/", regexp.MustCompile(fmt.Sprintf(`class="num index-pending">%d<`, benchIdx.pending))},
		{"pending", "/pending?e=orders", pendingTotal},
		{"pending-deep", "/pending?e=orders&cursor=" + deep.Next, pendingTotal},
		{"timeline", "/api/timeline?e=orders", regexp.MustCompile(fmt.Sprintf(`"total":%d,.*"fromIndex":true`, benchIdx.pending))},
		{"deadletters", "/deadletters?e=orders", regexp.MustCompile(fmt.Sprintf(
			`<h2 id="deadletter-total">%d dead letters in \d+ failure groups? among the %d most recent`, benchIdx.dead, min(benchIdx.dead, indexGroupWindow)))},
		{"group", "", regexp.MustCompile(`<table id="group-items" data-from="index">`)},
	}
	groupPage := &pages[len(pages)-1]
	for _, dedicated := range []bool{true, false} {
		c, err := New(client, []Entity{{Path: "orders", MaxAttempts: 5}}, &Options{Index: store, IndexDedicated: dedicated, AllowedHosts: []string{"example.com"}})
		require.NoError(b, err)
		c.now = func() time.Time { return benchIndexT0 }
		get(b, c, "/") // the broker's sample, once
		if dedicated {
			// The largest failure group, as the dead-letter page links it.
			g := groupPattern.FindStringSubmatch(get(b, c, "/deadletters?e=orders").Body.String())
			require.NotNil(b, g)
			groupPage.path = "/group?e=orders&g=" + g[1]
		}
		name := "dedicated"
		if !dedicated {
			name = "by-source"
		}
		for _, p := range pages {
			b.Run(name+"/"+p.name, func(b *testing.B) {
				for b.Loop() {
					rec := get(b, c, p.path)
					if !p.want.Match(rec.Body.Bytes()) {
						b.Fatalf("%s: %s", p.path, regexp.MustCompile(`<h2 id="[a-z-]+total">[^<]*`).FindString(rec.Body.String()))
					}
				}
			})
		}
	}
}
