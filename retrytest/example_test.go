package retrytest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/retrytest"
	sbbroker "github.com/sbretry/retry/sbemu/broker"
)

// A flaky handler is retried three times on the Fibonacci schedule and then dead-lettered, all on a
// mock clock: the test takes no real time.
func Example() {
	mock := clock.NewMock()
	broker, err := retrytest.New(mock, nil)
	if err != nil {
		panic(err)
	}
	receiver := broker.Receiver()

	flaky := func(ctx context.Context, msg *azservicebus.ReceivedMessage) error {
		return errors.New("payment service unavailable")
	}
	proc, err := retry.NewProcessor(broker.Sender(), flaky, &retry.Options{
		MaxAttempts: 4,
		EntityPath:  "orders",
		Clock:       mock,
		Logger:      slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}

	id := "order-1"
	broker.Send(&azservicebus.Message{MessageID: &id, Body: []byte(`{"amount":42}`)})
	start := mock.Now()
	for {
		msgs, err := receiver.ReceiveMessages(context.Background(), 1, nil)
		if err != nil {
			panic(err)
		}
		res := proc.Process(context.Background(), receiver, msgs[0])
		fmt.Printf("t=%-4s attempt %d: %s\n", mock.Now().Sub(start), res.Attempt, res.Outcome)
		if res.Outcome != retry.OutcomeRetryScheduled {
			break
		}
		mock.Add(res.Delay) // jump to the retry's scheduled time
	}
	for _, s := range broker.Scheduled() {
		fmt.Printf("scheduled attempt %d for t=%s\n", s.Attempt, s.At.Sub(start))
	}
	dl := broker.DeadLettered()[0]
	env, _ := envelope.Decode(dl.Message)
	fmt.Printf("dead-lettered %s at attempt %d: %s (%s)\n", env.OriginalMessageID, env.Attempt, dl.Reason, dl.Description)

	// Output:
	// t=0s   attempt 1: retry-scheduled
	// t=10s  attempt 2: retry-scheduled
	// t=20s  attempt 3: retry-scheduled
	// t=40s  attempt 4: dead-lettered
	// scheduled attempt 2 for t=10s
	// scheduled attempt 3 for t=20s
	// scheduled attempt 4 for t=40s
	// dead-lettered order-1 at attempt 4: RetryMaxAttemptsExceeded (payment service unavailable)
}

// A topic with two subscriptions, one selecting by a SQL rule: each subscription gets the copies its
// rules select, exactly as the emulator (and Service Bus) would deliver them.
func ExampleBrokerOptions_subscriptions() {
	broker, err := retrytest.New(clock.NewMock(), &retrytest.BrokerOptions{
		EntityPath: "orders",
		Subscriptions: []sbbroker.SubscriptionConfig{
			{Name: "all"},
			{Name: "eu", Rules: []sbbroker.RuleConfig{{Name: "eu", SQLFilter: "region = 'eu'"}}},
		},
	})
	if err != nil {
		panic(err)
	}
	for _, region := range []string{"eu", "us"} {
		if _, err := broker.Send(&azservicebus.Message{Body: []byte("order from " + region), ApplicationProperties: map[string]any{"region": region}}); err != nil {
			panic(err)
		}
	}
	for _, sub := range []string{"all", "eu"} {
		r, err := broker.SubscriptionReceiver(sub)
		if err != nil {
			panic(err)
		}
		msgs, err := r.ReceiveMessages(context.Background(), 10, nil)
		if err != nil {
			panic(err)
		}
		for _, m := range msgs {
			fmt.Printf("%s: %s\n", sub, m.Body)
		}
	}
	// Output:
	// all: order from eu
	// all: order from us
	// eu: order from eu
}

// The README's topic layout in one broker: the billing subscription's consumer schedules its retries to
// a queue of its own, so audit, another team's subscription of the same topic, never sees a retry. A
// failed attempt counts as Retried, not Succeeded, and each dead letter is in the dead-letter queue
// Service Bus would put it in: a message refused on its first delivery in the subscription's, one that
// spent its attempts in the retry queue's, where its last attempt came from.
func ExampleBrokerOptions_retryQueue() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // bounds every receive
	defer cancel()
	mock := clock.NewMock()
	broker, err := retrytest.New(mock, &retrytest.BrokerOptions{
		EntityPath:         "orders/Subscriptions/billing",
		RetryQueue:         "orders-billing-retry",
		Subscriptions:      []sbbroker.SubscriptionConfig{{Name: "billing"}, {Name: "audit"}},
		DuplicateDetection: true,
	})
	if err != nil {
		panic(err)
	}
	handler := func(ctx context.Context, msg *azservicebus.ReceivedMessage) error {
		env, _ := envelope.FromContext(ctx)
		switch {
		case string(msg.Body) == "order-3":
			return retry.Permanent(errors.New("unknown customer"))
		case string(msg.Body) == "order-2", env.Attempt < 3:
			return errors.New("payment service unavailable")
		}
		return nil
	}
	// broker.Sender schedules to the retry queue; broker.Connector gives a Consumer the same layout.
	proc, err := retry.NewProcessor(broker.Sender(), handler, &retry.Options{
		MaxAttempts: 3,
		EntityPath:  "orders/Subscriptions/billing",
		Clock:       mock,
		Logger:      slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	billing := broker.Receiver() // the subscription EntityPath names
	retries, err := broker.RetryQueueReceiver()
	if err != nil {
		panic(err)
	}
	for _, id := range []string{"order-1", "order-2", "order-3"} {
		if _, err := broker.Send(&azservicebus.Message{MessageID: &id, Body: []byte(id)}); err != nil {
			panic(err)
		}
	}

	start := mock.Now()
	process := func(from string, r retry.Receiver, n int) {
		for range n {
			msgs, err := r.ReceiveMessages(ctx, 1, nil)
			if err != nil {
				panic(err)
			}
			res := proc.Process(ctx, r, msgs[0])
			fmt.Printf("t=%-3s %-7s from %-8s attempt %d: %s\n", mock.Now().Sub(start), msgs[0].Body, from, res.Attempt, res.Outcome)
		}
	}
	process("billing", billing, 3)
	for {
		if _, ok := broker.AdvanceToNextScheduled(mock); !ok {
			break
		}
		process("retries", retries, 2)
	}

	st := broker.Stats()
	fmt.Printf("succeeded %d, retried %d, scheduled %d, dead-lettered %d, waiting in audit %d\n",
		st.Succeeded, st.Retried, st.Scheduled, st.DeadLettered, st.Active)
	for _, dl := range broker.DeadLettered() {
		fmt.Printf("dead letter %s in %s: %s\n", dl.Message.Body, dl.Entity, dl.Reason)
	}

	// Output:
	// t=0s  order-1 from billing  attempt 1: retry-scheduled
	// t=0s  order-2 from billing  attempt 1: retry-scheduled
	// t=0s  order-3 from billing  attempt 1: dead-lettered
	// t=10s order-1 from retries  attempt 2: retry-scheduled
	// t=10s order-2 from retries  attempt 2: retry-scheduled
	// t=20s order-1 from retries  attempt 3: completed
	// t=20s order-2 from retries  attempt 3: dead-lettered
	// succeeded 1, retried 4, scheduled 4, dead-lettered 2, waiting in audit 3
	// dead letter order-3 in orders/Subscriptions/billing: RetryPermanentFailure
	// dead letter order-2 in orders-billing-retry: RetryMaxAttemptsExceeded
}

// settlePrinter prints each complete and dead-letter on its way to the broker.
type settlePrinter struct{ retry.Receiver }

func (r settlePrinter) CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.CompleteMessageOptions) error {
	fmt.Printf("complete %s\n", m.Body)
	return r.Receiver.CompleteMessage(ctx, m, o)
}

func (r settlePrinter) DeadLetterMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.DeadLetterOptions) error {
	fmt.Printf("dead-letter %s: %s\n", m.Body, *o.Reason)
	return r.Receiver.DeadLetterMessage(ctx, m, o)
}

// WrapReceiver puts a test's own code between the code under test and the broker, on every receiver
// the broker hands out (a Consumer's through Connector too): here it prints the settlements a
// processor makes; a test can as well make one hang or fail in a way [Broker.Fail] does not.
func ExampleBrokerOptions_wrapReceiver() {
	mock := clock.NewMock()
	broker, err := retrytest.New(mock, &retrytest.BrokerOptions{
		WrapReceiver: func(r retry.Receiver) retry.Receiver { return settlePrinter{r} },
	})
	if err != nil {
		panic(err)
	}
	proc, err := retry.NewProcessor(broker.Sender(), func(context.Context, *azservicebus.ReceivedMessage) error {
		return errors.New("payment service unavailable")
	}, &retry.Options{MaxAttempts: 2, EntityPath: "queue", Clock: mock, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	receiver := broker.Receiver()
	if _, err := broker.Send(&azservicebus.Message{Body: []byte("order-1")}); err != nil {
		panic(err)
	}
	for range 2 {
		msgs, err := receiver.ReceiveMessages(context.Background(), 1, nil)
		if err != nil {
			panic(err)
		}
		res := proc.Process(context.Background(), receiver, msgs[0])
		fmt.Printf("attempt %d: %s\n", res.Attempt, res.Outcome)
		mock.Add(res.Delay)
	}
	// Output:
	// complete order-1
	// attempt 1: retry-scheduled
	// dead-letter order-1: RetryMaxAttemptsExceeded
	// attempt 2: dead-lettered
}
