// Command defaultcredential consumes a queue with delayed retries, authenticating with Microsoft Entra
// ID through azidentity's DefaultAzureCredential (environment, workload identity, managed identity or
// Azure CLI). It needs a real namespace:
//
//	SERVICEBUS_NAMESPACE=myns.servicebus.windows.net SERVICEBUS_QUEUE=orders go run ./examples/defaultcredential
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
)

func main() {
	namespace, queue := os.Getenv("SERVICEBUS_NAMESPACE"), os.Getenv("SERVICEBUS_QUEUE")
	if namespace == "" || queue == "" {
		fmt.Fprintln(os.Stderr, "set SERVICEBUS_NAMESPACE and SERVICEBUS_QUEUE")
		os.Exit(2)
	}
	cred, err := azidentity.NewDefaultAzureCredential(nil)
	if err != nil {
		slog.Error("no credential", "error", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	handler := func(ctx context.Context, msg *azservicebus.ReceivedMessage) error {
		// Honour a downstream's Retry-After instead of the backoff schedule.
		return retry.RetryAfter(30*time.Second, fmt.Errorf("downstream throttled message %s", msg.MessageID))
	}
	connect, err := retry.NewNamespaceCredential(namespace, cred, nil).Queue(queue)
	if err != nil {
		slog.Error("invalid settings", "error", err)
		os.Exit(1)
	}
	consumer, err := retry.NewConsumer(connect, handler, &retry.Options{
		MaxConcurrency: 16,
		Backoff:        backoff.Jitter{Backoff: backoff.Exponential{Base: 5 * time.Second, Cap: time.Hour}},
	})
	if err != nil {
		slog.Error("invalid options", "error", err)
		os.Exit(1)
	}

	// Readiness and liveness probes backed by Consumer.Health (JSON: state, last error, counters).
	mux := http.NewServeMux()
	mux.Handle("/readyz", retry.ReadinessHandler(consumer))
	mux.Handle("/livez", retry.LivenessHandler(consumer))
	go func() { _ = http.ListenAndServe("127.0.0.1:8080", mux) }()
	if err := consumer.Run(ctx); err != nil {
		slog.Error("consumer stopped", "error", err)
		os.Exit(1)
	}
}
