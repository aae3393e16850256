//go:build !live

package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/metrics"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// The memory claim (BENCHMARKS.md): what the consumer holds is bounded by MaxConcurrency and the message
// size, not by how many messages wait in the queue.
const (
	memMessages    = 10_000
	memConcurrency = 64
	memBodySize    = 16 << 10
	// memSettleAllowance mirrors extraSettleSlots in slots.go: how many more messages than
	// MaxConcurrency may be settling at once.
	memSettleAllowance = 64
	// memPrefetch is Options.Prefetch's default, MaxConcurrency.
	memPrefetch = memConcurrency
	// memReceiveBatch is Options.ReceiveBatchSize's default, twice MaxConcurrency.
	memReceiveBatch = 2 * memConcurrency
	// memHeldBound is the most messages the consumer may hold between receiving one and the end of its
	// settle: MaxConcurrency handler slots, the prefetch places of messages received ahead, plus
	// MaxConcurrency+64 settling slots (slots.go): 256. Messages the SDK has taken from the broker and
	// not yet returned from ReceiveMessages come on top, at most one receive's worth (memReceiveBatch):
	// the consumer never asks for more than its free handler slots and prefetch places, but the SDK keeps
	// the credit a short receive left unused and may fill it before the next one.
	memHeldBound = memConcurrency + memPrefetch + (memConcurrency + memSettleAllowance)
	// memFixedAllowance is the heap a consumer needs whatever it holds: its client, connection and links,
	// their read buffers, goroutine stacks and its registries.
	memFixedAllowance = 16 << 20
	// memTimeout bounds the drain: about 8 s under the race detector on two idle cores.
	memTimeout = 2 * testTimeout
)

// memHeapBound is the most heap the consumer may use while draining: every message it and the SDK may
// hold (memHeldBound plus one receive) counted twice, since the frame it arrived in and the decoded
// message can both be live, plus the fixed allowance. With 16 KiB bodies it is 28 MiB; a consumer that
// took the whole backlog of 10,000 would need 156 MiB for the bodies alone.
const memHeapBound = 2*(memHeldBound+memReceiveBatch)*memBodySize + memFixedAllowance

// memoryProbe estimates the consumer's share of the process's live heap while the in-process emulator
// drains a pre-loaded queue. The emulator lives in the same process and holds the backlog, so its share
// is taken out: what a stored message costs it is measured over the load (live heap after minus before,
// per message), and at each sample the messages it still stores are subtracted at that cost. The rest is
// the consumer's: its client and links, what it has received and not yet settled, and anything it
// retains after settling.
type memoryProbe struct {
	q          *broker.Queue
	base       int64   // live heap with the emulator running and empty
	perMessage float64 // the emulator's live heap per stored message, measured by loaded
}

// newMemoryProbe measures the base, before anything is sent to q.
func newMemoryProbe(q *broker.Queue) *memoryProbe {
	return &memoryProbe{q: q, base: liveHeap()}
}

// loaded measures what the emulator spends per stored message, once the backlog is sent and the
// sending client closed.
func (p *memoryProbe) loaded(tb testing.TB) {
	tb.Helper()
	st := p.q.Stats()
	stored := st.Active + st.Locked + st.Scheduled
	if stored == 0 {
		tb.Fatal("memory probe: the queue is empty after the load")
	}
	p.perMessage = float64(liveHeap()-p.base) / float64(stored)
}

// consumerShare returns the live heap minus the base and minus what the emulator stores. The count of
// stored messages is read before the collection, so a message settled during it (and perhaps still
// marked live) is subtracted too: a sample can only err by the messages settled during one collection.
func (p *memoryProbe) consumerShare() int64 {
	st := p.q.Stats()
	stored := st.Active + st.Locked + st.Scheduled
	return liveHeap() - p.base - int64(float64(stored)*p.perMessage)
}

// liveHeap runs a collection and returns the heap it found live.
func liveHeap() int64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// preload sends n messages with ids prefix-0 … prefix-(n-1) and bodies of size bytes, in batches, from a
// client of its own that it closes before returning, so that what remains in the heap is the emulator's.
func preload(tb testing.TB, connStr, queue, prefix string, n, size int) {
	tb.Helper()
	ctx := context.Background()
	client, err := azservicebus.NewClientFromConnectionString(connStr, nil)
	if err != nil {
		tb.Fatal(err)
	}
	defer client.Close(ctx)
	s, err := client.NewSender(queue, nil)
	if err != nil {
		tb.Fatal(err)
	}
	defer s.Close(ctx)
	for i := 0; i < n; {
		batch, err := s.NewMessageBatch(ctx, nil)
		if err != nil {
			tb.Fatal(err)
		}
		for ; i < n; i++ {
			id := fmt.Sprintf("%s-%d", prefix, i)
			if err := batch.AddMessage(&azservicebus.Message{MessageID: &id, Body: make([]byte, size)}, nil); err != nil {
				break // batch full: send it and start another
			}
		}
		if batch.NumMessages() == 0 {
			tb.Fatalf("a message of %d bytes does not fit in an empty batch", size)
		}
		if err := s.SendMessageBatch(ctx, batch, nil); err != nil {
			tb.Fatal(err)
		}
	}
}

// storeMax raises peak to v if v is larger.
func storeMax(peak *atomic.Int64, v int64) {
	for {
		old := peak.Load()
		if v <= old || peak.CompareAndSwap(old, v) {
			return
		}
	}
}

// memoryEnv starts an emulator with the "orders" queue holding n messages of memBodySize bytes, and a
// probe whose base was measured before the load.
func memoryEnv(tb testing.TB, n int) (*env, *broker.Queue, *memoryProbe) {
	tb.Helper()
	em := sbemu.StartT(tb, sbemu.Config{Queues: []broker.QueueConfig{{Name: "orders"}}})
	q, ok := em.Broker().Queue("orders")
	if !ok {
		tb.Fatal("no queue orders")
	}
	probe := newMemoryProbe(q)
	preload(tb, em.ConnectionString(), "orders", "mem", n, memBodySize)
	probe.loaded(tb)
	return &env{connStr: em.ConnectionString(), queue: "orders", em: em}, q, probe
}

// TestConsumerMemoryIsBoundedByConcurrency drains a backlog of 10,000 messages of 16 KiB (156 MiB) with
// MaxConcurrency 64 and checks that what the consumer holds follows MaxConcurrency, not the backlog:
//
//   - the deliveries between OnStart and OnProcessed never exceed memHeldBound (256), and the messages
//     the broker has locked (delivered, not settled: held by the SDK or the consumer) never exceed it by
//     more than one receive (128);
//   - the consumer's share of the live heap (see memoryProbe), sampled every 2,000 messages, stays
//     under memHeapBound (28 MiB), and does not grow from 2,000 messages processed to 10,000 by more
//     than memHeldBound messages' bodies (4 MiB): nothing is retained per message.
//
// It does not run in parallel: it measures the process's heap, which parallel tests would share.
func TestConsumerMemoryIsBoundedByConcurrency(t *testing.T) {
	const every = 2_000
	e, q, probe := memoryEnv(t, memMessages)
	t.Logf("emulator: %.0f bytes per stored %d-byte message", probe.perMessage, memBodySize)

	var inProcessing, peakProcessing, peakLocked, processed atomic.Int64
	checkpoints := make(chan int64, memMessages/every)
	c, err := retry.NewConsumer(e.connector(), func(context.Context, *azservicebus.ReceivedMessage) error {
		return nil
	}, &retry.Options{
		MaxConcurrency: memConcurrency,
		Logger:         slog.New(slog.DiscardHandler),
		Hooks: retry.Hooks{
			OnStart: func(retry.StartParams) context.Context {
				storeMax(&peakProcessing, inProcessing.Add(1))
				storeMax(&peakLocked, int64(q.Stats().Locked))
				return nil
			},
			OnProcessed: func(p retry.ProcessedParams) {
				inProcessing.Add(-1)
				if p.Result.Outcome != retry.OutcomeCompleted {
					return
				}
				if n := processed.Add(1); n%every == 0 {
					checkpoints <- n
				}
			},
		},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	stopped := make(chan error, 1)
	go func() { stopped <- c.Run(ctx) }()

	share := map[int64]int64{}
	deadline := time.NewTimer(memTimeout)
	defer deadline.Stop()
	for len(share) < memMessages/every {
		select {
		case n := <-checkpoints:
			share[n] = probe.consumerShare()
			t.Logf("%5d processed: consumer share %5.1f MiB", n, mib(share[n]))
		case <-deadline.C:
			cancel()
			<-stopped
			t.Fatalf("timed out with %d of %d processed; health %+v", processed.Load(), memMessages, c.Health())
		}
	}
	cancel()
	require.NoError(t, <-stopped)

	t.Logf("peak in processing %d, peak locked at the broker %d", peakProcessing.Load(), peakLocked.Load())
	assert.LessOrEqual(t, peakProcessing.Load(), int64(memHeldBound), "deliveries in processing at once")
	assert.LessOrEqual(t, peakLocked.Load(), int64(memHeldBound+memReceiveBatch), "messages locked at the broker at once")
	for n, s := range share {
		assert.LessOrEqual(t, s, int64(memHeapBound), "consumer heap at %d processed", n)
	}
	growth := share[memMessages] - share[every]
	assert.LessOrEqual(t, growth, int64(memHeldBound*memBodySize), "consumer heap growth from %d to %d processed", every, memMessages)
}

// mib converts bytes to MiB.
func mib(n int64) float64 { return float64(n) / (1 << 20) }

// TestMemoryProbeSeesHeldMessages checks that the probe can fail the bound above: a hand-written
// receiver that takes 3,000 messages of the backlog and holds them unsettled (what an unbounded consumer
// would do) must show at least 90 % of their bodies as its share, more than memHeapBound.
func TestMemoryProbeSeesHeldMessages(t *testing.T) {
	const n = 3_000
	e, _, probe := memoryEnv(t, n)
	r, err := e.client(t).NewReceiverForQueue(e.queue, nil)
	require.NoError(t, err)
	var held []*azservicebus.ReceivedMessage
	for len(held) < n {
		ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
		msgs, err := r.ReceiveMessages(ctx, 500, nil)
		cancel()
		require.NoError(t, err)
		held = append(held, msgs...)
	}
	share := probe.consumerShare()
	t.Logf("holding %d messages: share %.1f MiB (bound %.1f MiB)", len(held), mib(share), mib(memHeapBound))
	assert.Greater(t, share, int64(memHeapBound))
	assert.GreaterOrEqual(t, share, int64(0.9*n*memBodySize))
	runtime.KeepAlive(held)
}
