//go:build !live

package e2e

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/internal/cputime"
)

// BenchmarkConsume drains b.N messages from the emulator through the real SDK, side by side: two
// hand-written loops against retry.Consumer with MaxConcurrency 16 on the success path, with and without
// lock renewal. impl=loop receives a batch of 16, completes each message from its own goroutine and
// waits for the whole batch before it receives again; impl=loop-slots uses the consumer's slot strategy
// (take the free slots, ask for that many, start each message as it arrives, never wait for a batch),
// which is the baseline the library's design is to be compared with. The difference is what the
// library costs per message on top of the SDK.
//
//	go test -run='^$' -bench=BenchmarkConsume -benchtime=5000x -count=5 ./e2e/
func BenchmarkConsume(b *testing.B) {
	const concurrency = 16
	b.Run("impl=loop", func(b *testing.B) {
		e, client := benchEnv(b)
		r, err := client.NewReceiverForQueue(e.queue, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		cpu := cputime.Process()
		batchLoop(b, r, concurrency, nil)
		b.StopTimer()
		reportCPU(b, cpu)
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
	b.Run("impl=loop-slots", func(b *testing.B) {
		e, client := benchEnv(b)
		r, err := client.NewReceiverForQueue(e.queue, nil)
		if err != nil {
			b.Fatal(err)
		}
		opts := &azservicebus.ReceiveMessagesOptions{TimeAfterFirstMessage: time.Millisecond} // as the consumer
		b.ResetTimer()
		cpu := cputime.Process()
		done := slotLoop(b, r, concurrency, opts, nil, nil)
		b.StopTimer()
		if done != int64(b.N) {
			b.Fatalf("completed %d of %d", done, b.N)
		}
		reportCPU(b, cpu)
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
	for _, renew := range []bool{true, false} {
		name := "impl=retry"
		if !renew {
			name += "-no-renewal"
		}
		b.Run(name, func(b *testing.B) {
			e, _ := benchEnv(b)
			runConsumerBench(b, e, &retry.Options{MaxConcurrency: concurrency, DisableLockRenewal: !renew},
				func(context.Context, *azservicebus.ReceivedMessage) error { return nil })
		})
	}
}

// benchEnv starts an emulator holding b.N messages of 256 bytes (ids bench-0 …) and returns it with a
// client.
func benchEnv(b *testing.B) (*env, *azservicebus.Client) {
	b.Helper()
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
	preload(b, e.connStr, e.queue, "bench", b.N, 256)
	return e, client
}

// reportCPU reports the process's CPU time per message since start (the SDK, the in-process emulator
// and the consumer together): on a shared machine it moves less with the neighbours' load than the
// throughput does.
func reportCPU(b *testing.B, start time.Duration) {
	b.Helper()
	if end := cputime.Process(); end > 0 {
		b.ReportMetric(float64(end-start)/float64(b.N), "cpu-ns/msg")
	}
}

// batchLoop is the hand-written batch baseline: it receives up to concurrency messages, runs each in
// its own goroutine (before, if set, then complete; a message whose before fails is not completed) and
// waits for the batch before it receives again, until b.N messages have been completed.
func batchLoop(b *testing.B, r *azservicebus.Receiver, concurrency int, before func(*azservicebus.ReceivedMessage) error) {
	b.Helper()
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	var done atomic.Int64
	ctx := context.Background()
	for done.Load() < int64(b.N) {
		msgs, err := r.ReceiveMessages(ctx, concurrency, nil)
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range msgs {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if before != nil && before(m) != nil {
					return
				}
				if err := r.CompleteMessage(ctx, m, nil); err == nil {
					done.Add(1)
				}
			}()
		}
		wg.Wait()
	}
}

// slotLoop is the hand-written baseline with the consumer's slot strategy: it takes the free slots of
// concurrency, asks for that many messages, runs each in its own goroutine as it arrives (handle, if
// set, then complete; completed, if set, after a successful complete), until b.N messages have been
// received, and waits for them. It returns how many were completed.
func slotLoop(b *testing.B, r *azservicebus.Receiver, concurrency int, opts *azservicebus.ReceiveMessagesOptions, handle, completed func()) int64 {
	b.Helper()
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	var done atomic.Int64
	ctx := context.Background()
	for received := 0; received < b.N; {
		sem <- struct{}{}
		n := 1
		for n < concurrency && len(sem) < cap(sem) {
			sem <- struct{}{}
			n++
		}
		msgs, err := r.ReceiveMessages(ctx, n, opts)
		if err != nil {
			b.Fatal(err)
		}
		for i := len(msgs); i < n; i++ {
			<-sem
		}
		received += len(msgs)
		for _, m := range msgs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if handle != nil {
					handle()
				}
				if err := r.CompleteMessage(ctx, m, nil); err == nil {
					done.Add(1)
					if completed != nil {
						completed()
					}
				}
			}()
		}
	}
	wg.Wait()
	return done.Load()
}
