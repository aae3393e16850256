package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/sbemu/broker"
)

// The topic scenario's entities: a topic with two subscriptions, billing (consumed with retries, its
// copies scheduled to its own retry queue) and audit (someone else's plain consumer).
const (
	quickstartTopic = "quickstart-events"
	billingSub      = "billing"
	billingRetry    = "quickstart-events-billing-retry"
	auditSub        = "audit"
)

// topicEntities are the emulator's entities for the topic scenario.
func topicEntities() ([]broker.TopicConfig, []broker.QueueConfig) {
	return []broker.TopicConfig{{
			Name: quickstartTopic, DuplicateDetectionWindow: 10 * time.Minute,
			Subscriptions: []broker.SubscriptionConfig{{Name: billingSub}, {Name: auditSub}},
		}},
		[]broker.QueueConfig{{Name: billingRetry, DuplicateDetectionWindow: 10 * time.Minute}}
}

// runTopic publishes one event to the topic. Billing fails it twice and succeeds on attempt 3; audit
// receives it exactly once, and never a retry copy. It prints who received what.
func runTopic(ctx context.Context, out io.Writer, connStr string) error {
	fmt.Fprintf(out, "\ntopic %s: billing fails twice, audit just reads\n", quickstartTopic)
	client, err := azservicebus.NewClientFromConnectionString(connStr, nil)
	if err != nil {
		return err
	}
	defer client.Close(context.WithoutCancel(ctx))
	sender, err := client.NewSender(quickstartTopic, nil)
	if err != nil {
		return err
	}
	id := "invoice-1"
	if err := sender.SendMessage(ctx, &azservicebus.Message{MessageID: &id, Body: []byte(`{"invoice":1}`)}, nil); err != nil {
		return err
	}

	var mu sync.Mutex
	var received []string
	note := func(who string, attempt int) {
		mu.Lock()
		received = append(received, fmt.Sprintf("%-8s attempt %d", who, attempt))
		mu.Unlock()
	}
	done := make(chan struct{})
	connect, err := retry.NewNamespace(connStr, nil).Subscription(quickstartTopic, billingSub, billingRetry)
	if err != nil {
		return err
	}
	billing, err := retry.NewConsumer(connect, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
		env, _ := envelope.FromContext(ctx)
		note(billingSub, env.Attempt)
		if env.Attempt < 3 {
			return errors.New("ledger unavailable")
		}
		close(done)
		return nil
	}, &retry.Options{Backoff: backoff.Fibonacci{Base: 100 * time.Millisecond, Cap: time.Second}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- billing.Run(runCtx) }()

	// audit: a plain SDK consumer, reading until the billing chain is done and a moment more.
	audit, err := client.NewReceiverForSubscription(quickstartTopic, auditSub, nil)
	if err != nil {
		stop()
		<-stopped
		return err
	}
	auditDone := make(chan error, 1)
	go func() {
		for {
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			msgs, err := audit.ReceiveMessages(rctx, 10, nil)
			cancel()
			if err != nil || len(msgs) == 0 {
				auditDone <- nil
				return
			}
			for _, m := range msgs {
				env, _ := envelope.Decode(m)
				note(auditSub, env.Attempt)
				if err := audit.CompleteMessage(ctx, m, nil); err != nil {
					auditDone <- err
					return
				}
			}
		}
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
	auditErr := <-auditDone
	stop()
	if err := errors.Join(<-stopped, auditErr); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("topic scenario not finished in time: %w", ctx.Err())
	}
	mu.Lock()
	defer mu.Unlock()
	sort.Strings(received)
	fmt.Fprintf(out, "received: %s\n", strings.Join(received, "; "))
	return nil
}
