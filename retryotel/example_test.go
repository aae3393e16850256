package retryotel_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"github.com/benbjohnson/clock"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/dlqmonitor"
	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/retryotel"
	"github.com/sbretry/retry/retrytest"
)

// Instrumenting a consumer: the global providers (set up by your SDK and exporter) receive the spans
// and metrics. Both wrappers are needed: Hooks for the process spans, the settle spans and the
// metrics; Connector for server.address and server.port (learned from the connection) and the
// renew_message_lock spans, which no hook reports. This example needs an Azure namespace, so it is
// only compiled.
func ExampleNew() {
	inst, err := retryotel.New(nil)
	if err != nil {
		panic(err)
	}
	connect, err := retry.NewNamespace(os.Getenv("SERVICEBUS_CONNECTION_STRING"), nil).Queue("orders")
	if err != nil {
		panic(err)
	}
	consumer, err := retry.NewConsumer(inst.Connector(connect),
		func(ctx context.Context, msg *azservicebus.ReceivedMessage) error {
			return nil // ctx carries the delivery's process span: spans started here are its children
		},
		&retry.Options{Hooks: inst.Hooks(retry.Hooks{
			OnProcessed: func(p retry.ProcessedParams) { /* your own hook still runs */ },
		})},
	)
	if err != nil {
		panic(err)
	}
	_ = consumer.Run(context.Background())
}

// Instrumenting a subscription consumer to the letter: server.address and server.port from the
// connection string, and the Connector wrapper for lock renewals and the retry queue's name. This
// example needs an Azure namespace, so it is only compiled.
func ExampleInstrumentation_Connector() {
	cs := os.Getenv("SERVICEBUS_CONNECTION_STRING")
	host, port, err := retryotel.ServerFromConnectionString(cs)
	if err != nil {
		panic(err)
	}
	inst, err := retryotel.New(&retryotel.Options{ServerAddress: host, ServerPort: port})
	if err != nil {
		panic(err)
	}
	connect, err := retry.NewNamespace(cs, nil).Subscription("orders", "billing", "orders-billing-retry")
	if err != nil {
		panic(err)
	}
	consumer, err := retry.NewConsumer(inst.Connector(connect),
		func(ctx context.Context, msg *azservicebus.ReceivedMessage) error { return nil },
		&retry.Options{Hooks: inst.Hooks(retry.Hooks{})},
	)
	if err != nil {
		panic(err)
	}
	_ = consumer.Run(context.Background())
}

// Instrumenting a session consumer: the same hooks, and the SessionConnector wrapper for the session
// lock renewals and the server (learned from the connection). The handler's spans carry the session id
// in sbretry.session_id. This example needs an Azure namespace, so it is only compiled.
func ExampleInstrumentation_SessionConnector() {
	inst, err := retryotel.New(nil)
	if err != nil {
		panic(err)
	}
	connect, err := retry.NewNamespace(os.Getenv("SERVICEBUS_CONNECTION_STRING"), nil).SessionQueue("orders")
	if err != nil {
		panic(err)
	}
	consumer, err := retry.NewSessionConsumer(inst.SessionConnector(connect),
		func(ctx context.Context, msg *azservicebus.ReceivedMessage) error { return nil },
		&retry.Options{Hooks: inst.Hooks(retry.Hooks{})}, nil,
	)
	if err != nil {
		panic(err)
	}
	_ = consumer.Run(context.Background())
}

// A message fails once and succeeds on its retry. Each attempt has a process span with its broker calls
// as children, and the retry's span links back to the first attempt's, which the copy carried in its
// traceparent property.
func ExampleInstrumentation_Hooks() {
	recorder := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	inst, err := retryotel.New(&retryotel.Options{TracerProvider: tp})
	if err != nil {
		panic(err)
	}

	mock := clock.NewMock()
	broker, err := retrytest.New(mock, nil)
	if err != nil {
		panic(err)
	}
	receiver := broker.Receiver()
	attempts := 0
	proc, err := retry.NewProcessor(broker.Sender(), func(ctx context.Context, msg *azservicebus.ReceivedMessage) error {
		if attempts++; attempts == 1 {
			return errors.New("payment service unavailable")
		}
		return nil
	}, &retry.Options{EntityPath: "orders", Clock: mock, Logger: slog.New(slog.DiscardHandler), Hooks: inst.Hooks(retry.Hooks{})})
	if err != nil {
		panic(err)
	}

	id := "order-1"
	broker.Send(&azservicebus.Message{MessageID: &id, Body: []byte(`{"amount":42}`)})
	for range 2 {
		msgs, err := receiver.ReceiveMessages(context.Background(), 1, nil)
		if err != nil {
			panic(err)
		}
		proc.Process(context.Background(), receiver, msgs[0])
		broker.AdvanceToNextScheduled(mock)
	}

	var processes []sdktrace.ReadOnlySpan
	for _, s := range recorder.Ended() {
		fmt.Printf("%s (%s)\n", s.Name(), s.SpanKind())
		if s.Name() == "process orders" {
			processes = append(processes, s)
		}
	}
	link := processes[1].Links()[0]
	fmt.Println("attempt 2 links to attempt 1:", link.SpanContext.SpanID() == processes[0].SpanContext().SpanID())
	// Output:
	// schedule orders (client)
	// complete orders (client)
	// process orders (consumer)
	// complete orders (client)
	// process orders (consumer)
	// attempt 2 links to attempt 1: true
}

// Instrumenting the operator tools: the inspector's peeks and cancels, the redrive and purge of its
// selections, and the dead-letter monitor's reads. This example needs an Azure namespace, so it is
// only compiled.
func ExampleInstrumentation_StartCall() {
	cs := os.Getenv("SERVICEBUS_CONNECTION_STRING")
	host, port, err := retryotel.ServerFromConnectionString(cs)
	if err != nil {
		panic(err)
	}
	inst, err := retryotel.New(&retryotel.Options{ServerAddress: host, ServerPort: port})
	if err != nil {
		panic(err)
	}
	client, err := azservicebus.NewClientFromConnectionString(cs, nil)
	if err != nil {
		panic(err)
	}
	// The Instrumentation is the inspector's Observer: every broker call becomes a span.
	in, err := inspect.New(client, "orders", &inspect.Options{Observer: inst})
	if err != nil {
		panic(err)
	}
	st, err := in.Status(context.Background(), "order-42") // "peek orders" spans
	if err != nil {
		panic(err)
	}
	fmt.Println(len(st.Pending), "pending")

	ac, err := admin.NewClientFromConnectionString(cs, nil)
	if err != nil {
		panic(err)
	}
	// Each poll's reads become "get_runtime_properties" spans and set sbretry.dead_letter.depth.
	mon, err := dlqmonitor.New(inst.AdminClient(ac), []string{"orders"}, nil)
	if err != nil {
		panic(err)
	}
	_ = mon.Run(context.Background())
}
