//go:build !live

package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/internal/cputime"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// pairedBurst is how many messages each burst of BenchmarkPaired releases at once. Being the test
// binary's flag, it goes after the package: go test -bench=BenchmarkPaired ./e2e/ -paired.burst=2000.
var pairedBurst = flag.Int("paired.burst", 5000, "messages per burst in BenchmarkPaired")

// Bounds of BenchmarkPaired's waits.
const (
	// pairedBurstTimeout bounds one burst, from its release to its last settle (about 0.3 s normally).
	pairedBurstTimeout = 60 * time.Second
	// pairedStopTimeout bounds the stop of one implementation: its loop or consumer, then its client.
	pairedStopTimeout = 30 * time.Second
	// pairedMinLead is the shortest time between starting to schedule a burst and its enqueue time, and
	// pairedFirstLead the lead of the first burst, before any preparation has been timed (one takes
	// 15 to 50 ms on two busy cores).
	pairedMinLead   = 20 * time.Millisecond
	pairedFirstLead = 100 * time.Millisecond
	// pairedCPUAhead is how long before the burst's enqueue time the process CPU is read; preparing the
	// burst must finish by then, and the read (after a sleep that may wake a few milliseconds late on a
	// busy machine) come before it, or the burst is void and redone with a longer lead.
	pairedCPUAhead = 5 * time.Millisecond
	// pairedLeadWindow is how many of the latest preparations the lead is set from.
	pairedLeadWindow = 8
	// pairedTries is how many times a void burst is tried before the benchmark gives up.
	pairedTries = 3
)

// BenchmarkPaired measures the library's throughput and CPU per message against the hand-written
// loops with far less noise than BenchmarkConsume and its neighbours, whose every run is a process of
// its own: on a shared machine the same code there varies by a third between consecutive one-second
// runs, so a per-run ratio says little. Here every implementation is set up once, on an emulator and a
// client of its own, and kept running (idle, blocked in receive) for the whole sub-benchmark, and one
// round (b.N is the number of rounds) runs a short burst of -paired.burst messages (5,000) through each
// implementation in turn, adjacent in time. A slow second on the machine then hits the bursts of one
// round alike, and the ratio of two implementations' figures in the same round cancels it; the order
// rotates every round (ABC, BCA, CAB; AB, BA for two) so that whatever one burst leaves to the next (a
// warm cache, background work) and a steady drift do not always favour the same implementation, and a
// collection before every burst keeps one burst's garbage out of the next one's CPU.
//
// A burst is released at once, so that the measured interval holds no sending: the benchmark schedules the
// burst's messages straight into the implementation's broker (sbemu/broker, in-process: 5,000 in 10 to 20
// ms, where the SDK's ScheduleMessages takes about 65 ms of a full core in batches of 500), all for one
// enqueue time T a little ahead, collects the garbage, reads the process CPU, and at T makes the broker
// activate them, in one step under its lock: receivers parked in receive see all of them at once. The
// burst is timed from its release (the activation done, a few milliseconds after T; see
// burstScheduler.once) until the 5,000th of its originals is settled: completed, or completed after its
// copy was scheduled an hour ahead. It holds a cushion of a few hundred messages more (pairedCushion),
// settled before the next burst but not measured, so that what is measured is a busy queue and not the end
// of one, where the batch loop would wait 20 ms for a last batch that never fills; and its copies are
// cancelled after it, so that every burst starts with an empty queue.
//
// It reports, per implementation, the median throughput (msgs/s) and process CPU per message (the
// emulators, the SDK and the implementation together, cpu-ns/msg), and, per library-against-baseline pair,
// the median of the per-round throughput ratios with their quartiles and a distribution-free 95 %
// confidence interval of the median (lo95, hi95), and the median per-round ratio of CPU per message with
// its interval (a ratio above 1 is more CPU for the library). It also reports how late after T the slowest
// release came (release-max-ms), the share of releases seen before any message was received
// (release-exact, see burstScheduler.once) and the longest preparation of a burst (prepare-max-ms), from
// which the lead is set.
//
//   - case=success: loop (impl=loop of BenchmarkConsume: receive a batch of 16, complete each in its
//     own goroutine, wait for the batch), loop-slots (slotLoop's strategy, TimeAfterFirstMessage 1 ms)
//     and retry (retry.Consumer, MaxConcurrency 16, default options);
//   - in every case also loop-deep (runDeepLoop): a loop that pipelines as deeply as the consumer (its
//     handler slots, prefetch places, batch size, gathering wait and settle pipelining), with no lock
//     renewal and no logging, whose ratio is the library's own cost;
//   - case=failures: every fifth message fails its first attempt; loop (impl=loop of
//     BenchmarkConsumeWithFailures: schedule a copy an hour ahead, then complete), loop-same-copy (the
//     same, its copy carrying what the library's does: sameCopy) and retry (the consumer, the handler
//     returning retry.RetryAfter an hour);
//   - case=iobound: a 20 ms handler with 256 at once; loop (slotLoop's strategy, as impl=loop of
//     BenchmarkConsumeIOBound) and retry (MaxConcurrency 256).
//
// With -v it logs one line per round. `make bench-paired` runs it with ROUNDS=40, a few minutes on two
// cores:
//
//	go test -run='^$' -bench='^BenchmarkPaired$' -benchtime=40x -timeout=60m ./e2e/
func BenchmarkPaired(b *testing.B) {
	b.Run("case=success", func(b *testing.B) {
		const concurrency = 16
		impls := []*pairedImpl{
			startPairedImpl(b, "loop", func(ctx context.Context, e *env, p *pairedImpl) error {
				return withPairedReceiver(ctx, e, func(_ *azservicebus.Client, r *azservicebus.Receiver) error {
					return runBatchLoop(ctx, r, concurrency, nil, p)
				})
			}),
			startPairedImpl(b, "loop-slots", func(ctx context.Context, e *env, p *pairedImpl) error {
				return withPairedReceiver(ctx, e, func(_ *azservicebus.Client, r *azservicebus.Receiver) error {
					opts := &azservicebus.ReceiveMessagesOptions{TimeAfterFirstMessage: time.Millisecond} // as the consumer
					return runSlotLoop(ctx, r, concurrency, opts, nil, p)
				})
			}),
			startPairedImpl(b, "loop-deep", deepLoop(concurrency, func(context.Context, *azservicebus.ReceivedMessage) error { return nil })),
			startPairedImpl(b, "retry", runPairedConsumer(&retry.Options{MaxConcurrency: concurrency},
				func(context.Context, *azservicebus.ReceivedMessage) error { return nil })),
		}
		runPaired(b, impls, pairedCushion(concurrency), []pairedRatio{{"retry", "loop"}, {"retry", "loop-slots"}, {"retry", "loop-deep"}})
	})
	b.Run("case=failures", func(b *testing.B) {
		const concurrency = 16
		failuresLoop := func(copyOf func(*azservicebus.ReceivedMessage) *azservicebus.Message) func(context.Context, *env, *pairedImpl) error {
			return func(ctx context.Context, e *env, p *pairedImpl) error {
				return withPairedReceiver(ctx, e, func(client *azservicebus.Client, r *azservicebus.Receiver) error {
					s, err := client.NewSender(e.queue, nil)
					if err != nil {
						return err
					}
					defer closeBounded(s.Close)
					return runBatchLoop(ctx, r, concurrency, scheduleCopyOfFailing(s, copyOf), p)
				})
			}
		}
		impls := []*pairedImpl{
			startPairedImpl(b, "loop", failuresLoop(plainCopy)),
			startPairedImpl(b, "loop-same-copy", failuresLoop(sameCopy)),
			startPairedImpl(b, "loop-deep", deepLoop(concurrency, func(_ context.Context, m *azservicebus.ReceivedMessage) error {
				if failsFirst(m.MessageID) {
					return errBoom
				}
				return nil
			})),
			startPairedImpl(b, "retry", runPairedConsumer(&retry.Options{MaxConcurrency: concurrency},
				func(_ context.Context, m *azservicebus.ReceivedMessage) error {
					if failsFirst(m.MessageID) {
						return retry.RetryAfter(time.Hour, errBoom)
					}
					return nil
				})),
		}
		runPaired(b, impls, pairedCushion(concurrency), []pairedRatio{{"retry", "loop"}, {"retry", "loop-same-copy"}, {"retry", "loop-deep"}})
	})
	b.Run("case=iobound", func(b *testing.B) {
		const concurrency = 256
		impls := []*pairedImpl{
			startPairedImpl(b, "loop", func(ctx context.Context, e *env, p *pairedImpl) error {
				return withPairedReceiver(ctx, e, func(_ *azservicebus.Client, r *azservicebus.Receiver) error {
					return runSlotLoop(ctx, r, concurrency, nil, ioBoundWork, p)
				})
			}),
			startPairedImpl(b, "loop-deep", deepLoop(concurrency, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
				ioBoundWork(ctx)
				return nil
			})),
			startPairedImpl(b, "retry", runPairedConsumer(&retry.Options{MaxConcurrency: concurrency},
				func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
					ioBoundWork(ctx)
					return nil
				})),
		}
		runPaired(b, impls, pairedCushion(concurrency), []pairedRatio{{"retry", "loop"}, {"retry", "loop-deep"}})
	})
}

// pairedCushion is how many messages a burst holds beyond the k it measures, for implementations that
// run concurrency messages at once: more than any of them holds at once (the consumer: MaxConcurrency
// handler slots, as many prefetched, MaxConcurrency+64 settling, see memHeldBound), so that until the
// k-th settle no receive finds the queue emptying. The tail of a burst is not what a busy consumer
// sees: a receive that asks for more messages than are left waits TimeAfterFirstMessage for them (the
// SDK's default is 20 ms, which the batch loop uses), which would cost that loop 8 % of a 5,000-message
// burst and nothing in a steady stream.
func pairedCushion(concurrency int) int { return 4*concurrency + 64 }

// ioBoundWork is the I/O-bound handler of case=iobound: it waits 20 ms, or less if ctx ends.
func ioBoundWork(ctx context.Context) {
	t := time.NewTimer(20 * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// pairedImpl is one implementation under test in BenchmarkPaired, running on an emulator of its own
// from its start to the end of the sub-benchmark. It counts settled originals into the current burst.
type pairedImpl struct {
	name  string
	queue *broker.Queue
	// exited is closed when the implementation's run function has returned, with its error in err.
	exited chan struct{}
	err    error
	// current is the burst being measured; settles are counted into it.
	current atomic.Pointer[burst]
	// lastFailure is the latest settle that went wrong (a failed complete or schedule, an outcome other
	// than completed or retry scheduled), shown when a burst does not finish.
	lastFailure atomic.Pointer[error]
	// scheduled counts the messages scheduled so far; it numbers their ids (bench-0 …), so failsFirst
	// picks every fifth. Only the benchmark's goroutine uses it.
	scheduled int
}

// settled counts one original settled by the implementation.
func (p *pairedImpl) settled() {
	if bu := p.current.Load(); bu != nil {
		bu.settled()
	}
}

// failed records a settle that went wrong; the message then does not count, and its burst times out.
func (p *pairedImpl) failed(err error) { p.lastFailure.Store(&err) }

// failure describes the implementation's latest failed settle, or says there was none.
func (p *pairedImpl) failure() string {
	if err := p.lastFailure.Load(); err != nil {
		return "last failed settle: " + (*err).Error()
	}
	return "no failed settle"
}

// startPairedImpl starts an emulator with the "orders" queue and, in a goroutine, run, which must keep
// settling the queue's messages (calling p.settled for each original settled) until ctx ends, and then
// return having stopped everything it started. Cleanup stops run, bounded by pairedStopTimeout, and then
// the emulator.
func startPairedImpl(b *testing.B, name string, run func(ctx context.Context, e *env, p *pairedImpl) error) *pairedImpl {
	b.Helper()
	return startPairedImplOn(b, name, startBenchEmulator, run)
}

// startPairedImplOn is startPairedImpl on the emulator start makes (its "orders" queue).
func startPairedImplOn(b *testing.B, name string, start func() (*sbemu.Emulator, error), run func(ctx context.Context, e *env, p *pairedImpl) error) *pairedImpl {
	b.Helper()
	// Every goroutine of this implementation (its emulator's, its client's, its own) carries the label
	// impl=name, so that a CPU profile of the benchmark splits by implementation:
	//	go tool pprof -tagfocus=impl=retry bench.prof
	defer pprof.SetGoroutineLabels(context.Background())
	pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels("impl", name)))
	em, err := start()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = em.Close() })
	q, ok := em.Broker().Queue("orders")
	if !ok {
		b.Fatal("no queue orders")
	}
	e := &env{connStr: em.ConnectionString(), queue: "orders", em: em}
	p := &pairedImpl{name: name, queue: q, exited: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer close(p.exited)
		p.err = run(ctx, e, p)
	}()
	b.Cleanup(func() {
		cancel()
		t := time.NewTimer(pairedStopTimeout)
		defer t.Stop()
		select {
		case <-p.exited:
			if p.err != nil {
				b.Errorf("%s: %v", name, p.err)
			}
		case <-t.C:
			b.Errorf("%s: still running %v after the end of the sub-benchmark", name, pairedStopTimeout)
		}
	})
	return p
}

// withPairedReceiver runs loop with a client of e (default options, as the loops of BenchmarkConsume)
// and a receiver for its queue, and closes both when loop returns.
func withPairedReceiver(ctx context.Context, e *env, loop func(*azservicebus.Client, *azservicebus.Receiver) error) error {
	client, err := azservicebus.NewClientFromConnectionString(e.connStr, nil)
	if err != nil {
		return err
	}
	defer closeBounded(client.Close)
	r, err := client.NewReceiverForQueue(e.queue, nil)
	if err != nil {
		return err
	}
	defer closeBounded(r.Close)
	return loop(client, r)
}

// closeBounded calls an SDK Close with a context that ends after pairedStopTimeout.
func closeBounded(closeFn func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), pairedStopTimeout)
	defer cancel()
	_ = closeFn(ctx)
}

// runBatchLoop is the loop of impl=loop of BenchmarkConsume and BenchmarkConsumeWithFailures, long-lived:
// it receives up to concurrency messages, runs each in its own goroutine (before, if set, then complete;
// p.settled after a successful complete) and waits for the whole batch before it receives again, until
// ctx ends. A failed before leaves its message unsettled, as there.
func runBatchLoop(ctx context.Context, r *azservicebus.Receiver, concurrency int, before func(context.Context, *azservicebus.ReceivedMessage) error, p *pairedImpl) error {
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		msgs, err := r.ReceiveMessages(ctx, concurrency, nil)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, m := range msgs {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if before != nil {
					if err := before(ctx, m); err != nil {
						p.failed(err)
						return
					}
				}
				completeAndCount(ctx, r, m, p)
			}()
		}
		wg.Wait()
	}
}

// runSlotLoop is slotLoop, long-lived: it takes the free slots of concurrency, asks for that many
// messages, runs each in its own goroutine as it arrives (handle, if set, then complete; p.settled after
// a successful complete), until ctx ends, and then waits for the messages it started.
func runSlotLoop(ctx context.Context, r *azservicebus.Receiver, concurrency int, opts *azservicebus.ReceiveMessagesOptions, handle func(context.Context), p *pairedImpl) error {
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		n := 1
		for n < concurrency && len(sem) < cap(sem) {
			sem <- struct{}{}
			n++
		}
		msgs, err := r.ReceiveMessages(ctx, n, opts)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for i := len(msgs); i < n; i++ {
			<-sem
		}
		for _, m := range msgs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if handle != nil {
					handle(ctx)
				}
				completeAndCount(ctx, r, m, p)
			}()
		}
	}
}

// completeAndCount completes m and counts it as settled, or records the failure.
func completeAndCount(ctx context.Context, r *azservicebus.Receiver, m *azservicebus.ReceivedMessage, p *pairedImpl) {
	if err := r.CompleteMessage(ctx, m, nil); err != nil {
		p.failed(err)
		return
	}
	p.settled()
}

// scheduleCopyOfFailing is the failure step of impl=loop of BenchmarkConsumeWithFailures: for a
// message that fails its first attempt (failsFirst) it schedules a copy an hour ahead through s.
func scheduleCopyOfFailing(s *azservicebus.Sender, copyOf func(*azservicebus.ReceivedMessage) *azservicebus.Message) func(context.Context, *azservicebus.ReceivedMessage) error {
	return func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		if !failsFirst(m.MessageID) {
			return nil
		}
		_, err := s.ScheduleMessages(ctx, []*azservicebus.Message{copyOf(m)}, time.Now().Add(time.Hour), nil)
		return err
	}
}

// deepLoop returns the run function of loop-deep (runDeepLoop) with concurrency handler slots and
// handle, whose error schedules the library's copy (sameCopy) an hour ahead before the complete.
func deepLoop(concurrency int, handle func(context.Context, *azservicebus.ReceivedMessage) error) func(context.Context, *env, *pairedImpl) error {
	return func(ctx context.Context, e *env, p *pairedImpl) error {
		return withPairedReceiver(ctx, e, func(client *azservicebus.Client, r *azservicebus.Receiver) error {
			s, err := client.NewSender(e.queue, nil)
			if err != nil {
				return err
			}
			defer closeBounded(s.Close)
			return runDeepLoop(ctx, r, s, concurrency, handle, sameCopy, p)
		})
	}
}

// runPairedConsumer returns the run function of a retry.Consumer with opts (its logger discarded) and
// handler, counting an original as settled when the consumer reports it completed or its retry
// scheduled, as runConsumerBench does.
func runPairedConsumer(opts *retry.Options, handler retry.Handler) func(context.Context, *env, *pairedImpl) error {
	return func(ctx context.Context, e *env, p *pairedImpl) error {
		opts.Logger = slog.New(slog.DiscardHandler)
		opts.Hooks.OnProcessed = func(pp retry.ProcessedParams) {
			switch pp.Result.Outcome {
			case retry.OutcomeCompleted, retry.OutcomeRetryScheduled:
				p.settled()
			default:
				p.failed(fmt.Errorf("%s: outcome %v (settle error %v)", pp.Message.MessageID, pp.Result.Outcome, pp.Result.SettleErr))
			}
		}
		c, err := retry.NewConsumer(e.connector(), handler, opts)
		if err != nil {
			return err
		}
		return c.Run(ctx)
	}
}

// burst is one burst being measured: it counts settles, notes the time and the process CPU at the
// measured-th one and says when all total are settled.
type burst struct {
	measured, total int64
	settles         atomic.Int64
	measuredDone    chan struct{} // closed at the measured-th settle, after end and endCPU are set
	allDone         chan struct{} // closed at the total-th settle
	end             time.Time
	endCPU          time.Duration
}

// newBurst returns a burst that measures up to the measured-th of total settles.
func newBurst(measured, total int) *burst {
	return &burst{measured: int64(measured), total: int64(total), measuredDone: make(chan struct{}), allDone: make(chan struct{})}
}

// settled counts one settle.
func (bu *burst) settled() {
	n := bu.settles.Add(1)
	if n == bu.measured {
		bu.end = time.Now()
		bu.endCPU = cputime.Process()
		close(bu.measuredDone)
	}
	if n == bu.total {
		close(bu.allDone)
	}
}

// burstResult is what one burst measured.
type burstResult struct {
	msgsPerSec float64
	cpuPerMsg  float64 // ns
	// prepare is how long scheduling the burst and the collection after it took, lead how far ahead of
	// its start the burst was scheduled for T, release how long after T the broker had activated it all.
	prepare, lead, release time.Duration
	// cpuRead is when, relative to T, the CPU was read (negative: before T, as it must be).
	cpuRead time.Duration
	// exact is set when the release was seen before any message of the burst was received.
	exact bool
}

// voidReason says why a void burst was void.
func (r burstResult) voidReason() string {
	if r.prepare > r.lead-pairedCPUAhead {
		return fmt.Sprintf("preparing it took %v with a lead of %v", r.prepare, r.lead)
	}
	return fmt.Sprintf("the sleep after its preparation woke %v after T, so the CPU was read too late", r.cpuRead)
}

// pairedRatio names a library implementation and the baseline it is compared with.
type pairedRatio struct{ library, baseline string }

// runPaired warms each implementation up with one unmeasured burst, then runs b.N rounds of one burst
// per implementation, in an order that rotates every round, and reports the figures (see
// BenchmarkPaired). Every burst measures -paired.burst messages and holds cushion more.
func runPaired(b *testing.B, impls []*pairedImpl, cushion int, ratios []pairedRatio) {
	b.Helper()
	k := *pairedBurst
	if k < 1 {
		b.Fatalf("-paired.burst=%d: need at least one message", k)
	}
	s := &burstScheduler{lead: pairedFirstLead}
	s.init(b)
	for _, p := range impls {
		s.run(b, p, k, cushion)
	}
	results := make(map[string][]burstResult, len(impls))
	b.ResetTimer()
	for round := range b.N {
		for i := range impls {
			p := impls[(round+i)%len(impls)]
			results[p.name] = append(results[p.name], s.run(b, p, k, cushion))
		}
		if testing.Verbose() {
			b.Logf("round %2d: %s", round+1, roundLine(impls, results, ratios, round))
		}
	}
	b.StopTimer()
	reportPaired(b, impls, results, ratios)
}

// burstScheduler releases bursts, adapting how far ahead a burst is scheduled to how long scheduling
// it takes.
type burstScheduler struct {
	// tmpl is the message every burst message is a copy of, only its id changing; size is its encoded
	// size with the longest id, which is all the broker uses the size for (the limit and its stats).
	tmpl *amqp.Message
	size int
	// lead is how far ahead of its start the next burst is scheduled: twice the longest of the last
	// pairedLeadWindow preparations plus pairedCPUAhead, at least pairedMinLead. The window lets one
	// slow preparation (a busy moment of the machine) lengthen the lead for a while, not for good.
	lead     time.Duration
	prepares []time.Duration
}

// init builds the message template: 256 bytes of body, like preload's.
func (s *burstScheduler) init(b *testing.B) {
	b.Helper()
	s.tmpl = &amqp.Message{Data: [][]byte{make([]byte, 256)}, Properties: &amqp.MessageProperties{MessageID: "bench-" + strconv.Itoa(math.MaxInt32)}}
	encoded, err := s.tmpl.MarshalBinary()
	if err != nil {
		b.Fatal(err)
	}
	s.size = len(encoded)
}

// run measures one burst of k messages (and cushion more) through p, redoing it with a longer lead (up to pairedTries
// times in all) if it was void: its preparation, or the sleep after it, ran past the time to read the
// CPU.
func (s *burstScheduler) run(b *testing.B, p *pairedImpl, k, cushion int) burstResult {
	b.Helper()
	for try := 1; ; try++ {
		res, ok := s.once(b, p, k, cushion)
		if ok {
			return res
		}
		if try == pairedTries {
			b.Fatalf("%s: %d bursts in a row void (the last %s)", p.name, try, res.voidReason())
		}
		b.Logf("%s: void burst (%s); redoing it", p.name, res.voidReason())
	}
}

// once schedules k+cushion messages into p's queue for one instant T, lead ahead, collects the
// garbage, reads the process CPU shortly before T, makes the broker activate the burst at T, notes the
// time and the CPU at the k-th settle and waits for p to settle them all. It returns false (after the burst is over) if the preparation was not done pairedCPUAhead
// before T, or the CPU was read after T: the burst is then void, and the lead is doubled.
//
// The burst is timed from its release, the moment the broker has activated all, not from T: the
// activation takes the broker's lock for a few milliseconds (about 0.6 µs a message) and starts up to a
// few milliseconds late (the timer's wake-up on a busy machine), time in which no implementation can
// receive anything, and which would otherwise pull every ratio towards 1 and add noise. The release is
// known exactly when this goroutine's call activates the burst, or finds it activated and untouched;
// when the broker's own wake-up was first and a receiver already took some, the release is taken as
// this call's return, late by the time since that activation (typically well under a millisecond). The
// CPU of the activation (about 1.5 % of a burst's) is counted for every implementation alike.
func (s *burstScheduler) once(b *testing.B, p *pairedImpl, k, cushion int) (burstResult, bool) {
	b.Helper()
	n := k + cushion
	bu := newBurst(k, n)
	p.current.Store(bu)
	defer p.current.Store(nil)

	start := time.Now()
	res := burstResult{lead: s.lead}
	at := start.Add(s.lead)
	var last int64
	for range n {
		s.tmpl.Properties.MessageID = "bench-" + strconv.Itoa(p.scheduled)
		p.scheduled++
		seq, err := p.queue.Schedule(s.tmpl, s.size, at)
		if err != nil {
			b.Fatalf("%s: scheduling a burst: %v", p.name, err)
		}
		last = seq
	}
	runtime.GC() // each burst starts with no garbage from the one before
	res.prepare = time.Since(start)
	s.prepares = append(s.prepares, res.prepare)
	if len(s.prepares) > pairedLeadWindow {
		s.prepares = s.prepares[1:]
	}
	s.lead = max(pairedMinLead, 2*slices.Max(s.prepares)+pairedCPUAhead)

	onTime := time.Until(at) >= pairedCPUAhead
	if onTime {
		time.Sleep(time.Until(at) - pairedCPUAhead)
	}
	cpu := cputime.Process()
	res.cpuRead = time.Since(at)
	onTime = onTime && res.cpuRead < 0
	time.Sleep(time.Until(at))
	// The broker activates due messages lazily on every call, and from its wake-up goroutine: this call
	// activates the burst if the wake-up has not yet, in one step under the broker's lock.
	st := p.queue.Stats()
	released := time.Now()
	res.release = released.Sub(at)
	res.exact = st.Active == n && st.Locked == 0
	// The last message of the burst must no longer be scheduled (had it been, it is now cancelled, and
	// the burst could not finish).
	if err := p.queue.CancelScheduled(last); !errors.Is(err, broker.ErrNotFound) {
		b.Fatalf("%s: the burst was still scheduled after its enqueue time (cancel: %v)", p.name, err)
	}

	timeout := time.NewTimer(pairedBurstTimeout)
	defer timeout.Stop()
	for _, done := range []chan struct{}{bu.measuredDone, bu.allDone} {
		select {
		case <-done:
		case <-p.exited:
			b.Fatalf("%s stopped during a burst: %v", p.name, p.err)
		case <-timeout.C:
			b.Fatalf("%s: %d of %d settled after %v; %s; queue %+v", p.name, bu.settles.Load(), n, pairedBurstTimeout, p.failure(), p.queue.Stats())
		}
	}
	// Every original of the burst is settled, so the queue holds only copies scheduled an hour ahead:
	// nothing of this burst can be counted into the next.
	if st := p.queue.Stats(); st.Active != 0 || st.Locked != 0 {
		b.Fatalf("%s: after the burst the queue still holds %+v", p.name, st)
	}
	clearScheduled(b, p)
	if !onTime {
		s.lead = max(s.lead, 2*res.lead)
		return res, false
	}
	res.msgsPerSec = float64(k) / bu.end.Sub(released).Seconds()
	if bu.endCPU > 0 {
		res.cpuPerMsg = float64(bu.endCPU-cpu) / float64(k)
	}
	return res, true
}

// clearScheduled cancels every message p's queue holds, all of them scheduled (the copies of the burst
// just measured, an hour ahead), so that every burst starts with an empty queue. Left there, 1,000
// copies a burst would grow the live heap, and with it the collections' and the broker's cost, from
// round to round (the preparation of a burst went from 15 to 150 ms over 40 rounds).
func clearScheduled(b *testing.B, p *pairedImpl) {
	b.Helper()
	held := p.queue.Peek(0, math.MaxInt32)
	if len(held) == 0 {
		return
	}
	seqs := make([]int64, len(held))
	for i, d := range held {
		seqs[i] = d.SequenceNumber
	}
	if err := p.queue.CancelScheduled(seqs...); err != nil {
		b.Fatalf("%s: clearing the copies of a burst: %v", p.name, err)
	}
}

// roundLine describes one round: each implementation's throughput and CPU per message, then the ratios.
func roundLine(impls []*pairedImpl, results map[string][]burstResult, ratios []pairedRatio, round int) string {
	var sb strings.Builder
	var release time.Duration
	for _, p := range impls {
		r := results[p.name][round]
		mark := ""
		if !r.exact {
			mark = " (release seen late)"
		}
		fmt.Fprintf(&sb, "%s %.0f msgs/s %.0f cpu-ns/msg%s; ", p.name, r.msgsPerSec, r.cpuPerMsg, mark)
		release = max(release, r.release)
	}
	for _, q := range ratios {
		l, base := results[q.library][round], results[q.baseline][round]
		fmt.Fprintf(&sb, "%s/%s %.3f (cpu %.3f); ", q.library, q.baseline, l.msgsPerSec/base.msgsPerSec, l.cpuPerMsg/base.cpuPerMsg)
	}
	first := results[impls[0].name][round]
	fmt.Fprintf(&sb, "lead %v, prepare %v, release ≤ %v", first.lead.Round(time.Millisecond), first.prepare.Round(time.Millisecond), release.Round(time.Microsecond))
	return sb.String()
}

// reportPaired reports the medians per implementation and the ratios per pair (see BenchmarkPaired),
// plus the slowest release after T, the share of exact releases and the longest preparation of a burst.
func reportPaired(b *testing.B, impls []*pairedImpl, results map[string][]burstResult, ratios []pairedRatio) {
	b.Helper()
	var release, prepare time.Duration
	var exact, bursts int
	for _, p := range impls {
		rs := results[p.name]
		b.ReportMetric(median(column(rs, func(r burstResult) float64 { return r.msgsPerSec })), p.name+"-msgs/s")
		b.ReportMetric(median(column(rs, func(r burstResult) float64 { return r.cpuPerMsg })), p.name+"-cpu-ns/msg")
		for _, r := range rs {
			release, prepare = max(release, r.release), max(prepare, r.prepare)
			if r.exact {
				exact++
			}
			bursts++
		}
	}
	for _, q := range ratios {
		l, base := results[q.library], results[q.baseline]
		tput := make([]float64, len(l))
		cpu := make([]float64, len(l))
		for i := range l {
			tput[i] = l[i].msgsPerSec / base[i].msgsPerSec
			cpu[i] = l[i].cpuPerMsg / base[i].cpuPerMsg
		}
		name := q.library + "/" + q.baseline
		lo, hi := medianCI95(tput)
		b.ReportMetric(median(tput), name)
		b.ReportMetric(quantile(tput, 0.25), name+"-p25")
		b.ReportMetric(quantile(tput, 0.75), name+"-p75")
		b.ReportMetric(lo, name+"-lo95")
		b.ReportMetric(hi, name+"-hi95")
		lo, hi = medianCI95(cpu)
		b.ReportMetric(median(cpu), name+"-cpu")
		b.ReportMetric(lo, name+"-cpu-lo95")
		b.ReportMetric(hi, name+"-cpu-hi95")
	}
	b.ReportMetric(float64(release)/float64(time.Millisecond), "release-max-ms")
	b.ReportMetric(float64(exact)/float64(bursts), "release-exact")
	b.ReportMetric(float64(prepare)/float64(time.Millisecond), "prepare-max-ms")
}

// column picks one figure out of every result.
func column(rs []burstResult, f func(burstResult) float64) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = f(r)
	}
	return out
}

// median is the 50th percentile of xs.
func median(xs []float64) float64 { return quantile(xs, 0.5) }

// quantile is the p-quantile of xs, interpolated linearly between the order statistics (the default of
// R and NumPy); NaN for no values.
func quantile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(xs))
	h := p * float64(len(s)-1)
	i := int(h)
	if i+1 >= len(s) {
		return s[len(s)-1]
	}
	return s[i] + (h-float64(i))*(s[i+1]-s[i])
}

// medianCI95 is a distribution-free confidence interval of at least 95 % for the median of the
// population xs were drawn from: the order statistics x(j) and x(n+1-j) for the largest j whose
// binomial tail P(Binomial(n, ½) < j) is at most 2.5 %, so both ends miss the median with at most that
// probability each (for 40 values, x(14) and x(27), 96.2 %). Below 6 values no j qualifies and it
// returns the smallest and largest value, whose coverage is only 1 - 2^(1-n).
func medianCI95(xs []float64) (lo, hi float64) {
	n := len(xs)
	if n == 0 {
		return math.NaN(), math.NaN()
	}
	s := slices.Sorted(slices.Values(xs))
	j := 0 // 1-based rank of the lower end; 0: none qualifies
	tail := 0.0
	for i := 0; i < n/2; i++ {
		tail += binomialHalf(n, i) // P(Binomial(n, ½) <= i), the tail below rank i+1
		if tail > 0.025 {
			break
		}
		j = i + 1
	}
	if j == 0 {
		return s[0], s[n-1]
	}
	return s[j-1], s[n-j]
}

// binomialHalf is P(Binomial(n, ½) = i), computed in logarithms so large n does not overflow.
func binomialHalf(n, i int) float64 {
	lgN, _ := math.Lgamma(float64(n + 1))
	lgI, _ := math.Lgamma(float64(i + 1))
	lgR, _ := math.Lgamma(float64(n - i + 1))
	return math.Exp(lgN - lgI - lgR - float64(n)*math.Ln2)
}
