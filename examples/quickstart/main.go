// Command quickstart shows retry.Consumer at work through the real azservicebus SDK: flaky messages are
// retried on a fast Fibonacci schedule until they succeed, and a poison message is dead-lettered after
// its last attempt and read back from the dead-letter queue. A second scenario retries a topic
// subscription's message through its own retry queue, so the topic's other subscription never sees a
// retry copy.
//
//	go run ./examples/quickstart
//
// With no settings it starts the in-process Service Bus emulator on a loopback port, so it needs no
// Azure and no Docker. With SERVICEBUS_CONNECTION_STRING and SERVICEBUS_QUEUE set it uses that
// namespace and queue instead (the queue should be empty and have duplicate detection on).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/dlqmonitor"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	connStr, queue := os.Getenv("SERVICEBUS_CONNECTION_STRING"), os.Getenv("SERVICEBUS_QUEUE")
	if connStr == "" || queue == "" {
		em, err := startEmulator()
		if err != nil {
			fmt.Fprintln(os.Stderr, "quickstart:", err)
			os.Exit(1)
		}
		defer em.Close()
		connStr, queue = em.ConnectionString(), "quickstart"
		dlqAlert = emulatorAlert(em, queue)
		fmt.Printf("using the in-process emulator at %s\n", em.Addr())
	} else {
		fmt.Printf("using queue %q of the namespace in SERVICEBUS_CONNECTION_STRING\n", queue)
	}
	if err := run(ctx, os.Stdout, connStr, queue); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
	if os.Getenv("SERVICEBUS_CONNECTION_STRING") == "" { // the topic scenario needs the emulator's entities
		if err := runTopic(ctx, os.Stdout, connStr); err != nil {
			fmt.Fprintln(os.Stderr, "quickstart:", err)
			os.Exit(1)
		}
	}
}

// startEmulator serves the queue, with duplicate detection on as recommended for retries, and the
// topic scenario's entities.
func startEmulator() (*sbemu.Emulator, error) {
	topics, queues := topicEntities()
	return sbemu.Start(sbemu.Config{
		Queues: append([]broker.QueueConfig{{Name: "quickstart", DuplicateDetectionWindow: 10 * time.Minute}}, queues...),
		Topics: topics,
	})
}

// failuresBeforeSuccess says how often each message fails before its handler succeeds; -1 never does.
var failuresBeforeSuccess = map[string]int{"order-1": 0, "order-2": 1, "order-3": 3, "poison": -1}

var sendOrder = []string{"order-1", "order-2", "order-3", "poison"}

const maxAttempts = 5

func run(ctx context.Context, out io.Writer, connStr, queue string) error {
	// A run prefix keeps the ids unique, so reruns against a live queue with duplicate detection work.
	prefix := fmt.Sprintf("qs%d-", time.Now().UnixMilli()%1_000_000)
	if err := sendBatch(ctx, connStr, queue, prefix); err != nil {
		return err
	}

	var mu sync.Mutex
	finished := 0
	allDone := make(chan struct{})
	start := time.Now()
	handler := func(ctx context.Context, msg *azservicebus.ReceivedMessage) error {
		env, _ := envelope.FromContext(ctx)
		fails, ok := failuresBeforeSuccess[strings.TrimPrefix(env.Key, prefix)]
		if !ok {
			return retry.Permanent(fmt.Errorf("unexpected message %q", msg.MessageID))
		}
		if fails >= 0 && env.Attempt > fails {
			return nil
		}
		return errors.New("payment service unavailable")
	}
	fmt.Fprintf(out, "%8s  %-8s %-8s %-20s %s\n", "time", "message", "attempt", "outcome", "next try in")
	connect, err := retry.NewNamespace(connStr, nil).Queue(queue)
	if err != nil {
		return err
	}
	consumer, err := retry.NewConsumer(connect, handler, &retry.Options{
		MaxAttempts:    maxAttempts,
		Backoff:        backoff.Fibonacci{Base: 100 * time.Millisecond, Cap: 2 * time.Second},
		MaxConcurrency: 4,
		Logger:         slog.New(slog.DiscardHandler),
		Hooks: retry.Hooks{OnProcessed: func(p retry.ProcessedParams) {
			mu.Lock()
			defer mu.Unlock()
			next := ""
			if p.Result.Outcome == retry.OutcomeRetryScheduled {
				next = p.Result.Delay.String()
			}
			fmt.Fprintf(out, "%7.3fs  %-8s %-8d %-20s %s\n", time.Since(start).Seconds(),
				strings.TrimPrefix(p.Envelope.Key, prefix), p.Result.Attempt, p.Result.Outcome, next)
			if p.Result.Outcome == retry.OutcomeCompleted || p.Result.Outcome == retry.OutcomeDeadLettered {
				if finished++; finished == len(failuresBeforeSuccess) {
					close(allDone)
				}
			}
		}},
	})
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
	if err := printInspection(ctx, out, connStr, queue, prefix+"poison"); err != nil {
		return err
	}
	if dlqAlert != nil {
		if err := dlqAlert(ctx, out); err != nil {
			return err
		}
	}
	return printDeadLetters(ctx, out, connStr, queue, prefix)
}

// dlqAlert, when set, polls the dead-letter depth once and prints the alert; it needs the
// administration API, which the emulator serves (for a real namespace, build an admin.Client).
var dlqAlert func(ctx context.Context, out io.Writer) error

// emulatorAlert is dlqAlert against the emulator's administration API: one poll of the dead-letter
// monitor, which alerts from the first dead letter on.
func emulatorAlert(em *sbemu.Emulator, queue string) func(ctx context.Context, out io.Writer) error {
	return func(ctx context.Context, out io.Writer) error {
		ac, err := admin.NewClientFromConnectionString(em.ConnectionString(), em.AdminClientOptions())
		if err != nil {
			return err
		}
		m, err := dlqmonitor.New(ac, []string{queue}, &dlqmonitor.Options{OnDeadLetters: func(p dlqmonitor.DeadLetterParams) {
			fmt.Fprintf(out, "alert: %d message(s) in the dead-letter queue of %s, %d new\n", p.Count, p.Entity, p.New)
		}})
		if err != nil {
			return err
		}
		for _, r := range m.Poll(ctx) {
			if r.Err != nil {
				return r.Err
			}
		}
		return nil
	}
}

// printInspection asks the inspector what became of a message, as support would: "is it going to be
// retried, and when?"
func printInspection(ctx context.Context, out io.Writer, connStr, queue, id string) error {
	client, err := azservicebus.NewClientFromConnectionString(connStr, nil)
	if err != nil {
		return err
	}
	defer client.Close(context.WithoutCancel(ctx))
	in, err := inspect.New(client, queue, nil)
	if err != nil {
		return err
	}
	st, err := in.Status(ctx, id)
	if err != nil {
		return err
	}
	for _, p := range st.Pending {
		fmt.Fprintf(out, "inspector: will be retried (attempt %d) at %s\n", p.Attempt, p.DueTime.Format(time.RFC3339))
	}
	for _, d := range st.DeadLetters {
		fmt.Fprintf(out, "inspector: dead-lettered after attempt %d: %s (%s)\n", d.Attempt, d.Reason, d.LastError)
	}
	return nil
}

// sendBatch sends the sample messages with the SDK, as a producer would.
func sendBatch(ctx context.Context, connStr, queue, prefix string) error {
	client, err := azservicebus.NewClientFromConnectionString(connStr, nil)
	if err != nil {
		return err
	}
	defer client.Close(context.WithoutCancel(ctx))
	sender, err := client.NewSender(queue, nil)
	if err != nil {
		return err
	}
	batch, err := sender.NewMessageBatch(ctx, nil)
	if err != nil {
		return err
	}
	for _, name := range sendOrder {
		id := prefix + name
		if err := batch.AddMessage(&azservicebus.Message{MessageID: &id, Body: []byte(`{"order":"` + name + `"}`)}, nil); err != nil {
			return err
		}
	}
	return sender.SendMessageBatch(ctx, batch, nil)
}

// printDeadLetters reads this run's messages back from the dead-letter queue with the SDK.
func printDeadLetters(ctx context.Context, out io.Writer, connStr, queue, prefix string) error {
	client, err := azservicebus.NewClientFromConnectionString(connStr, nil)
	if err != nil {
		return err
	}
	defer client.Close(context.WithoutCancel(ctx))
	dlq, err := client.NewReceiverForQueue(queue, &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	msgs, err := dlq.ReceiveMessages(rctx, 10, nil)
	if err != nil {
		return fmt.Errorf("reading the dead-letter queue: %w", err)
	}
	for _, m := range msgs {
		// A dead letter from a retry copy has a retry MessageID; the envelope names the original.
		env, err := envelope.Decode(m)
		if err != nil || !strings.HasPrefix(env.OriginalMessageID, prefix) {
			continue // not ours; leave it
		}
		fmt.Fprintf(out, "dead-letter queue: %s attempt=%v reason=%s description=%q\n",
			strings.TrimPrefix(env.OriginalMessageID, prefix), m.ApplicationProperties[envelope.PropDeadLetterAttempt],
			deref(m.DeadLetterReason), deref(m.DeadLetterErrorDescription))
		if err := dlq.CompleteMessage(ctx, m, nil); err != nil {
			return err
		}
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
