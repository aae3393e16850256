//go:build !live

package e2e

import (
	"context"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
)

// The shape of BenchmarkSessionHoldLateness.
const (
	// holdDelay is the backoff of every failed attempt (backoff.Constant), short so that a run is quick.
	holdDelay = 10 * time.Millisecond
	// holdSessions is how many sessions the messages are spread over, four times holdConcurrency, so
	// that every worker has a session to hold until the end.
	holdSessions    = 4 * holdConcurrency
	holdConcurrency = 16
	// holdIdle is the SessionIdleTimeout: it only ends each session after its last message.
	holdIdle = 50 * time.Millisecond
	// holdTimeout bounds one run.
	holdTimeout = 5 * time.Minute
)

// BenchmarkSessionHoldLateness measures how late a retry held in place runs: every one of b.N messages,
// spread round-robin over 64 sessions, fails its first attempt, and its session is held for the
// backoff (backoff.Constant, 10 ms) before the handler is called again, 16 sessions at once. The
// lateness of a retry is the start of the second call minus the return of the first and the delay:
// what the library adds to the backoff (its decision, the timer's wake-up, the next call's set-up) on
// top of the Go timer's own lateness. It reports the median, the 99th percentile and the maximum in
// ms, and how many retries in place a second went through; timer-p50-ms and timer-p99-ms are the
// lateness of a bare timer of the same delay, waited over and over in the same run
// (probeTimerLateness), the floor the machine set at that moment.
//
//   - impl=retry: retry.SessionConsumer with MaxConcurrentSessions 16 and Backoff backoff.Constant;
//   - impl=loop: the hand-written session loop of BenchmarkPairedSessions (runSessionLoop) holding a
//     failed message with a timer of the same delay, the floor the machine sets.
//
// The two run one after the other, not paired: each figure is a distribution of its own, and both show
// the machine's timer lateness at that moment.
//
//	go test -run='^$' -bench='^BenchmarkSessionHoldLateness$' -benchtime=2000x -count=3 ./e2e/
func BenchmarkSessionHoldLateness(b *testing.B) {
	b.Run("impl=loop", func(b *testing.B) {
		benchSessionHold(b, func(ctx context.Context, e *env, handler retry.Handler) error {
			p := &pairedImpl{name: "loop"} // counts nothing: the handler does
			return runSessionLoop(ctx, e, sessionLoopConfig{concurrency: holdConcurrency, idle: holdIdle, hold: holdDelay}, handler, p)
		})
	})
	b.Run("impl=retry", func(b *testing.B) {
		benchSessionHold(b, func(ctx context.Context, e *env, handler retry.Handler) error {
			connect, err := retry.NewNamespace(e.connStr, nil).SessionQueue(e.queue)
			if err != nil {
				return err
			}
			sc, err := retry.NewSessionConsumer(connect, handler,
				&retry.Options{Backoff: backoff.Constant{Interval: holdDelay}, Logger: slog.New(slog.DiscardHandler)},
				&retry.SessionOptions{MaxConcurrentSessions: holdConcurrency, SessionIdleTimeout: holdIdle})
			if err != nil {
				return err
			}
			return sc.Run(ctx)
		})
	})
}

// benchSessionHold loads b.N messages into a session-enabled queue of its own emulator, runs
// implementation run with a handler that fails every message's first call and times its second, until
// b.N second calls, and reports the lateness.
func benchSessionHold(b *testing.B, run func(ctx context.Context, e *env, handler retry.Handler) error) {
	em, err := startSessionEmulator()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = em.Close() })
	q, ok := em.Broker().Queue("orders")
	if !ok {
		b.Fatal("no queue orders")
	}
	e := &env{connStr: em.ConnectionString(), queue: "orders", em: em}
	sid := "s-" + strconv.Itoa(math.MaxInt32)
	m := &amqp.Message{Data: [][]byte{make([]byte, 256)}, Properties: &amqp.MessageProperties{MessageID: "hold-" + strconv.Itoa(math.MaxInt32), GroupID: &sid}}
	encoded, err := m.MarshalBinary()
	if err != nil {
		b.Fatal(err)
	}
	for i := range b.N {
		sid := "s-" + strconv.Itoa(i%holdSessions)
		m.Properties.GroupID, m.Properties.MessageID = &sid, "hold-"+strconv.Itoa(i)
		if _, _, err := q.Send(m, len(encoded)); err != nil {
			b.Fatal(err)
		}
	}

	var (
		mu       sync.Mutex
		failedAt = make(map[string]time.Time, b.N)
		late     = make([]time.Duration, 0, b.N)
		all      = make(chan struct{})
	)
	handler := func(_ context.Context, m *azservicebus.ReceivedMessage) error {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		at, again := failedAt[m.MessageID]
		if !again {
			failedAt[m.MessageID] = time.Now()
			return errBoom
		}
		late = append(late, now.Sub(at)-holdDelay)
		if len(late) == b.N {
			close(all)
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	probed := make(chan []time.Duration, 1)
	b.ResetTimer()
	start := time.Now()
	go func() { stopped <- run(ctx, e, handler) }()
	go func() { probed <- probeTimerLateness(ctx, holdDelay) }()
	timeout := time.NewTimer(holdTimeout)
	defer timeout.Stop()
	select {
	case <-all:
	case err := <-stopped:
		b.Fatalf("stopped early: %v", err)
	case <-timeout.C:
		mu.Lock()
		n := len(late)
		mu.Unlock()
		b.Fatalf("%d of %d retries in place after %v; queue %+v", n, b.N, holdTimeout, q.Stats())
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	if err := <-stopped; err != nil {
		b.Fatal(err)
	}
	floor := <-probed
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(late)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(late[len(late)/2]), "p50-ms")
	b.ReportMetric(ms(late[len(late)*99/100]), "p99-ms")
	b.ReportMetric(ms(late[len(late)-1]), "max-ms")
	if len(floor) > 0 {
		slices.Sort(floor)
		b.ReportMetric(ms(floor[len(floor)/2]), "timer-p50-ms")
		b.ReportMetric(ms(floor[len(floor)*99/100]), "timer-p99-ms")
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "retries/s")
	if late[0] < 0 {
		b.Errorf("a retry ran %v before its delay was over", -late[0])
	}
}

// probeTimerLateness waits delay on a timer again and again until ctx ends, and returns how late each
// wait ended: the machine's own lateness for the same delay, during the same run, which no session
// loop can go below.
func probeTimerLateness(ctx context.Context, delay time.Duration) []time.Duration {
	var late []time.Duration
	t := time.NewTimer(delay)
	defer t.Stop()
	for {
		armed := time.Now()
		select {
		case <-t.C:
			late = append(late, time.Since(armed)-delay)
			t.Reset(delay)
		case <-ctx.Done():
			return late
		}
	}
}
