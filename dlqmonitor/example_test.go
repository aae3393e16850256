package dlqmonitor_test

import (
	"context"
	"log"
	"net/http"
	"os"
	"os/signal"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"

	"github.com/sbretry/retry/dlqmonitor"
	"github.com/sbretry/retry/retryotel"
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

// Example_metrics feeds every poll into the sbretry.dead_letter.depth gauge
// of package retryotel, next to an alert on new dead letters. It needs a
// namespace, so it only compiles here.
func Example_metrics() {
	inst, err := retryotel.New(nil) // the global MeterProvider
	if err != nil {
		log.Fatal(err)
	}
	ac, err := admin.NewClientFromConnectionString(os.Getenv("SERVICEBUS_CONNECTION_STRING"), nil)
	if err != nil {
		log.Fatal(err)
	}
	m, err := dlqmonitor.New(ac, []string{"orders"}, &dlqmonitor.Options{
		OnPoll: func(p dlqmonitor.PollParams) {
			for _, r := range p.Results {
				if r.Err == nil {
					inst.RecordDeadLetterDepth(r.Entity, r.Count)
				}
			}
		},
		OnDeadLetters: func(p dlqmonitor.DeadLetterParams) {
			if p.New > 0 {
				log.Printf("ALERT %s: %d new dead letters", p.Entity, p.New)
			}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = m.Run(context.Background())
}

// ExampleHealthHandler serves the monitor's readiness next to its polls:
// the probe answers 503 while the monitor cannot read the dead-letter
// counts. It needs a namespace, so it only compiles here.
func ExampleHealthHandler() {
	ac, err := admin.NewClientFromConnectionString(os.Getenv("SERVICEBUS_CONNECTION_STRING"), nil)
	if err != nil {
		log.Fatal(err)
	}
	m, err := dlqmonitor.New(ac, []string{"orders"}, &dlqmonitor.Options{
		OnError: func(p dlqmonitor.ErrorParams) { log.Print(p.Err) }, // names the entity and the endpoint
	})
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("/ready", dlqmonitor.HealthHandler(m))
	go func() { log.Print(http.ListenAndServe("127.0.0.1:8080", nil)) }()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	_ = m.Run(ctx)
}
