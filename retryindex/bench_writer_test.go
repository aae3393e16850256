package retryindex

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/cputime"
)

// BenchmarkWriterBatch is the recorder writer's cost alone: each op stores one batch of 512 records,
// each a first attempt's failure (a new event with a retry scheduled), the record the failure path of
// BenchmarkConsumerPaired writes for every message, into an index that grows op by op. It reports
// the process's CPU time per record.
//
//	go test -run='^$' -bench=BenchmarkWriterBatch -benchtime=200x -count=5 ./retryindex
func BenchmarkWriterBatch(b *testing.B) {
	batch := benchEnv("XBATCH", 512)
	s, _ := openTemp(b, nil)
	// The recorder's writer bounds each write with a timeout: so does the benchmark, since a context
	// that can end costs the driver a watch per statement.
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	rs := make([]Record, batch)
	n := 0
	var cpu time.Duration
	for b.Loop() {
		b.StopTimer()
		for i := range rs {
			id := "order-" + strconv.Itoa(n)
			env := envelope.Envelope{Source: "orders", FirstSequenceNumber: int64(n + 1), OriginalMessageID: id}
			rs[i] = Record{Chain: env.ChainID(), OriginalID: id, Key: id, CorrelationID: id, Source: "orders",
				Kind: KindScheduled, Attempt: 1, NextAttempt: 2, At: benchT0, NextDue: benchT0.Add(time.Duration(n%3600) * time.Second),
				Entity: "orders", SequenceNumber: int64(n + 1), Process: "billing-7f9c4d/1", Feed: FeedConsumer,
				Error: "ledger: POST /entries: 503 Service Unavailable (retry later)"}
			n++
		}
		b.StartTimer()
		c0 := cputime.Process()
		if err := s.Apply(ctx, rs); err != nil {
			b.Fatal(err)
		}
		cpu += cputime.Process() - c0
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(n), "cpu-ns/record")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/record")
}
