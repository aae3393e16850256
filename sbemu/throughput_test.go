package sbemu

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sendConcurrently sends n messages over one sender (one AMQP link) from
// workers goroutines and returns the elapsed time.
func sendConcurrently(tb testing.TB, sender *azservicebus.Sender, n, workers int) time.Duration {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	// The first send creates the link alone: azservicebus v1.11.0 has no
	// double-check after taking its links lock, so concurrent first calls
	// each negotiate a claim and leak all but one token-refresh goroutine.
	require.NoError(tb, sender.SendMessage(ctx, &azservicebus.Message{Body: []byte("0")}, nil))
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 1 + w; i < n; i += workers {
				if err := sender.SendMessage(ctx, &azservicebus.Message{Body: []byte(fmt.Sprint(i))}, nil); err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(tb, err)
	}
	return time.Since(start)
}

// receiveAndComplete receives and completes n messages on one receiver,
// settling each batch from several goroutines, and returns the elapsed
// time and how many distinct bodies arrived.
func receiveAndComplete(tb testing.TB, receiver *azservicebus.Receiver, n int) (time.Duration, int) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	seen := make(map[string]bool, n)
	for len(seen) < n {
		msgs, err := receiver.ReceiveMessages(ctx, 500, nil)
		require.NoError(tb, err)
		var wg sync.WaitGroup
		errs := make(chan error, len(msgs))
		sem := make(chan struct{}, 16)
		for _, m := range msgs {
			seen[string(m.Body)] = true
			wg.Add(1)
			sem <- struct{}{}
			go func(m *azservicebus.ReceivedMessage) {
				defer wg.Done()
				defer func() { <-sem }()
				if err := receiver.CompleteMessage(ctx, m, nil); err != nil {
					errs <- err
				}
			}(m)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(tb, err)
		}
	}
	return time.Since(start), len(seen)
}

// TestSDKThousandsOfMessagesOneLink pushes more transfers through one
// sender link and one receiver link than the session window (5000) and
// the link credit (1000) allow without replenishment, so a missing flow
// frame stalls it.
func TestSDKThousandsOfMessagesOneLink(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 6000 messages")
	}
	em := startEmulator(t, Config{})
	client := newClient(t, em)
	sender := newSender(t, client, "queue")
	receiver := newReceiver(t, client, "queue", nil)

	const n = 6000 // above both the session window (5000) and the link credit (1000)
	sendTook := sendConcurrently(t, sender, n, 8)
	q, _ := em.Broker().Queue("queue")
	require.Equal(t, n, q.Stats().Active)

	recvTook, distinct := receiveAndComplete(t, receiver, n)
	assert.Equal(t, n, distinct)
	st := q.Stats()
	assert.Zero(t, st.Active+st.Locked+st.DeadLettered)
	t.Logf("sent %d in %v (%.0f msg/s); received+completed in %v (%.0f msg/s)",
		n, sendTook, float64(n)/sendTook.Seconds(), recvTook, float64(n)/recvTook.Seconds())
}

// BenchmarkSDKSendReceiveComplete measures the unmodified SDK against the
// emulator over loopback: b.N messages sent by 8 goroutines over one link,
// then received in batches of up to 500 and completed by 16 goroutines.
//
//	go test -run '^$' -bench BenchmarkSDKSendReceiveComplete -benchtime 20000x ./sbemu/
func BenchmarkSDKSendReceiveComplete(b *testing.B) {
	em := startEmulator(b, Config{})
	benchmarkSendReceiveComplete(b, newClient(b, em))
}

// BenchmarkSDKSendReceiveCompleteInMemory is the same over the in-memory
// door (a net.Pipe through ClientOptions.NewWebSocketConn) instead of TCP.
func BenchmarkSDKSendReceiveCompleteInMemory(b *testing.B) {
	em := startEmulator(b, Config{InMemory: true})
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), &azservicebus.ClientOptions{NewWebSocketConn: em.NewWebSocketConn})
	require.NoError(b, err)
	b.Cleanup(func() { _ = client.Close(context.Background()) })
	benchmarkSendReceiveComplete(b, client)
}

// BenchmarkSDKSendReceiveCompletePersistent is BenchmarkSDKSendReceiveComplete
// with Config.DataDir: every send and complete is acknowledged only after
// its fsync. It also reports fsyncs per message (sends and completes
// together), which group commit keeps well below two.
//
//	go test -run '^$' -bench BenchmarkSDKSendReceiveCompletePersistent -benchtime 20000x ./sbemu/
func BenchmarkSDKSendReceiveCompletePersistent(b *testing.B) {
	em := startEmulator(b, Config{DataDir: b.TempDir()})
	before := em.Broker().JournalStats()
	benchmarkSendReceiveComplete(b, newClient(b, em))
	after := em.Broker().JournalStats()
	b.ReportMetric(float64(after.Syncs-before.Syncs)/float64(b.N), "fsyncs/msg")
	b.ReportMetric(float64(after.Records-before.Records)/float64(after.Syncs-before.Syncs), "records/fsync")
}

func benchmarkSendReceiveComplete(b *testing.B, client *azservicebus.Client) {
	sender := newSender(b, client, "queue")
	receiver := newReceiver(b, client, "queue", nil)
	sendText(b, sender, "warm-up")
	_, _ = receiveAndComplete(b, receiver, 1)

	b.ResetTimer()
	sendTook := sendConcurrently(b, sender, b.N, 8)
	recvTook, distinct := receiveAndComplete(b, receiver, b.N)
	b.StopTimer()
	if distinct != b.N {
		b.Fatalf("received %d distinct messages, want %d", distinct, b.N)
	}
	b.ReportMetric(float64(b.N)/sendTook.Seconds(), "sent/s")
	b.ReportMetric(float64(b.N)/recvTook.Seconds(), "completed/s")
}

// BenchmarkStart measures how long [Start] takes to return a listening
// emulator with one queue, and its Close.
//
//	go test -run '^$' -bench BenchmarkStart -count 10 ./sbemu/
func BenchmarkStart(b *testing.B) {
	for b.Loop() {
		em, err := Start(Config{})
		if err != nil {
			b.Fatal(err)
		}
		if err := em.Close(); err != nil {
			b.Fatal(err)
		}
	}
}
