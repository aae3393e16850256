package sbemu_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// Example starts an emulator with one queue and sends and receives a message
// through the unmodified SDK. In a test, [sbemu.StartT] replaces the Start and
// Close lines. It is compile-checked only: like anything that opens a socket
// it has no Output section.
func Example() {
	em, err := sbemu.Start(sbemu.Config{Queues: []broker.QueueConfig{{Name: "orders", LockDuration: 30 * time.Second}}})
	if err != nil {
		log.Fatal(err)
	}
	defer em.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	sender, err := client.NewSender("orders", nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := sender.SendMessage(ctx, &azservicebus.Message{Body: []byte("hello")}, nil); err != nil {
		log.Fatal(err)
	}
	receiver, err := client.NewReceiverForQueue("orders", nil)
	if err != nil {
		log.Fatal(err)
	}
	msgs, err := receiver.ReceiveMessages(ctx, 1, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(msgs[0].Body))
	if err := receiver.CompleteMessage(ctx, msgs[0], nil); err != nil {
		log.Fatal(err)
	}

	// What the broker holds can be inspected directly.
	q, _ := em.Broker().Queue("orders")
	fmt.Printf("%+v\n", q.Stats())
}

// Example_topics serves a topic whose subscriptions select messages with a
// SQL rule and a correlation rule, and receives from one of them. Like
// [Example] it opens a socket, so it is compile-checked only.
func Example_topics() {
	em, err := sbemu.Start(sbemu.Config{Topics: []broker.TopicConfig{{
		Name: "orders",
		Subscriptions: []broker.SubscriptionConfig{
			{Name: "all"}, // the $Default rule: every message
			{Name: "big", Rules: []broker.RuleConfig{{Name: "big", SQLFilter: "amount >= 1000 AND sys.Label = 'created'"}}},
			{Name: "eu", Rules: []broker.RuleConfig{{Name: "eu", CorrelationFilter: &broker.CorrelationFilter{Properties: map[string]any{"region": "eu"}}}}},
		},
	}}})
	if err != nil {
		log.Fatal(err)
	}
	defer em.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)
	sender, err := client.NewSender("orders", nil)
	if err != nil {
		log.Fatal(err)
	}
	subject := "created"
	err = sender.SendMessage(ctx, &azservicebus.Message{
		Body: []byte("order 7"), Subject: &subject,
		ApplicationProperties: map[string]any{"amount": 2500, "region": "us"},
	}, nil)
	if err != nil {
		log.Fatal(err)
	}

	receiver, err := client.NewReceiverForSubscription("orders", "big", nil)
	if err != nil {
		log.Fatal(err)
	}
	msgs, err := receiver.ReceiveMessages(ctx, 1, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(msgs[0].Body))

	eu, _ := em.Broker().Subscription("orders", "eu")
	fmt.Println(eu.Stats().Active) // 0: the rule did not select it
}

// ExampleConfigFromFile starts an emulator on the Config.json of
// Microsoft's emulator.
func ExampleConfigFromFile() {
	cfg, err := sbemu.ConfigFromFile("testdata/Config.json")
	if err != nil {
		log.Fatal(err)
	}
	em, err := sbemu.Start(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer em.Close()
	fmt.Println(em.Broker().Queues(), em.Broker().Topics())
}
