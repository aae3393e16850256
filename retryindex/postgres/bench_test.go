package postgres

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/retryindex"
	"github.com/sbretry/retry/retryindex/postgres/pgtest"
)

// benchEvents reads a count from the environment, def when unset.
func benchEvents(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// backlog is the i-th event of the benchmarks' fill, the same mix as the embedded store's benchmarks
// (retryindex/bench_test.go): a pending retry due within a day, or three attempts and a dead letter.
func backlog(i int, dead bool, t0 time.Time) []retryindex.Record {
	id := fmt.Sprintf("order-%08d", i)
	env := envelope.Envelope{Source: "orders", FirstSequenceNumber: int64(i + 1), OriginalMessageID: id}
	base := retryindex.Record{Chain: env.ChainID(), OriginalID: id, Key: id, CorrelationID: id, Source: "orders", Process: "billing-7f9c4d/1",
		Feed: retryindex.FeedConsumer, Entity: "orders", Error: "ledger: POST /entries: 503 Service Unavailable (retry later)"}
	at := t0.Add(-time.Duration(i%3600) * time.Second)
	if !dead {
		r := base
		r.Kind, r.Attempt, r.NextAttempt, r.At, r.NextDue, r.SequenceNumber = retryindex.KindScheduled, 1, 2, at, t0.Add(time.Duration((i*7919)%86400)*time.Second), int64(i+1)
		return []retryindex.Record{r}
	}
	var out []retryindex.Record
	for n := 1; n <= 2; n++ {
		r := base
		r.Kind, r.Attempt, r.NextAttempt, r.At, r.NextDue = retryindex.KindScheduled, n, n+1, at.Add(time.Duration(n)*time.Minute), at.Add(time.Duration(n+1)*time.Minute)
		out = append(out, r)
	}
	r := base
	r.Kind, r.Attempt, r.At, r.Reason, r.Entity = retryindex.KindDeadLettered, 3, at.Add(3*time.Minute), "RetryMaxAttemptsExceeded", "orders/$DeadLetterQueue"
	return append(out, r)
}

// BenchmarkPostgres fills a database on a real local server (Unix socket, fsync off as the test
// server runs) with RETRYINDEX_PG_PENDING pending retries (100,000 by default) and a tenth as many
// dead-lettered events, then times the questions: lookup p50 and p99 of 1,000 random events, the
// first page of pending (p50 and p99 of 100, each checked: 50 items and the exact total), the same
// page and the first page of dead letters of the source entity "orders" (as a console on a shared
// index reads them), the counts, the pending retries of "orders" counted by due time in 48 buckets of
// half an hour (the console's chart, each checked to add up to the total), and reports the fill rate
// and the bytes per event (pg_total_relation_size of the tables over the events).
//
//	go test -run='^$' -bench=BenchmarkPostgres -benchtime=1x ./retryindex/postgres
//
// The fill takes minutes at the goal's backlog (a million events), so RETRYINDEX_PG_BENCH_CONN may
// name a database of a server of your own: it is filled when empty and reused as it is otherwise (the
// fill rate is then not reported), so that several runs time the questions on one fill.
func BenchmarkPostgres(b *testing.B) {
	pending := benchEvents("RETRYINDEX_PG_PENDING", 100_000)
	dead := pending / 10
	conn := os.Getenv("RETRYINDEX_PG_BENCH_CONN")
	if conn == "" {
		conn = pgtestDatabase(b)
	}
	ctx := context.Background()
	s, err := Open(ctx, conn, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	c, err := s.Counts(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	filled := c.ByState[retryindex.StatePending] == int64(pending) && c.ByState[retryindex.StateDeadLettered] == int64(dead)
	if !filled && len(c.ByState) > 0 {
		b.Fatalf("the database holds another fill: %v", c.ByState)
	}
	start := time.Now()
	var rs []retryindex.Record
	records := 0
	for i := range pending + dead {
		if filled {
			break
		}
		rs = append(rs, backlog(i, i >= pending, t0)...)
		if len(rs) >= 5000 || i == pending+dead-1 {
			if err := s.Apply(ctx, rs); err != nil {
				b.Fatal(err)
			}
			records += len(rs)
			rs = rs[:0]
		}
	}
	fill := time.Since(start)
	if _, err := s.pool.Exec(ctx, "VACUUM ANALYZE"); err != nil {
		b.Fatal(err)
	}
	var bytes int64
	err = s.pool.QueryRow(ctx, `SELECT sum(pg_total_relation_size(c)) FROM unnest(ARRAY['sbretry_events','sbretry_attempts','sbretry_feeds','sbretry_counts','sbretry_source_counts']::regclass[]) c`).Scan(&bytes)
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var lookups, pages, sourcePages, deadPages, counts, histograms []time.Duration
	for b.Loop() {
		for range 1000 {
			i := rng.IntN(pending + dead)
			t := time.Now()
			ans, err := s.Lookup(ctx, fmt.Sprintf("order-%08d", i), nil)
			lookups = append(lookups, time.Since(t))
			if err != nil || len(ans.Events) != 1 {
				b.Fatalf("%v %+v", err, ans)
			}
		}
		for range 100 {
			t := time.Now()
			page, err := s.Pending(ctx, &retryindex.PendingOptions{Limit: 50})
			pages = append(pages, time.Since(t))
			if err != nil || len(page.Items) != 50 || page.Total != int64(pending) {
				b.Fatalf("%v", err)
			}
			t = time.Now()
			if _, err := s.Counts(ctx, nil); err != nil {
				b.Fatal(err)
			}
			counts = append(counts, time.Since(t))
			t = time.Now()
			page, err = s.Pending(ctx, &retryindex.PendingOptions{Limit: 50, Source: "orders"})
			sourcePages = append(sourcePages, time.Since(t))
			if err != nil || len(page.Items) != 50 || page.Total != int64(pending) {
				b.Fatalf("%v", err)
			}
			t = time.Now()
			page, err = s.DeadLettered(ctx, &retryindex.PendingOptions{Limit: 50, Source: "orders"})
			deadPages = append(deadPages, time.Since(t))
			if err != nil || len(page.Items) != 50 || page.Total != int64(dead) {
				b.Fatalf("%v", err)
			}
		}
		for range 10 {
			t := time.Now()
			h, err := s.PendingHistogram(ctx, &retryindex.HistogramOptions{Source: "orders", From: t0, To: t0.Add(24*time.Hour - time.Millisecond), Width: 30 * time.Minute})
			histograms = append(histograms, time.Since(t))
			if err != nil {
				b.Fatal(err)
			}
			sum := h.Before + h.After
			for _, n := range h.Counts {
				sum += n
			}
			if sum != int64(pending) || h.Total != int64(pending) {
				b.Fatalf("the histogram counts %d of %d", sum, h.Total)
			}
		}
	}
	pct := func(ds []time.Duration, p float64) float64 {
		slices.Sort(ds)
		return float64(ds[min(len(ds)-1, int(float64(len(ds))*p))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(lookups, 0.5), "lookup-p50-ms")
	b.ReportMetric(pct(lookups, 0.99), "lookup-p99-ms")
	b.ReportMetric(pct(pages, 0.5), "page-p50-ms")
	b.ReportMetric(pct(pages, 0.99), "page-p99-ms")
	b.ReportMetric(pct(counts, 0.5), "counts-p50-ms")
	b.ReportMetric(pct(sourcePages, 0.5), "source-page-p50-ms")
	b.ReportMetric(pct(sourcePages, 0.99), "source-page-p99-ms")
	b.ReportMetric(pct(deadPages, 0.5), "source-dead-page-p50-ms")
	b.ReportMetric(pct(histograms, 0.5), "histogram-p50-ms")
	if !filled {
		b.ReportMetric(float64(records)/fill.Seconds(), "records/s")
	}
	b.ReportMetric(float64(bytes)/float64(pending+dead), "bytes/event")
	b.ReportMetric(float64(pending+dead), "events")
}

// pgtestDatabase is pgtest.Database for a benchmark.
func pgtestDatabase(b *testing.B) string {
	b.Helper()
	return pgtest.DatabaseTB(b)
}
