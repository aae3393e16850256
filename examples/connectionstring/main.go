// Command connectionstring consumes a queue with delayed retries, authenticating with a connection
// string. It needs a real namespace (or an emulator):
//
//	SERVICEBUS_CONNECTION_STRING='Endpoint=sb://...;SharedAccessKeyName=...;SharedAccessKey=...' \
//	SERVICEBUS_QUEUE=orders go run ./examples/connectionstring
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
)

func main() {
	connStr, queue := os.Getenv("SERVICEBUS_CONNECTION_STRING"), os.Getenv("SERVICEBUS_QUEUE")
	if connStr == "" || queue == "" {
		fmt.Fprintln(os.Stderr, "set SERVICEBUS_CONNECTION_STRING and SERVICEBUS_QUEUE")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	handler := func(ctx context.Context, msg *azservicebus.ReceivedMessage) error {
		env, _ := envelope.FromContext(ctx)
		slog.Info("handling", "message_id", msg.MessageID, "attempt", env.Attempt)
		if len(msg.Body) == 0 {
			return retry.Permanent(errors.New("empty body")) // retrying will not help
		}
		return nil
	}
	connect, err := retry.NewNamespace(connStr, nil).Queue(queue)
	if err != nil {
		slog.Error("invalid connection string", "error", err) // never contains the key
		os.Exit(1)
	}
	consumer, err := retry.NewConsumer(connect, handler, &retry.Options{MaxConcurrency: 8})
	if err != nil {
		slog.Error("invalid options", "error", err)
		os.Exit(1)
	}
	if err := consumer.Run(ctx); err != nil {
		slog.Error("consumer stopped", "error", err)
		os.Exit(1)
	}
}
