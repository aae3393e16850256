package inspect

import (
	"testing"

	"github.com/sbretry/retry/internal/sbtest"
)

// BenchmarkInspector10kPending measures what the inspector costs on a queue holding 10,000 pending
// retries, created by a real retry.Consumer through the SDK and the emulator on loopback:
//
//	go test -run='^$' -bench=BenchmarkInspector10kPending -benchtime=10x ./inspect
//
// Each sub-benchmark reports the messages peeked and the peek requests per operation next to the time.
func BenchmarkInspector10kPending(b *testing.B) {
	const n = 10_000
	h := newHarness(b)
	seedPending(b, h, n)
	ctx := sbtest.Context(b)
	report := func(b *testing.B, scans []Scan) {
		peeked, reqs := 0, 0
		for _, s := range scans {
			peeked += s.Peeked
			reqs += s.Requests
		}
		b.ReportMetric(float64(peeked), "peeked/op")
		b.ReportMetric(float64(reqs), "requests/op")
	}
	for _, bc := range []struct {
		name string
		opts *Options
	}{
		{"default options", nil},
		{"MaxPeek 20000", &Options{MaxPeek: 20_000}},
		{"MaxPeek 20000 batch 1000", &Options{MaxPeek: 20_000, PeekBatchSize: 1000}},
	} {
		in := h.inspector(b, bc.opts)
		b.Run("status/"+bc.name, func(b *testing.B) {
			var scans []Scan
			for b.Loop() {
				st, err := in.Status(ctx, "job-5000")
				if err != nil || len(st.Pending) != 1 {
					b.Fatalf("status: %v, %d pending", err, len(st.Pending))
				}
				scans = st.Scans
			}
			report(b, scans)
		})
		b.Run("pending full listing in one page/"+bc.name, func(b *testing.B) {
			var scans []Scan
			for b.Loop() {
				page, err := in.ListPending(ctx, PageOptions{Limit: n})
				if err != nil || len(page.Items) != n {
					b.Fatalf("pending: %v, %d items", err, len(page.Items))
				}
				scans = page.Scans
			}
			report(b, scans)
		})
	}
	in := h.inspector(b, &Options{MaxPeek: 20_000})
	b.Run("pending full listing in pages of 1000/MaxPeek 20000", func(b *testing.B) {
		var all []Scan
		for b.Loop() {
			all = all[:0]
			cursor, items := "", 0
			for {
				page, err := in.ListPending(ctx, PageOptions{Limit: 1000, Cursor: cursor})
				if err != nil {
					b.Fatal(err)
				}
				items += len(page.Items)
				all = append(all, page.Scans...)
				if cursor = page.Next; cursor == "" {
					break
				}
			}
			if items != n {
				b.Fatalf("%d items", items)
			}
		}
		report(b, all)
	})
}
