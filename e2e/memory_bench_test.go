//go:build !live

package e2e

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/sbemu/broker"
)

// BenchmarkConsumeMemory drains a backlog of b.N messages of 16 KiB with 64 at once, side by side: a
// hand-written loop that asks for as many messages as it has free slots, against retry.Consumer with
// MaxConcurrency 64. Besides the time it reports the peak number of messages locked at the broker
// (delivered and not yet settled: what the SDK and the consumer hold), sampled as each message is
// handled, and the peak of the consumer's share of the live heap (see memoryProbe), sampled every fifth
// of the run. Both should follow the concurrency, not b.N. The samples take a lock on the emulator per
// message and five forced collections per run, in both implementations; the time is not comparable with
// BenchmarkConsume.
//
//	go test -run='^$' -bench=BenchmarkConsumeMemory -benchtime=5000x -count=5 ./e2e/
func BenchmarkConsumeMemory(b *testing.B) {
	const concurrency = memConcurrency
	b.Run("impl=loop", func(b *testing.B) {
		e, q, probe := memoryEnv(b, b.N)
		m := newMemoryMeter(q, probe, b.N)
		client, err := azservicebus.NewClientFromConnectionString(e.connStr, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer client.Close(context.Background())
		r, err := client.NewReceiverForQueue(e.queue, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		done := slotLoop(b, r, concurrency, nil, m.handling, m.settled)
		b.StopTimer()
		if done != int64(b.N) {
			b.Fatalf("completed %d of %d", done, b.N)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		m.report(b)
	})
	b.Run("impl=retry", func(b *testing.B) {
		e, q, probe := memoryEnv(b, b.N)
		m := newMemoryMeter(q, probe, b.N)
		runConsumerBench(b, e, &retry.Options{MaxConcurrency: concurrency, Hooks: retry.Hooks{
			OnStart: func(retry.StartParams) context.Context {
				m.handling()
				return nil
			},
			OnSettle: func(p retry.SettleParams) {
				if p.Operation == retry.SettleComplete && p.Err == nil {
					m.settled()
				}
			},
		}}, func(context.Context, *azservicebus.ReceivedMessage) error { return nil })
		m.report(b)
	})
}

// memoryMeter samples the peaks BenchmarkConsumeMemory reports: the broker's locked messages at each
// handling, and the consumer's heap share (in a goroutine of its own, so that the collection it forces
// does not stop the message that reached the checkpoint) every fifth of n settled messages and at the end.
type memoryMeter struct {
	q          *broker.Queue
	probe      *memoryProbe
	n, step    int64
	count      atomic.Int64
	peakLocked atomic.Int64
	peakHeap   atomic.Int64
	samples    chan struct{}
	sampled    chan struct{}
}

func newMemoryMeter(q *broker.Queue, probe *memoryProbe, n int) *memoryMeter {
	m := &memoryMeter{q: q, probe: probe, n: int64(n), step: max(int64(n)/5, 1),
		samples: make(chan struct{}, 8), sampled: make(chan struct{})}
	go func() {
		defer close(m.sampled)
		for range m.samples {
			storeMax(&m.peakHeap, m.probe.consumerShare())
		}
	}()
	return m
}

// handling samples the broker's locked messages as a message reaches its handler.
func (m *memoryMeter) handling() { storeMax(&m.peakLocked, int64(m.q.Stats().Locked)) }

// settled counts a completed message and asks for a heap sample at each checkpoint.
func (m *memoryMeter) settled() {
	if k := m.count.Add(1); k%m.step == 0 || k == m.n {
		select {
		case m.samples <- struct{}{}:
		default: // a sample is still pending; it covers this checkpoint
		}
	}
}

// report waits for the last sample and reports the peaks.
func (m *memoryMeter) report(b *testing.B) {
	close(m.samples)
	<-m.sampled
	b.ReportMetric(float64(m.peakLocked.Load()), "peak-locked-msgs")
	b.ReportMetric(float64(m.peakHeap.Load()), "peak-heap-B")
}
