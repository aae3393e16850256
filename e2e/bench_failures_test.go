//go:build !live

package e2e

import (
	"context"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/cputime"
)

// failsFirst reports whether message id fails its first attempt: every fifth message (20 %).
func failsFirst(id string) bool {
	n, err := strconv.Atoi(id[len("bench-"):])
	return err == nil && n%5 == 0
}

// BenchmarkConsumeWithFailures drains b.N messages, 20 % of which fail their first attempt, side by
// side: a hand-written loop that, for a failing message, schedules a copy an hour ahead and then
// completes the original, against retry.Consumer doing the same (MaxConcurrency 16). Both finish when
// every original is settled; the copies stay scheduled. impl=loop's copy carries one property;
// impl=loop-same-copy's carries what the library's does (sameCopy), so that the difference between the
// two loops is what the copy's content costs the SDK and the broker, and the difference between
// impl=loop-same-copy and impl=retry is the library's own work.
//
//	go test -run='^$' -bench=BenchmarkConsumeWithFailures -benchtime=5000x -count=5 ./e2e/
func BenchmarkConsumeWithFailures(b *testing.B) {
	const concurrency = 16
	b.Run("impl=loop", func(b *testing.B) { failuresLoop(b, concurrency, plainCopy) })
	b.Run("impl=loop-same-copy", func(b *testing.B) { failuresLoop(b, concurrency, sameCopy) })
	b.Run("impl=retry", func(b *testing.B) {
		e, _ := benchEnv(b)
		runConsumerBench(b, e, &retry.Options{MaxConcurrency: concurrency}, func(_ context.Context, m *azservicebus.ReceivedMessage) error {
			if failsFirst(m.MessageID) {
				return retry.RetryAfter(time.Hour, errBoom)
			}
			return nil
		})
	})
}

// failuresLoop is the hand-written baseline of BenchmarkConsumeWithFailures: it receives up to
// concurrency messages, handles each in its own goroutine (for a failing one, schedules copyOf(m) an hour
// ahead, then completes it) and waits for the batch before it receives again.
func failuresLoop(b *testing.B, concurrency int, copyOf func(*azservicebus.ReceivedMessage) *azservicebus.Message) {
	e, client := benchEnv(b)
	r, err := client.NewReceiverForQueue(e.queue, nil)
	if err != nil {
		b.Fatal(err)
	}
	s, err := client.NewSender(e.queue, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	cpu := cputime.Process()
	batchLoop(b, r, concurrency, func(m *azservicebus.ReceivedMessage) error {
		if !failsFirst(m.MessageID) {
			return nil
		}
		_, err := s.ScheduleMessages(context.Background(), []*azservicebus.Message{copyOf(m)}, time.Now().Add(time.Hour), nil)
		return err
	})
	b.StopTimer()
	reportCPU(b, cpu)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// plainCopy is the least a hand-written retry copy carries: the body and an attempt number.
func plainCopy(m *azservicebus.ReceivedMessage) *azservicebus.Message {
	id := m.MessageID + "-copy"
	return &azservicebus.Message{MessageID: &id, Body: m.Body, ApplicationProperties: map[string]any{"attempt": int64(2)}}
}

// sameCopy is a copy with what retry.Consumer's copy of a benchmark message carries (the same
// application properties with values of the same types and lengths, and a MessageID of the same form),
// built without the library's checks: TestSameCopyMatchesTheLibrarysCopy keeps the two alike.
func sameCopy(m *azservicebus.ReceivedMessage) *azservicebus.Message {
	env := envelope.Envelope{Attempt: 1, CorrelationID: m.MessageID, OriginalMessageID: m.MessageID, Key: m.MessageID,
		Source: "orders", FirstSequenceNumber: *m.SequenceNumber}
	id := env.RetryMessageID(2)
	return &azservicebus.Message{MessageID: &id, Body: append([]byte(nil), m.Body...), ApplicationProperties: map[string]any{
		envelope.PropAttempt:             int64(2),
		envelope.PropCorrelationID:       env.CorrelationID,
		envelope.PropOriginalMessageID:   env.OriginalMessageID,
		envelope.PropKey:                 env.Key,
		envelope.PropLastError:           errBoom.Error(),
		envelope.PropFirstEnqueuedTime:   m.EnqueuedTime.UTC(),
		envelope.PropSource:              env.Source,
		envelope.PropFirstSequenceNumber: env.FirstSequenceNumber,
	}}
}

// BenchmarkConsumeIOBound drains b.N messages whose handler waits 20 ms (an I/O-bound handler) with 256
// at once, side by side: a hand-written loop against retry.Consumer with MaxConcurrency 256.
//
//	go test -run='^$' -bench=BenchmarkConsumeIOBound -benchtime=5000x -count=5 ./e2e/
func BenchmarkConsumeIOBound(b *testing.B) {
	const concurrency = 256
	work := func() { <-time.After(20 * time.Millisecond) }
	b.Run("impl=loop", func(b *testing.B) {
		e, client := benchEnv(b)
		r, err := client.NewReceiverForQueue(e.queue, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		cpu := cputime.Process()
		// Ask for as many as there are free slots, as the consumer does.
		done := slotLoop(b, r, concurrency, nil, work, nil)
		b.StopTimer()
		if done != int64(b.N) {
			b.Fatalf("completed %d of %d", done, b.N)
		}
		reportCPU(b, cpu)
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
	b.Run("impl=retry", func(b *testing.B) {
		e, _ := benchEnv(b)
		runConsumerBench(b, e, &retry.Options{MaxConcurrency: concurrency}, func(context.Context, *azservicebus.ReceivedMessage) error {
			work()
			return nil
		})
	})
}

// runConsumerBench runs a retry.Consumer with opts over e until b.N originals are settled (completed, or
// completed after their copy was scheduled).
func runConsumerBench(b *testing.B, e *env, opts *retry.Options, handler retry.Handler) {
	b.Helper()
	var done atomic.Int64
	all := make(chan struct{})
	opts.Logger = slog.New(slog.DiscardHandler)
	opts.Hooks.OnProcessed = func(p retry.ProcessedParams) {
		if o := p.Result.Outcome; (o == retry.OutcomeCompleted || o == retry.OutcomeRetryScheduled) && done.Add(1) == int64(b.N) {
			close(all)
		}
	}
	c, err := retry.NewConsumer(e.connector(), handler, opts)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	b.ResetTimer()
	cpu := cputime.Process()
	go func() { stopped <- c.Run(ctx) }()
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
	reportCPU(b, cpu)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// TestSameCopyMatchesTheLibrarysCopy keeps BenchmarkConsumeWithFailures' impl=loop-same-copy honest: the
// copy it schedules must be the one retry.Consumer schedules for the same message, property for
// property, so that the two differ only in the work around it.
func TestSameCopyMatchesTheLibrarysCopy(t *testing.T) {
	e := newEnv(t, queueSettings{})
	preload(t, e.connStr, e.queue, "bench", 1, 256)
	type seen struct{ msg, copy *azservicebus.Message }
	got := make(chan seen, 1)
	c, err := retry.NewConsumer(e.connector(), func(context.Context, *azservicebus.ReceivedMessage) error {
		return retry.RetryAfter(time.Hour, errBoom)
	}, &retry.Options{Logger: slog.New(slog.DiscardHandler), Hooks: retry.Hooks{OnRetryCopy: func(p retry.RetryCopyParams) {
		select {
		case got <- seen{sameCopy(p.Message), p.Copy}:
		default:
		}
	}}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	stopped := make(chan error, 1)
	go func() { stopped <- c.Run(ctx) }()
	var s seen
	select {
	case s = <-got:
	case <-time.After(testTimeout):
		t.Fatal("no retry copy")
	}
	cancel()
	require.NoError(t, <-stopped)
	assert.Equal(t, *s.copy.MessageID, *s.msg.MessageID)
	assert.Equal(t, s.copy.ApplicationProperties, s.msg.ApplicationProperties)
	assert.Equal(t, s.copy.Body, s.msg.Body)
	assert.Equal(t, s.copy.TimeToLive, s.msg.TimeToLive)
}
