package retry_test

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

// BenchmarkConsumerOverhead measures what the consumer itself costs per message, without the SDK and
// a broker: a receiver that returns new messages at once and a settler that does nothing, side by side
// with a hand-written loop on the same receiver that uses the same slot strategy (take the free slots,
// ask for that many, run each message in its own goroutine: handler, then complete). On loopback the
// SDK and the emulator cost about 40 µs per message; this is the part of the difference that is ours.
//
//	go test -run='^$' -bench=BenchmarkConsumerOverhead -benchmem -count=6 .
func BenchmarkConsumerOverhead(b *testing.B) {
	const concurrency = 16
	b.Run("impl=loop", func(b *testing.B) {
		src := newInstantReceiver(b.N)
		sem := make(chan struct{}, concurrency)
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		cpu := cputime.Process()
		var wg sync.WaitGroup
		for received := 0; received < b.N; {
			sem <- struct{}{}
			n := 1
			for n < concurrency && len(sem) < cap(sem) {
				sem <- struct{}{}
				n++
			}
			msgs, _ := src.ReceiveMessages(ctx, n, nil)
			for i := len(msgs); i < n; i++ {
				<-sem
			}
			received += len(msgs)
			for _, m := range msgs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					if err := okHandler(ctx, m); err == nil {
						_ = src.CompleteMessage(ctx, m, nil)
					}
				}()
			}
		}
		wg.Wait()
		<-src.all
		reportCPU(b, cpu)
	})
	for _, renew := range []bool{true, false} {
		name := "impl=retry"
		if !renew {
			name = "impl=retry-no-renewal"
		}
		b.Run(name, func(b *testing.B) {
			src := newInstantReceiver(b.N)
			connect := func(context.Context) (*retry.Connection, error) {
				return &retry.Connection{Receiver: src, Sender: discardSender{}}, nil
			}
			c, err := retry.NewConsumer(connect, okHandler, &retry.Options{
				MaxConcurrency: concurrency, Logger: discardLogger(), DisableLockRenewal: !renew, EntityPath: "orders",
			})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			stopped := make(chan error, 1)
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cputime.Process()
			go func() { stopped <- c.Run(ctx) }()
			<-src.all
			b.StopTimer()
			reportCPU(b, cpu)
			cancel()
			if err := <-stopped; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// reportCPU reports the process's CPU time per operation since start: on a shared machine it moves
// less with the neighbours' load than the wall time does.
func reportCPU(b *testing.B, start time.Duration) {
	if end := cputime.Process(); end > 0 {
		b.ReportMetric(float64(end-start)/float64(b.N), "cpu-ns/op")
	}
}

// instantReceiver hands out new messages as fast as they are asked for, and counts completes.
type instantReceiver struct {
	want      int64
	seq       atomic.Int64
	completed atomic.Int64
	all       chan struct{}
}

func newInstantReceiver(n int) *instantReceiver {
	return &instantReceiver{want: int64(n), all: make(chan struct{})}
}

func (r *instantReceiver) ReceiveMessages(ctx context.Context, n int, _ *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if r.seq.Load() >= r.want {
		// Everything was handed out: block like an empty queue.
		<-ctx.Done()
		return nil, nil
	}
	now := time.Now()
	locked := now.Add(time.Minute)
	out := make([]*azservicebus.ReceivedMessage, n)
	for i := range out {
		seq := r.seq.Add(1)
		out[i] = &azservicebus.ReceivedMessage{
			MessageID: "order", SequenceNumber: &seq, EnqueuedTime: &now, LockedUntil: &locked,
			Body: []byte("{}"), DeliveryCount: 1,
		}
	}
	return out, nil
}

func (r *instantReceiver) CompleteMessage(context.Context, *azservicebus.ReceivedMessage, *azservicebus.CompleteMessageOptions) error {
	if r.completed.Add(1) == r.want {
		close(r.all)
	}
	return nil
}

func (r *instantReceiver) DeadLetterMessage(context.Context, *azservicebus.ReceivedMessage, *azservicebus.DeadLetterOptions) error {
	return nil
}

func (r *instantReceiver) RenewMessageLock(context.Context, *azservicebus.ReceivedMessage, *azservicebus.RenewMessageLockOptions) error {
	return nil
}

func (r *instantReceiver) Close(context.Context) error { return nil }
