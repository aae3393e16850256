// Command quickstart shows retry.Consumer at work: flaky messages are retried on a fast Fibonacci
// schedule until they succeed, and a poison message is dead-lettered after its last attempt.
//
//	go run ./examples/quickstart
//
// It needs no Azure: the queue is the in-memory broker of package retrytest.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/retrytest"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// failuresBeforeSuccess says how often each message fails before its handler succeeds; "poison" never
// succeeds.
var failuresBeforeSuccess = map[string]int{"order-1": 0, "order-2": 1, "order-3": 3, "poison": -1}

func run(ctx context.Context, out io.Writer) error {
	broker := retrytest.NewBroker(nil, &retrytest.BrokerOptions{DuplicateDetection: true})
	for _, id := range []string{"order-1", "order-2", "order-3", "poison"} {
		broker.Send(&azservicebus.Message{MessageID: &id, Body: []byte(`{"order":"` + id + `"}`)})
	}

	var mu sync.Mutex
	finished := 0
	allDone := make(chan struct{})
	start := time.Now()
	handler := func(ctx context.Context, msg *azservicebus.ReceivedMessage) error {
		env, _ := retry.EnvelopeFromContext(ctx)
		want := failuresBeforeSuccess[env.Key]
		if want >= 0 && env.Attempt > want {
			return nil
		}
		return errors.New("payment service unavailable")
	}
	backoff := retry.Fibonacci{Base: 50 * time.Millisecond, Cap: 2 * time.Second}
	opts := &retry.Options{
		MaxAttempts:    5,
		Backoff:        backoff,
		MaxConcurrency: 4,
		Logger:         slog.New(slog.DiscardHandler),
		Hooks: retry.Hooks{OnProcessed: func(p retry.ProcessedParams) {
			mu.Lock()
			defer mu.Unlock()
			line := fmt.Sprintf("%7.3fs  %-8s attempt %d  %s", time.Since(start).Seconds(), p.Envelope.Key, p.Result.Attempt, p.Result.Outcome)
			switch p.Result.Outcome {
			case retry.OutcomeRetryScheduled:
				line += fmt.Sprintf(" in %s (%v)", p.Result.Delay, p.Result.HandlerErr)
			case retry.OutcomeDeadLettered:
				line += " (" + p.Result.DeadLetterReason + ")"
			}
			fmt.Fprintln(out, line)
			if p.Result.Outcome == retry.OutcomeCompleted || p.Result.Outcome == retry.OutcomeDeadLettered {
				if finished++; finished == len(failuresBeforeSuccess) {
					close(allDone)
				}
			}
		}},
	}
	consumer, err := retry.NewConsumer(broker.Connector(), handler, opts)
	if err != nil {
		return err
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- consumer.Run(runCtx) }()
	select {
	case <-allDone:
	case <-ctx.Done():
	}
	stop()
	if err := <-done; err != nil {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("not finished in time: %w", ctx.Err())
	}
	h := consumer.Health()
	fmt.Fprintf(out, "\nsummary: %d deliveries, %d completed, %d retries scheduled, %d dead-lettered\n",
		h.Received, h.Completed, h.RetriesScheduled, h.DeadLettered)
	for _, dl := range broker.DeadLettered() {
		fmt.Fprintf(out, "dead-letter queue: %s reason=%s description=%q\n", dl.Message.MessageID, dl.Reason, dl.Description)
	}
	return nil
}
