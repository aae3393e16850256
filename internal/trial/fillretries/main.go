// Command fillretries fills a Service Bus queue (the emulator, usually) with N real pending retries, as
// an outage makes them: it sends N messages and runs a retry.Consumer whose handler fails each one,
// with a retry-state index recorder, so that each message becomes a retry copy scheduled far ahead
// and an event in the index (or, with -max-attempts 1, a dead letter). It is the "new user" trial of
// issue 33 (BENCHMARKS.md).
//
//	go run ./internal/trial/fillretries -connection-string "$CS" -queue orders -n 1000000 -index /tmp/trial/index.db
//	go run ./internal/trial/fillretries -connection-string "$CS" -queue orders -n 100000 -prefix dead- -max-attempts 1 -index /tmp/trial/index.db
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/retryindex"
)

func main() {
	cs := flag.String("connection-string", os.Getenv("SERVICEBUS_CONNECTION_STRING"), "namespace connection string")
	queue := flag.String("queue", "orders", "queue to fill")
	n := flag.Int("n", 100_000, "messages to send and fail once")
	index := flag.String("index", "", "SQLite file of the retry-state index (empty: no index)")
	delay := flag.Duration("delay", 6*time.Hour, "the retries fall due between this and three times this ahead")
	skipSend := flag.Bool("skip-send", false, "only run the consumer (the messages were sent before)")
	prefix := flag.String("prefix", "order-", "MessageID prefix, followed by the message's number")
	maxAttempts := flag.Int("max-attempts", 0, "Options.MaxAttempts (1: every message is dead-lettered at once)")
	flag.Parse()
	if err := run(*cs, *queue, *n, *index, *prefix, *maxAttempts, *delay, *skipSend); err != nil {
		log.Fatal(err)
	}
}

func run(cs, queue string, n int, index, prefix string, maxAttempts int, delay time.Duration, skipSend bool) (err error) {
	if n < 1 || delay <= 0 {
		return fmt.Errorf("-n must be at least 1 and -delay positive (got %d and %v)", n, delay)
	}
	ctx := context.Background()
	client, err := azservicebus.NewClientFromConnectionString(cs, nil)
	if err != nil {
		return err
	}
	defer client.Close(ctx)
	if !skipSend {
		start := time.Now()
		if err := send(ctx, client, queue, prefix, n); err != nil {
			return err
		}
		log.Printf("sent %d messages in %v", n, time.Since(start).Round(time.Millisecond))
	}
	opts := &retry.Options{
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		MaxConcurrency: 32,
		MaxAttempts:    maxAttempts,
		// Each retry falls due between delay and 3×delay ahead, so that the due order is not the send order.
		Backoff: backoff.Jitter{Backoff: backoff.Constant{Interval: 2 * delay}, Fraction: 0.5},
	}
	var rec *retryindex.Recorder
	if index != "" {
		store, err := retryindex.OpenSQLite(index, nil)
		if err != nil {
			return err
		}
		defer store.Close()
		if rec, err = retryindex.NewRecorder(store, nil); err != nil {
			return err
		}
		// Closed on every return (before the store): it writes what is still queued.
		defer func() {
			if cerr := rec.Close(ctx); err == nil {
				err = cerr
			}
		}()
	}
	var failed atomic.Int64
	done := make(chan struct{})
	opts.Hooks.OnProcessed = func(p retry.ProcessedParams) {
		o := p.Result.Outcome
		if (o == retry.OutcomeRetryScheduled || o == retry.OutcomeDeadLettered) && failed.Add(1) == int64(n) {
			close(done)
		}
	}
	if rec != nil {
		opts.Hooks = rec.Hooks(opts.Hooks)
	}
	connect, err := retry.NewNamespace(cs, nil).Queue(queue)
	if err != nil {
		return err
	}
	c, err := retry.NewConsumer(connect, func(context.Context, *azservicebus.ReceivedMessage) error {
		return errors.New("ledger: 503 Service Unavailable (the trial's outage)")
	}, opts)
	if err != nil {
		return err
	}
	rctx, stop := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(rctx) }()
	start := time.Now()
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
wait:
	for {
		select {
		case <-done:
			break wait
		case err := <-runErr:
			stop()
			return fmt.Errorf("consumer stopped: %w", err)
		case <-tick.C:
			log.Printf("%d failed (%.0f/s)", failed.Load(), float64(failed.Load())/time.Since(start).Seconds())
		}
	}
	took := time.Since(start)
	stop()
	if err := <-runErr; err != nil {
		return err
	}
	if rec != nil {
		if err := rec.Close(ctx); err != nil {
			return err
		}
		log.Printf("recorder: %+v", rec.Stats()) // after the close: every record written or dropped
	}
	log.Printf("%d failed (retries scheduled or dead-lettered) in %v (%.0f/s)", n, took.Round(time.Millisecond), float64(n)/took.Seconds())
	return nil
}

// send sends n messages, prefix followed by %08d, in batches.
func send(ctx context.Context, client *azservicebus.Client, queue, prefix string, n int) error {
	sender, err := client.NewSender(queue, nil)
	if err != nil {
		return err
	}
	defer sender.Close(ctx)
	for i := 0; i < n; {
		batch, err := sender.NewMessageBatch(ctx, nil)
		if err != nil {
			return err
		}
		for ; i < n; i++ {
			id := fmt.Sprintf("%s%08d", prefix, i)
			err := batch.AddMessage(&azservicebus.Message{MessageID: &id, Body: []byte(`{"order":"` + id + `","amount":4200}`)}, nil)
			if errors.Is(err, azservicebus.ErrMessageTooLarge) {
				break
			}
			if err != nil {
				return err
			}
		}
		if err := sender.SendMessageBatch(ctx, batch, nil); err != nil {
			return err
		}
	}
	return nil
}
