package retry_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/retrytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	errBoom   = errors.New("downstream unavailable")
	okHandler = func(context.Context, *azservicebus.ReceivedMessage) error { return nil }
)

type nopSender struct{}

func (nopSender) ScheduleMessages(context.Context, []*azservicebus.Message, time.Time, *azservicebus.ScheduleMessagesOptions) ([]int64, error) {
	return nil, nil
}
func (nopSender) Close(context.Context) error { return nil }

// fixture is a processor over a retrytest broker on a mock clock.
type fixture struct {
	t      *testing.T
	clock  *clock.Mock
	broker *retrytest.Broker
	recv   retry.Receiver
	proc   *retry.Processor
	logs   *bytes.Buffer
}

func newFixture(t *testing.T, handler retry.Handler, opts *retry.Options) *fixture {
	t.Helper()
	f := &fixture{t: t, clock: clock.NewMock(), logs: &bytes.Buffer{}}
	f.clock.Set(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	f.broker = newBroker(t, f.clock, &retrytest.BrokerOptions{DuplicateDetection: true})
	f.recv = f.broker.Receiver()
	if opts == nil {
		opts = &retry.Options{}
	}
	opts.Clock = f.clock
	if opts.EntityPath == "" {
		opts.EntityPath = "orders"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewJSONHandler(&lockedWriter{w: f.logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	proc, err := retry.NewProcessor(f.broker.Sender(), handler, opts)
	require.NoError(t, err)
	f.proc = proc
	return f
}

// receiveOne takes the next message, which must be available now (the timeout only guards a broken test).
func (f *fixture) receiveOne() *azservicebus.ReceivedMessage {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msgs, err := f.recv.ReceiveMessages(ctx, 1, nil)
	require.NoError(f.t, err)
	require.Len(f.t, msgs, 1)
	return msgs[0]
}

func (f *fixture) process() retry.Result {
	f.t.Helper()
	return f.proc.Process(context.Background(), f.recv, f.receiveOne())
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func strPtr(s string) *string { return &s }

// chainOf is the envelope identity of sampleMessage's chain in the fixture: entity "orders", first
// delivery with sequence number seq.
func chainOf(seq int64) envelope.Envelope {
	return envelope.Envelope{Source: "orders", FirstSequenceNumber: seq, OriginalMessageID: "order-42"}
}

func sampleMessage() *azservicebus.Message {
	ttl := time.Hour
	return &azservicebus.Message{
		MessageID:             strPtr("order-42"),
		Body:                  []byte{0x00, 0xff, 'h', 'i', 0x00},
		ContentType:           strPtr("application/octet-stream"),
		CorrelationID:         strPtr("corr-7"),
		Subject:               strPtr("orders"),
		To:                    strPtr("billing"),
		ReplyTo:               strPtr("replies"),
		SessionID:             strPtr("session-1"),
		PartitionKey:          strPtr("session-1"),
		TimeToLive:            &ttl,
		ApplicationProperties: map[string]any{"tenant": "acme", "n": int64(3), "raw": []byte{1, 2, 3}},
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// runConsumer starts c.Run in the bubble and returns a stop function that cancels it and waits.
func runConsumer(t *testing.T, c *retry.Consumer) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return func() error {
		cancel()
		return <-done
	}
}

// newBroker is retrytest.New for a test's fixed options: an error fails the test.
func newBroker(t testing.TB, clk retry.Clock, opts *retrytest.BrokerOptions) *retrytest.Broker {
	t.Helper()
	b, err := retrytest.New(clk, opts)
	require.NoError(t, err)
	return b
}

func sendN(b *retrytest.Broker, n int) {
	for i := range n {
		b.Send(&azservicebus.Message{MessageID: strPtr(fmt.Sprintf("m-%d", i)), Body: []byte("x")})
	}
}

// bubbleProcessor builds a processor over a broker on the real clock, for use inside synctest.
func bubbleProcessor(t *testing.T, handler retry.Handler, opts *retry.Options) (*retrytest.Broker, retry.Receiver, *retry.Processor) {
	t.Helper()
	b := newBroker(t, nil, nil)
	if opts == nil {
		opts = &retry.Options{}
	}
	if opts.Logger == nil {
		opts.Logger = discardLogger()
	}
	p, err := retry.NewProcessor(b.Sender(), handler, opts)
	require.NoError(t, err)
	return b, b.Receiver(), p
}

func receiveNow(t *testing.T, r retry.Receiver) *azservicebus.ReceivedMessage {
	t.Helper()
	msgs, err := r.ReceiveMessages(t.Context(), 1, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	return msgs[0]
}

// nopSettler accepts every settle call.
type nopSettler struct{}

func (nopSettler) CompleteMessage(context.Context, *azservicebus.ReceivedMessage, *azservicebus.CompleteMessageOptions) error {
	return nil
}

func (nopSettler) DeadLetterMessage(context.Context, *azservicebus.ReceivedMessage, *azservicebus.DeadLetterOptions) error {
	return nil
}

func (nopSettler) RenewMessageLock(context.Context, *azservicebus.ReceivedMessage, *azservicebus.RenewMessageLockOptions) error {
	return nil
}

type recordingSettler struct{ completed, deadLettered, renewed int }

func (r *recordingSettler) CompleteMessage(context.Context, *azservicebus.ReceivedMessage, *azservicebus.CompleteMessageOptions) error {
	r.completed++
	return nil
}

func (r *recordingSettler) DeadLetterMessage(context.Context, *azservicebus.ReceivedMessage, *azservicebus.DeadLetterOptions) error {
	r.deadLettered++
	return nil
}

func (r *recordingSettler) RenewMessageLock(context.Context, *azservicebus.ReceivedMessage, *azservicebus.RenewMessageLockOptions) error {
	r.renewed++
	return nil
}

type discardSender struct{}

func (discardSender) ScheduleMessages(context.Context, []*azservicebus.Message, time.Time, *azservicebus.ScheduleMessagesOptions) ([]int64, error) {
	return []int64{1}, nil
}
func (discardSender) Close(context.Context) error { return nil }

// wrapAccepted returns base with every session receiver it accepts passed through wrap, which gets
// the receiver and how many the connector has accepted so far, this one included (1 for the first).
func wrapAccepted(base retry.SessionConnector, wrap func(r retry.SessionReceiver, n int) retry.SessionReceiver) retry.SessionConnector {
	var accepts atomic.Int32
	return func(ctx context.Context) (*retry.SessionConnection, error) {
		c, err := base(ctx)
		if err != nil {
			return nil, err
		}
		accept := c.AcceptNext
		c.AcceptNext = func(ctx context.Context) (retry.SessionReceiver, error) {
			r, err := accept(ctx)
			if err != nil {
				return nil, err
			}
			return wrap(r, int(accepts.Add(1))), nil
		}
		return c, nil
	}
}
