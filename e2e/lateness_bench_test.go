//go:build !live

package e2e

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
)

// BenchmarkRetryLateness measures how late scheduled retries reach the handler: every message fails
// once and is scheduled after a 50 ms delay; the lateness of attempt 2 is its arrival at the handler
// minus the ScheduledFor its attempt 1 reported. Messages are sent one per millisecond, well below the
// consumer's capacity, so the figure is the library's and the broker's delay, not a backlog. It reports
// the median and 99th percentile in ms.
//
//	go test -run='^$' -bench=BenchmarkRetryLateness -benchtime=2000x -count=3 ./e2e/
func BenchmarkRetryLateness(b *testing.B) {
	em, err := startBenchEmulator()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = em.Close() })
	e := &env{connStr: em.ConnectionString(), queue: "orders", em: em}
	client, err := azservicebus.NewClientFromConnectionString(e.connStr, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = client.Close(context.Background()) })
	sender, err := client.NewSender(e.queue, nil)
	if err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	scheduled := map[string]time.Time{}
	var late []time.Duration
	all := make(chan struct{})
	c, err := retry.NewConsumer(e.connector(), func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		env, _ := envelope.FromContext(ctx)
		if env.Attempt == 1 {
			return retry.RetryAfter(50*time.Millisecond, errBoom)
		}
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if at, ok := scheduled[env.OriginalMessageID]; ok {
			late = append(late, now.Sub(at))
			if len(late) == b.N {
				close(all)
			}
		}
		return nil
	}, &retry.Options{
		MaxConcurrency: 16,
		Logger:         slog.New(slog.DiscardHandler),
		Backoff:        backoff.Constant{Interval: 50 * time.Millisecond},
		Hooks: retry.Hooks{OnProcessed: func(p retry.ProcessedParams) {
			if p.Result.Outcome == retry.OutcomeRetryScheduled {
				mu.Lock()
				scheduled[p.Envelope.OriginalMessageID] = p.Result.ScheduledFor
				mu.Unlock()
			}
		}},
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	b.ResetTimer()
	go func() { stopped <- c.Run(ctx) }()
	tick := time.NewTicker(time.Millisecond)
	for i := range b.N {
		<-tick.C
		id := "late-" + strconv.Itoa(i)
		if err := sender.SendMessage(ctx, &azservicebus.Message{MessageID: &id, Body: []byte("x")}, nil); err != nil {
			b.Fatal(err)
		}
	}
	tick.Stop()
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
		b.Fatal("timed out")
	}
	b.StopTimer()
	cancel()
	if err := <-stopped; err != nil {
		b.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(late)
	pct := func(p float64) float64 { return float64(late[int(p*float64(len(late)-1))]) / float64(time.Millisecond) }
	b.ReportMetric(pct(0.5), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}
