package dlqmonitor_test

import (
	"context"
	"log"
	"os"
	"os/signal"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"

	"github.com/sbretry/retry/dlqmonitor"
)

// Example watches a queue and a subscription and logs every poll that
// finds dead letters. It needs a namespace, so it only compiles here.
func Example() {
	ac, err := admin.NewClientFromConnectionString(os.Getenv("SERVICEBUS_CONNECTION_STRING"), nil)
	if err != nil {
		log.Fatal(err)
	}
	m, err := dlqmonitor.New(ac, []string{"orders", "events/Subscriptions/billing"}, &dlqmonitor.Options{
		OnDeadLetters: func(p dlqmonitor.DeadLetterParams) {
			if p.New > 0 {
				log.Printf("ALERT %s: %d dead letters, %d new", p.Entity, p.Count, p.New)
			}
		},
		OnError: func(p dlqmonitor.ErrorParams) { log.Printf("dead-letter monitor: %s: %v", p.Entity, p.Err) },
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	_ = m.Run(ctx)
}
