package retry_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/retrytest"
)

// The Go code blocks of README.md, each compiled here as the body of a function between a
// "README begin" and a "README end" comment. TestREADMECodeBlocksCompile checks that README.md shows
// exactly these bodies, so a snippet that stops compiling fails the build, and one edited in the
// README alone fails the test. Never called: they would need Azure.

var (
	errInvalid         = errors.New("invalid order")
	errCustomerDeleted = errors.New("customer deleted")
)

type readmeThrottle struct{}

func (*readmeThrottle) Error() string { return "throttled" }

func charge(context.Context, []byte) error { return nil }

func readmeQuickstart(ctx context.Context) error {
	// README begin
	connect, err := retry.NewNamespace(os.Getenv("SERVICEBUS_CONNECTION_STRING"), nil).Queue("orders")
	if err != nil {
		return err // a malformed connection string; the error never contains the key
	}
	consumer, err := retry.NewConsumer(
		connect,
		func(ctx context.Context, msg *azservicebus.ReceivedMessage) error {
			return charge(ctx, msg.Body) // nil completes; an error retries later
		},
		&retry.Options{MaxConcurrency: 8},
	)
	if err != nil {
		return err
	}
	return consumer.Run(ctx) // blocks until ctx ends and in-flight handlers have drained
	// README end
}

func readmeSubscription(ctx context.Context, connStr string, handler retry.Handler) error {
	// README begin
	connect, err := retry.NewNamespace(connStr, nil).Subscription("orders", "billing", "orders-billing-retry")
	if err != nil {
		return err
	}
	consumer, err := retry.NewConsumer(connect, handler, nil)
	if err != nil {
		return err
	}
	return consumer.Run(ctx)
	// README end
}

func readmePolicies(connect retry.Connector, handler retry.Handler) (*retry.Consumer, error) {
	ErrInvalid, ErrCustomerDeleted := errInvalid, errCustomerDeleted
	type ThrottleError = readmeThrottle
	// README begin
	opts := &retry.Options{
		ImmediateRetries: 2, // two quick in-process retries before each delayed one (default 0)
		Policies: []retry.Rule{
			{Name: "validation", Match: retry.ErrorIs(ErrInvalid), Policy: retry.Policy{Action: retry.ActionDeadLetter, Reason: "InvalidOrder"}},
			{Name: "gone", Match: retry.ErrorIs(ErrCustomerDeleted), Policy: retry.Policy{Action: retry.ActionDiscard}},
			{Name: "throttled", Match: retry.ErrorAs[*ThrottleError](), Policy: retry.Policy{Backoff: backoff.Constant{Interval: time.Minute}, MaxAttempts: 10, NotOutage: true}},
		},
	}
	return retry.NewConsumer(connect, handler, opts)
	// README end
}

func readmeTestingYourHandler(ctx context.Context, t *testing.T, myHandler retry.Handler) {
	// README begin
	mock := clock.NewMock()
	broker, err := retrytest.New(mock, nil)
	require.NoError(t, err)
	proc, err := retry.NewProcessor(broker.Sender(), myHandler, &retry.Options{Clock: mock, MaxAttempts: 4})
	require.NoError(t, err)
	_, err = broker.Send(&azservicebus.Message{Body: []byte(`{"amount":42}`)})
	require.NoError(t, err)

	recv := broker.Receiver()
	msgs, _ := recv.ReceiveMessages(ctx, 1, nil)
	res := proc.Process(ctx, recv, msgs[0]) // res.Outcome, res.Delay, res.RetryMessageID
	mock.Add(res.Delay)                     // the copy becomes receivable; no real waiting
	_ = broker.Scheduled()                  // when, which attempt, which MessageID
	_ = broker.DeadLettered()               // message, reason, description
	_ = broker.Stats().Succeeded            // handler successes (Retried counts originals of failed attempts)
	broker.AdvanceToNextScheduled(mock)     // jump the mock clock to the next scheduled copy
	// README end
}

// The README's snippet of a handler test runs, as it promises, on a mock clock and an in-memory broker.
func TestREADMETestingSnippetRuns(t *testing.T) {
	calls := 0
	readmeTestingYourHandler(t.Context(), t, func(context.Context, *azservicebus.ReceivedMessage) error {
		calls++
		return errBoom
	})
	assert.Equal(t, 1, calls)
}

func TestREADMECodeBlocksCompile(t *testing.T) {
	compiled := regions(t, "readme_test.go", "\t// README begin", "\t// README end", "\t")
	shown := regions(t, "README.md", "```go", "```", "")
	assert.Equal(t, compiled, shown, "README.md's Go blocks, in order, are the bodies compiled in readme_test.go")
}

// regions returns the texts between the lines begin and end of file, each line with prefix cut.
func regions(t *testing.T, file, begin, end, prefix string) []string {
	t.Helper()
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()
	var out []string
	var cur *strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case cur == nil && line == begin:
			cur = &strings.Builder{}
		case cur != nil && line == end:
			out = append(out, cur.String())
			cur = nil
		case cur != nil:
			cur.WriteString(strings.TrimPrefix(line, prefix) + "\n")
		}
	}
	require.NoError(t, sc.Err())
	require.Nil(t, cur, "%s: a region is not closed", file)
	return out
}
