package retry_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/outage"
	"github.com/sbretry/retry/retrytest"
)

// The default schedule: Fibonacci multiples of 10 s, capped at 7 days.
func ExampleFibonacci() {
	var b backoff.Fibonacci
	var delays []string
	for attempt := 1; attempt <= 10; attempt++ {
		delays = append(delays, b.Delay(attempt).String())
	}
	fmt.Println(strings.Join(delays, " "))
	fmt.Println(b.Delay(29))
	// Output:
	// 10s 10s 20s 30s 50s 1m20s 2m10s 3m30s 5m40s 9m10s
	// 168h0m0s
}

// Exponential doubling from one second, capped at one minute.
func ExampleExponential() {
	b := backoff.Exponential{Base: time.Second, Cap: time.Minute}
	var delays []string
	for attempt := 1; attempt <= 8; attempt++ {
		delays = append(delays, b.Delay(attempt).String())
	}
	fmt.Println(strings.Join(delays, " "))
	// Output:
	// 1s 2s 4s 8s 16s 32s 1m0s 1m0s
}

// Jitter with an injected random source is deterministic, which keeps tests stable.
func ExampleJitter() {
	b := backoff.Jitter{Backoff: backoff.Fibonacci{}, Fraction: 0.5, Rand: func() float64 { return 0.25 }}
	fmt.Println(b.Delay(5)) // 50 s × (1 - 0.5 + 2×0.5×0.25)
	fmt.Println(b.Delay(1)) // 10 s × 0.75, raised back to the Fibonacci floor
	// Output:
	// 37.5s
	// 10s
}

// The MessageID of each retry copy is derived from the chain (the entity and the sequence number of
// the first delivery) and the attempt: unique per chain, and the same for every redelivery of one
// attempt, so a republish after a crash is recognised by the broker's duplicate detection.
func ExampleEnvelope_RetryMessageID() {
	env := envelope.Envelope{Source: "orders", FirstSequenceNumber: 1234, OriginalMessageID: "order-42"}
	fmt.Println(env.RetryMessageID(2))
	fmt.Println(env.RetryMessageID(3))
	// Output:
	// sbretry-10bcdea60168c7d6df67af1c6fb0dfd9b1f9d78d-2
	// sbretry-10bcdea60168c7d6df67af1c6fb0dfd9b1f9d78d-3
}

// Permanent dead-letters at once; RetryAfter picks the delay (bounded by the backoff's cap).
func ExampleRetryAfter() {
	handler := func(ctx context.Context, msg *azservicebus.ReceivedMessage) error {
		if len(msg.Body) == 0 {
			return retry.Permanent(errors.New("empty order"))
		}
		// e.g. a downstream answered 429 with Retry-After: 120
		return retry.RetryAfter(2*time.Minute, errors.New("throttled"))
	}
	mock := clock.NewMock()
	broker, _ := retrytest.New(mock, nil)
	proc, _ := retry.NewProcessor(broker.Sender(), handler, &retry.Options{Clock: mock, Logger: slog.New(slog.DiscardHandler)})
	recv := broker.Receiver()
	for _, body := range []string{"", `{"sku":"x"}`} {
		broker.Send(&azservicebus.Message{Body: []byte(body)})
		msgs, _ := recv.ReceiveMessages(context.Background(), 1, nil)
		res := proc.Process(context.Background(), recv, msgs[0])
		fmt.Println(res.Outcome, res.Delay, res.DeadLetterReason)
	}
	// Output:
	// dead-lettered 0s RetryPermanentFailure
	// retry-scheduled 2m0s
}

// A handler reads the retry state from its context, e.g. to log it or to give up early on old messages.
func Example_envelopeFromContext() {
	mock := clock.NewMock()
	broker, _ := retrytest.New(mock, nil)
	handler := func(ctx context.Context, msg *azservicebus.ReceivedMessage) error {
		env, _ := envelope.FromContext(ctx)
		fmt.Printf("attempt %d of %s (retry: %t), last error %q\n", env.Attempt, env.OriginalMessageID, env.IsRetry(), env.LastError)
		if env.Attempt == 1 {
			return errors.New("inventory service timed out")
		}
		return nil
	}
	proc, _ := retry.NewProcessor(broker.Sender(), handler, &retry.Options{Clock: mock, Logger: slog.New(slog.DiscardHandler)})
	recv := broker.Receiver()
	id := "order-7"
	broker.Send(&azservicebus.Message{MessageID: &id, Body: []byte("{}")})
	for range 2 {
		msgs, _ := recv.ReceiveMessages(context.Background(), 1, nil)
		res := proc.Process(context.Background(), recv, msgs[0])
		mock.Add(res.Delay)
	}
	// Output:
	// attempt 1 of order-7 (retry: false), last error ""
	// attempt 2 of order-7 (retry: true), last error "inventory service timed out"
}

// Middleware wraps every handler call: here one layer logs, another turns validation errors into
// permanent failures, so they are dead-lettered at once instead of retried.
func ExampleChain() {
	var errInvalid = errors.New("invalid order")
	logging := func(next retry.Handler) retry.Handler {
		return func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
			err := next(ctx, m)
			fmt.Printf("handled %s: %v\n", m.MessageID, err)
			return err
		}
	}
	classify := func(next retry.Handler) retry.Handler {
		return func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
			err := next(ctx, m)
			if errors.Is(err, errInvalid) {
				return retry.Permanent(err)
			}
			return err
		}
	}
	handler := retry.Chain(func(context.Context, *azservicebus.ReceivedMessage) error { return errInvalid }, logging, classify)
	err := handler(context.Background(), &azservicebus.ReceivedMessage{MessageID: "order-7"})
	fmt.Println("permanent:", retry.IsPermanent(err))
	// Output:
	// handled order-7: invalid order
	// permanent: true
}

// Policies by error: the first matching rule decides what a failure becomes. Processed here on a
// retrytest broker and a mock clock, so the output is deterministic.
func ExampleRule() {
	errInvalid := errors.New("invalid order")
	errGone := errors.New("customer deleted")
	errThrottled := errors.New("429 from billing")
	policies := []retry.Rule{
		{Name: "invalid", Match: retry.ErrorIs(errInvalid), Policy: retry.Policy{Action: retry.ActionDeadLetter, Reason: "InvalidOrder"}},
		{Name: "gone", Match: retry.ErrorIs(errGone), Policy: retry.Policy{Action: retry.ActionDiscard}},
		{Name: "throttled", Match: retry.ErrorIs(errThrottled), Policy: retry.Policy{Backoff: backoff.Constant{Interval: time.Minute}}},
	}
	clk := clock.NewMock()
	for _, err := range []error{errInvalid, errGone, errThrottled, errors.New("timeout")} {
		b, _ := retrytest.New(clk, nil)
		p, _ := retry.NewProcessor(b.Sender(), func(context.Context, *azservicebus.ReceivedMessage) error { return err },
			&retry.Options{EntityPath: "orders", Policies: policies, Clock: clk, Logger: slog.New(slog.DiscardHandler)})
		b.Send(&azservicebus.Message{MessageID: strPtr("order-42")})
		r := b.Receiver()
		msgs, _ := r.ReceiveMessages(context.Background(), 1, nil)
		res := p.Process(context.Background(), r, msgs[0])
		fmt.Printf("%-16s %-16s policy=%q reason=%q delay=%s\n", err, res.Outcome, res.Policy, res.DeadLetterReason, res.Delay)
	}
	// Output:
	// invalid order    dead-lettered    policy="invalid" reason="InvalidOrder" delay=0s
	// customer deleted discarded        policy="gone" reason="" delay=0s
	// 429 from billing retry-scheduled  policy="throttled" reason="" delay=1m0s
	// timeout          retry-scheduled  policy="" reason="" delay=10s
}

// Outage mode with a health check as the probe, and the kill switch mounted next to the health probes
// (compile-only: it needs a namespace).
func Example_outage() {
	connect, err := retry.NewNamespace("Endpoint=sb://example.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=x", nil).Queue("orders")
	if err != nil {
		return
	}
	billingUp := func(ctx context.Context) error { return nil } // e.g. GET https://billing/healthz
	consumer, err := retry.NewConsumer(connect, okHandler, &retry.Options{
		MaxConcurrency: 16,
		Outage:         &outage.Options{HealthCheck: billingUp},
		Hooks: retry.Hooks{OnOutage: func(p outage.Change) {
			slog.Warn("outage breaker", "from", p.From, "to", p.To, "reason", p.Reason, "next_probe", p.NextProbe)
		}},
	})
	if err != nil {
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/readyz", retry.ReadinessHandler(consumer))
	mux.Handle("/control", retry.ControlHandler(consumer, &retry.ControlOptions{Token: os.Getenv("CONTROL_TOKEN")}))
	_ = mux
}

// The first calls: a connector for a queue from a connection string, a consumer with a handler, and
// Run until the context ends (Ctrl-C here). Compile-only: it needs a namespace (or the emulator,
// cmd/sbemu).
func ExampleNewConsumer() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	connect, err := retry.NewNamespace(os.Getenv("SERVICEBUS_CONNECTION_STRING"), nil).Queue("orders")
	if err != nil {
		log.Fatal(err) // a malformed connection string; the error never contains the key
	}
	consumer, err := retry.NewConsumer(connect, func(ctx context.Context, msg *azservicebus.ReceivedMessage) error {
		env, _ := envelope.FromContext(ctx)
		log.Printf("order %s, attempt %d", env.OriginalMessageID, env.Attempt)
		return nil // an error retries later, with backoff
	}, &retry.Options{MaxConcurrency: 8, MaxAttempts: 10})
	if err != nil {
		log.Fatal(err)
	}
	if err := consumer.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
