package console_test

import (
	"context"
	"log"
	"net/http"
	"os"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/console"
)

// Example mounts the console under /ops/ next to a service's health endpoint. It needs a namespace,
// so it only compiles.
func Example() {
	client, err := azservicebus.NewClientFromConnectionString(os.Getenv("SERVICEBUS_CONNECTION_STRING"), nil)
	if err != nil {
		log.Fatal(err)
	}
	c, err := console.New(client, []console.Entity{
		{Path: "orders"},
		{Path: "events/Subscriptions/billing", RetryQueue: "billing-retry"},
	}, &console.Options{AccessToken: os.Getenv("CONSOLE_TOKEN")})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	go func() { _ = c.Run(ctx) }() // the overview's history
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.Handle("/ops/", http.StripPrefix("/ops", c))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}
