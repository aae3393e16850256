package retrytest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/retrytest"
	sbbroker "github.com/sbretry/retry/sbemu/broker"
)

// A flaky handler is retried three times on the Fibonacci schedule and then dead-lettered, all on a
// mock clock: the test takes no real time.
func Example() {
	mock := clock.NewMock()
	broker := retrytest.NewBroker(mock, nil)
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
	env, _ := retry.DecodeEnvelope(dl.Message)
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
