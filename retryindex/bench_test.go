package retryindex

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/cputime"
	"github.com/sbretry/retry/internal/sbtest"
)

// The benchmarks' index is filled directly (Apply), so that they run without the emulator: the
// backlog of issue 33's goals, 1,000,000 pending retries and 100,000 dead letters, unless
// RETRYINDEX_BENCH_PENDING and RETRYINDEX_BENCH_DEAD say otherwise. It is built once per process (a
// minute or two) in a temporary directory removed when the tests end; with RETRYINDEX_BENCH_FILE set,
// in that file instead, which is kept, and reused when it exists (to time sbretry status --index on
// it, say).
var bench struct {
	once        sync.Once
	dir, path   string
	pending     int
	dead        int
	fillSeconds float64
	err         error
}

// benchEnv reads a count from the environment, def when unset.
func benchEnv(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// benchT0 is the fill's fixed "now": pending retries fall due over the following day.
var benchT0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

// benchID is the original MessageID of the i-th event of the fill.
func benchID(i int) string { return fmt.Sprintf("order-%08d", i) }

// benchRecords are the records of the i-th event: pending events failed once (a retry scheduled, due
// at a pseudo-random time in the next day); dead-lettered ones failed three times and were
// dead-lettered. Error texts are of a realistic length (about 60 bytes).
func benchRecords(i int, dead bool) []Record {
	id := benchID(i)
	env := envelope.Envelope{Source: "orders", FirstSequenceNumber: int64(i + 1), OriginalMessageID: id}
	base := Record{Chain: env.ChainID(), OriginalID: id, Key: id, CorrelationID: id, Source: "orders", Process: "billing-7f9c4d/1",
		Feed: FeedConsumer, Entity: "orders", Error: "ledger: POST /entries: 503 Service Unavailable (retry later)"}
	at := benchT0.Add(-time.Duration(i%3600) * time.Second)
	due := benchT0.Add(time.Duration((i*7919)%86400) * time.Second)
	if !dead {
		r := base
		r.Kind, r.Attempt, r.NextAttempt, r.At, r.NextDue, r.SequenceNumber = KindScheduled, 1, 2, at, due, int64(i+1)
		return []Record{r}
	}
	var out []Record
	for n := 1; n <= 2; n++ {
		r := base
		r.Kind, r.Attempt, r.NextAttempt, r.At, r.NextDue = KindScheduled, n, n+1, at.Add(time.Duration(n)*time.Minute), at.Add(time.Duration(n+1)*time.Minute)
		out = append(out, r)
	}
	r := base
	r.Kind, r.Attempt, r.At, r.Reason, r.Entity = KindDeadLettered, 3, at.Add(3*time.Minute), "RetryMaxAttemptsExceeded", "orders/$DeadLetterQueue"
	return append(out, r)
}

// benchIndex returns the path of the filled index, building it on first use.
func benchIndex(b *testing.B) string {
	b.Helper()
	bench.once.Do(func() {
		bench.pending = benchEnv("RETRYINDEX_BENCH_PENDING", 1_000_000)
		bench.dead = benchEnv("RETRYINDEX_BENCH_DEAD", 100_000)
		if bench.path = os.Getenv("RETRYINDEX_BENCH_FILE"); bench.path != "" {
			if _, err := os.Stat(bench.path); err == nil {
				return // filled by an earlier run
			}
		} else {
			bench.dir, bench.err = os.MkdirTemp("", "retryindex-bench-")
			if bench.err != nil {
				return
			}
			bench.path = filepath.Join(bench.dir, "index.db")
		}
		var s *SQLite
		s, bench.err = OpenSQLite(bench.path, nil)
		if bench.err != nil {
			return
		}
		defer func() { _ = s.Close() }()
		start := time.Now()
		const batch = 10_000
		var rs []Record
		total := bench.pending + bench.dead
		for i := range total {
			rs = append(rs, benchRecords(i, i >= bench.pending)...)
			if len(rs) >= batch || i == total-1 {
				if bench.err = s.Apply(context.Background(), rs); bench.err != nil {
					return
				}
				rs = rs[:0]
			}
		}
		_, bench.err = s.write.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`)
		bench.fillSeconds = time.Since(start).Seconds()
	})
	if bench.err != nil {
		b.Fatal(bench.err)
	}
	return bench.path
}

// removeBenchIndex deletes the benchmarks' index, if one was built; TestMain calls it.
func removeBenchIndex() {
	if bench.dir != "" {
		_ = os.RemoveAll(bench.dir)
	}
}

// openBench opens the filled index read-only, as sbretry status --index does.
func openBench(b *testing.B) *SQLite {
	b.Helper()
	s, err := OpenSQLite(benchIndex(b), &SQLiteOptions{ReadOnly: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// percentile returns the p-th percentile (0..100) of ds, nearest rank.
func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

// BenchmarkLookup times status's question at the goal's backlog: each op looks up 100 random events
// (by original id, by retry MessageID, or by correlation id, in turn; pending and dead-lettered
// alike), checks every answer against what was filled, and reports the p50, p99 and max of the 100.
//
//	go test -run='^$' -bench=BenchmarkLookup -benchtime=20x ./retryindex
func BenchmarkLookup(b *testing.B) {
	s := openBench(b)
	total := bench.pending + bench.dead
	rng := rand.New(rand.NewPCG(1, 2))
	ctx := context.Background()
	var all []time.Duration
	for b.Loop() {
		for q := range 100 {
			i := rng.IntN(total)
			id := benchID(i)
			if q%3 == 1 {
				env := envelope.Envelope{Source: "orders", FirstSequenceNumber: int64(i + 1), OriginalMessageID: id}
				id = env.RetryMessageID(2)
			}
			start := time.Now()
			ans, err := s.Lookup(ctx, id, nil)
			all = append(all, time.Since(start))
			if err != nil {
				b.Fatal(err)
			}
			want := StatePending
			if i >= bench.pending {
				want = StateDeadLettered
			}
			if len(ans.Events) != 1 || ans.Events[0].State != want || ans.Events[0].OriginalID != benchID(i) {
				b.Fatalf("lookup %s: %+v, want one %v event", id, ans.Events, want)
			}
			if want == StatePending && !ans.Events[0].Due.Equal(benchRecords(i, false)[0].NextDue) {
				b.Fatalf("lookup %s: due %v", id, ans.Events[0].Due)
			}
		}
	}
	b.ReportMetric(float64(percentile(all, 50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(percentile(all, 99).Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(percentile(all, 100).Microseconds())/1000, "max-ms")
	b.ReportMetric(float64(total), "events")
}

// BenchmarkPendingFirstPage times pending's first page (50, in due order, with the exact total) at
// the goal's backlog, checking the order.
//
//	go test -run='^$' -bench=BenchmarkPendingFirstPage -benchtime=20x ./retryindex
func BenchmarkPendingFirstPage(b *testing.B) {
	s := openBench(b)
	ctx := context.Background()
	for b.Loop() {
		page, err := s.Pending(ctx, &PendingOptions{Limit: 50})
		if err != nil {
			b.Fatal(err)
		}
		if len(page.Items) != 50 || page.Total != int64(bench.pending) {
			b.Fatalf("%d items, total %d", len(page.Items), page.Total)
		}
		if !slices.IsSortedFunc(page.Items, func(x, y Event) int { return x.Due.Compare(y.Due) }) {
			b.Fatal("not in due order")
		}
	}
}

// BenchmarkPendingDeepPage times a page far into the listing (the cursor after the 500,000th
// pending retry, or the middle): a page costs its own size wherever it starts.
func BenchmarkPendingDeepPage(b *testing.B) {
	s := openBench(b)
	ctx := context.Background()
	var mid Event
	var midID int64
	err := s.readTx(ctx, func(tx *sqlTx, _ time.Time) error {
		row := tx.QueryRowContext(ctx, `SELECT `+eventColumns+` FROM events e INDEXED BY events_pending WHERE e.state = 1 ORDER BY e.due, e.id LIMIT 1 OFFSET ?`, bench.pending/2)
		var err error
		midID, mid, err = s.scanEvent(ctx, tx, row)
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	cursor := strconv.FormatInt(mid.Due.UnixMilli(), 10) + "." + strconv.FormatInt(midID, 10)
	for b.Loop() {
		page, err := s.Pending(ctx, &PendingOptions{Limit: 50, Cursor: cursor})
		if err != nil || len(page.Items) != 50 {
			b.Fatal(err, len(page.Items))
		}
	}
}

// BenchmarkBySource times what a console on a shared index asks for one source entity at the goal's
// backlog: the first page of its pending retries (50, in due order, with the exact total), the first
// page of its dead letters (newest first, exact total) and its counts, each checked; for the entity
// every event started on ("orders"), and for one none did ("invoices", as an entity with few events
// in an index of another's million: what a walk of the due-time index skipping other entities' rows
// cost most).
//
//	go test -run='^$' -bench=BenchmarkBySource -benchtime=20x ./retryindex
func BenchmarkBySource(b *testing.B) {
	s := openBench(b)
	ctx := context.Background()
	for _, c := range []struct {
		source      string
		pending     int
		dead, items int
	}{{"orders", bench.pending, bench.dead, 50}, {"invoices", 0, 0, 0}} {
		b.Run("source="+c.source, func(b *testing.B) {
			for b.Loop() {
				page, err := s.Pending(ctx, &PendingOptions{Limit: 50, Source: c.source})
				if err != nil || len(page.Items) != c.items || page.Total != int64(c.pending) {
					b.Fatalf("%v: %d items, total %d", err, len(page.Items), page.Total)
				}
				if !slices.IsSortedFunc(page.Items, func(x, y Event) int { return x.Due.Compare(y.Due) }) {
					b.Fatal("not in due order")
				}
				dead, err := s.DeadLettered(ctx, &PendingOptions{Limit: 50, Source: c.source})
				if err != nil || len(dead.Items) != c.items || dead.Total != int64(c.dead) {
					b.Fatalf("%v: %d dead letters, total %d", err, len(dead.Items), dead.Total)
				}
				n, err := s.Counts(ctx, &CountsOptions{Source: c.source})
				if err != nil || n.ByState[StatePending] != int64(c.pending) {
					b.Fatalf("%v: %+v", err, n)
				}
			}
		})
	}
}

// BenchmarkPendingHistogram times the pending retries of one source entity counted by due time at the
// goal's backlog, as the console's chart asks: 48 buckets of half an hour over the day they fall due
// in, each checked to add up to the total.
//
//	go test -run='^$' -bench=BenchmarkPendingHistogram -benchtime=20x ./retryindex
func BenchmarkPendingHistogram(b *testing.B) {
	s := openBench(b)
	ctx := context.Background()
	for b.Loop() {
		h, err := s.PendingHistogram(ctx, &HistogramOptions{Source: "orders", From: benchT0, To: benchT0.Add(24*time.Hour - time.Millisecond), Width: 30 * time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		sum := h.Before + h.After
		for _, n := range h.Counts {
			sum += n
		}
		if len(h.Counts) != 48 || sum != int64(bench.pending) || h.Total != sum {
			b.Fatalf("%d buckets counting %d of %d", len(h.Counts), sum, h.Total)
		}
	}
}

// BenchmarkCounts times the exact counts by state at the goal's backlog.
func BenchmarkCounts(b *testing.B) {
	s := openBench(b)
	ctx := context.Background()
	for b.Loop() {
		c, err := s.Counts(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		if c.ByState[StatePending] != int64(bench.pending) || c.ByState[StateDeadLettered] != int64(bench.dead) {
			b.Fatalf("%+v", c.ByState)
		}
	}
}

// BenchmarkIndexSize reports the bytes the filled index takes per event (file size after a
// checkpoint, over pending plus dead-lettered events; a pending event has one history entry, a
// dead-lettered one three) and how long the fill took, as records stored per second in batches of
// 10,000: the writer's capacity.
//
//	go test -run='^$' -bench=BenchmarkIndexSize -benchtime=1x ./retryindex
func BenchmarkIndexSize(b *testing.B) {
	path := benchIndex(b)
	for b.Loop() {
	}
	fi, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	events := bench.pending + bench.dead
	b.ReportMetric(float64(fi.Size())/float64(events), "bytes/event")
	b.ReportMetric(float64(fi.Size())/1e6, "MB")
	if bench.fillSeconds > 0 {
		b.ReportMetric(float64(bench.pending+3*bench.dead)/bench.fillSeconds, "records/s")
	}
}

// BenchmarkRecorderHook is what the hook costs the consumer's goroutine per delivery:
// case=first-success is the check that skips a first attempt's success; case=retry builds the record
// (the chain id is a SHA-256) and queues it, while the writer drains the queue (nothing may be
// dropped: the buffer holds every record of the run).
func BenchmarkRecorderHook(b *testing.B) {
	for _, tc := range []struct {
		name string
		n    int
		res  retry.Result
	}{
		{"case=first-success", 1, retry.Result{Outcome: retry.OutcomeCompleted}},
		{"case=retry", 1, retry.Result{Outcome: retry.OutcomeRetryScheduled, HandlerErr: sbtest.ErrDownstream, ScheduledFor: benchT0}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s, _ := openTemp(b, nil)
			r, err := NewRecorder(s, &RecorderOptions{Buffer: 1 << 22})
			if err != nil {
				b.Fatal(err)
			}
			hook := r.Hooks(retry.Hooks{}).OnProcessed
			ps := make([]retry.ProcessedParams, 1024)
			for i := range ps {
				ps[i] = processed(benchID(i), tc.n, tc.res)
				ps[i].Envelope.FirstSequenceNumber = int64(i)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				hook(ps[i%len(ps)])
				i++
			}
			b.StopTimer()
			if err := r.Close(context.Background()); err != nil {
				b.Fatal(err)
			}
			if st := r.Stats(); st.Dropped != 0 || st.Failed != 0 {
				b.Fatalf("%+v", st)
			}
		})
	}
}

// BenchmarkConsumerPaired measures what keeping the index costs a real consumer (the SDK and the
// in-process emulator on loopback, MaxConcurrency 16): each op is one pair of rounds of 500 messages
// drained by a consumer without the recorder and one with it (SQLite in the temporary directory), in
// alternating order. It reports, per message, the median wall time of each and the process CPU time
// of each (the recorder's writer included: it is in the process; the CPU time moves less with the
// neighbours' load than the wall time), and the medians of the per-pair ratios with their quartiles
// (overhead-%, overhead-p25-%, overhead-p75-%; issue 33's goal: at most 5 %). case=success completes
// every message (a first attempt's success, which the recorder skips by default); case=failures fails
// each once, so every message schedules a retry copy (due in an hour) and the index records a pending
// retry.
//
//	go test -run='^$' -bench=BenchmarkConsumerPaired -benchtime=20x -count=3 ./retryindex
func BenchmarkConsumerPaired(b *testing.B) {
	for _, fail := range []bool{false, true} {
		name := "case=success"
		if fail {
			name = "case=failures"
		}
		b.Run(name, func(b *testing.B) {
			const n = 500
			h := sbtest.New(b)
			var s Store
			s, _ = openTemp(b, nil)
			if os.Getenv("XDISCARD") != "" {
				s = discardStore{s}
			}
			handler := func(_ context.Context, m *azservicebus.ReceivedMessage) error {
				if fail && m.ApplicationProperties[envelope.PropAttempt] == nil {
					return sbtest.ErrDownstream
				}
				return nil
			}
			var without, with, cpuWithout, cpuWith []time.Duration
			var ratios, cpuRatios []float64
			round := 0
			runRound := func(index bool) (wall, cpu time.Duration) {
				msgs := make([]*azservicebus.Message, n)
				for i := range msgs {
					msgs[i] = sbtest.Message(fmt.Sprintf("r%d-%d", round, i))
				}
				round++
				h.Send(b, msgs...)
				opts := retry.Options{Backoff: backoff.Constant{Interval: time.Hour}, MaxConcurrency: 16}
				var rec *Recorder
				if index {
					var err error
					if rec, err = NewRecorder(s, nil); err != nil {
						b.Fatal(err)
					}
					opts.Hooks = rec.Hooks(retry.Hooks{})
				}
				cpu0 := cputime.Process()
				wall = drain(b, h, handler, opts, n)
				if rec != nil {
					// The writer's last batch is the with-round's cost too.
					if err := rec.Close(context.Background()); err != nil {
						b.Fatal(err)
					}
					want := int64(0) // a first attempt's success is not recorded by default
					if fail {
						want = n
					}
					if st := rec.Stats(); st.Stored != want || st.Dropped != 0 {
						b.Fatalf("recorder %+v", st)
					}
				}
				return wall, cputime.Process() - cpu0
			}
			for i := 0; b.Loop(); i++ {
				var a, c, ca, cc time.Duration
				if i%2 == 0 {
					a, ca = runRound(false)
					c, cc = runRound(true)
				} else {
					c, cc = runRound(true)
					a, ca = runRound(false)
				}
				without, with = append(without, a), append(with, c)
				cpuWithout, cpuWith = append(cpuWithout, ca), append(cpuWith, cc)
				ratios = append(ratios, float64(c)/float64(a))
				cpuRatios = append(cpuRatios, float64(cc)/float64(ca))
			}
			b.ReportMetric(float64(percentile(without, 50).Nanoseconds())/n, "without-ns/msg")
			b.ReportMetric(float64(percentile(with, 50).Nanoseconds())/n, "with-ns/msg")
			b.ReportMetric(float64(percentile(cpuWithout, 50).Nanoseconds())/n, "without-cpu-ns/msg")
			b.ReportMetric(float64(percentile(cpuWith, 50).Nanoseconds())/n, "with-cpu-ns/msg")
			slices.Sort(ratios)
			slices.Sort(cpuRatios)
			q := func(xs []float64, p float64) float64 { return (xs[min(len(xs)-1, int(float64(len(xs))*p))] - 1) * 100 }
			b.ReportMetric(q(ratios, 0.5), "overhead-%")
			b.ReportMetric(q(ratios, 0.25), "overhead-p25-%")
			b.ReportMetric(q(ratios, 0.75), "overhead-p75-%")
			b.ReportMetric(q(cpuRatios, 0.5), "cpu-overhead-%")
		})
	}
}

// drain runs a consumer with opts until it processed n messages and returns how long that took,
// connection set-up excluded (the clock starts at the first message processed... and measures to the
// last: a round's throughput).
func drain(b *testing.B, h *sbtest.Harness, handler retry.Handler, opts retry.Options, n int) time.Duration {
	b.Helper()
	connect, err := retry.NewNamespace(h.Em.ConnectionString(), &retry.ConnectOptions{Client: &azservicebus.ClientOptions{RetryOptions: sbtest.FastRetries}}).Queue(sbtest.Queue)
	if err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	var first, last time.Time
	count := 0
	done := make(chan struct{})
	next := opts.Hooks.OnProcessed
	opts.Hooks.OnProcessed = func(p retry.ProcessedParams) {
		if next != nil {
			next(p)
		}
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		if count == 0 {
			first = now.Add(-p.Duration)
		}
		last = now
		count++
		if count == n {
			close(done)
		}
	}
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := retry.NewConsumer(connect, handler, &opts)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	timeout := time.NewTimer(2 * time.Minute)
	defer timeout.Stop()
	select {
	case <-done:
	case <-timeout.C:
		b.Fatalf("processed %d of %d", count, n)
	}
	cancel()
	if err := <-ran; err != nil {
		b.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	return last.Sub(first)
}

// BenchmarkTailerRebuild times a rebuild from the broker (Tailer.Rebuild into an empty index) of a
// queue holding RETRYINDEX_BENCH_REBUILD pending retry copies (20,000 by default) made by a real
// consumer on the in-process emulator, and reports copies read per second: the rebuild is a peek of
// the whole backlog, linear in it.
//
//	go test -run='^$' -bench=BenchmarkTailerRebuild -benchtime=3x ./retryindex
func BenchmarkTailerRebuild(b *testing.B) {
	n := benchEnv("RETRYINDEX_BENCH_REBUILD", 20_000)
	h := sbtest.New(b)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("pending-%d", i)
	}
	h.Seed(b, ids...)
	ctx := context.Background()
	var total time.Duration
	for b.Loop() {
		b.StopTimer()
		s, err := OpenSQLite(filepath.Join(b.TempDir(), "index.db"), nil)
		if err != nil {
			b.Fatal(err)
		}
		tl, err := NewTailer(h.Client, s, sbtest.Queue, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		res, err := tl.Rebuild(ctx)
		total += time.Since(start)
		b.StopTimer()
		if err != nil || res.Recorded != n {
			b.Fatalf("%+v: %v", res, err)
		}
		c, err := s.Counts(ctx, nil)
		if err != nil || c.ByState[StatePending] != int64(n) {
			b.Fatalf("%+v: %v", c, err)
		}
		_ = s.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(n)*float64(b.N)/total.Seconds(), "copies/s")
}

type discardStore struct{ Store }

func (discardStore) Apply(context.Context, []Record) error { return nil }
