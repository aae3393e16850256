package sbemu

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

// BenchmarkSDKSessionSendReceiveComplete is BenchmarkSDKSendReceiveComplete
// on a session-aware queue: b.N messages spread over 8 sessions, sent by 8
// goroutines over one link, then each session accepted in turn (as the
// next available one) and drained in batches of up to 500, completed by 16
// goroutines.
//
//	go test -run '^$' -bench BenchmarkSDKSessionSendReceiveComplete -benchtime 20000x ./sbemu/
func BenchmarkSDKSessionSendReceiveComplete(b *testing.B) {
	const sessions = 8
	em := startEmulator(b, Config{Queues: []broker.QueueConfig{{Name: "sq", RequiresSession: true}}})
	client := newClient(b, em)
	sender := newSender(b, client, "sq")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < b.N; i += 8 {
				m := &azservicebus.Message{Body: []byte(fmt.Sprint(i)), SessionID: to.Ptr(fmt.Sprint(i % sessions))}
				if err := sender.SendMessage(ctx, m, nil); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(b, err)
	}
	sendTook := time.Since(start)

	start = time.Now()
	seen := 0
	for s := 0; s < sessions && seen < b.N; s++ {
		r, err := client.AcceptNextSessionForQueue(ctx, "sq", nil)
		require.NoError(b, err)
		want := (b.N - 1 - mustAtoi(b, r.SessionID())) / sessions
		for got := 0; got <= want; {
			msgs, err := r.ReceiveMessages(ctx, 500, nil)
			require.NoError(b, err)
			var cwg sync.WaitGroup
			sem := make(chan struct{}, 16)
			for _, m := range msgs {
				cwg.Add(1)
				sem <- struct{}{}
				go func() {
					defer cwg.Done()
					defer func() { <-sem }()
					require.NoError(b, r.CompleteMessage(ctx, m, nil))
				}()
			}
			cwg.Wait()
			got += len(msgs)
			seen += len(msgs)
		}
		require.NoError(b, r.Close(ctx))
	}
	recvTook := time.Since(start)
	b.StopTimer()
	require.Equal(b, b.N, seen)
	b.ReportMetric(float64(b.N)/sendTook.Seconds(), "sent/s")
	b.ReportMetric(float64(b.N)/recvTook.Seconds(), "completed/s")
}

func mustAtoi(tb testing.TB, s string) int {
	tb.Helper()
	var n int
	_, err := fmt.Sscan(s, &n)
	require.NoError(tb, err)
	return n
}
