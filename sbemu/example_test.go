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
