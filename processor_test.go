package retry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/retrytest"
)

func TestProcessSuccessCompletes(t *testing.T) {
	f := newFixture(t, okHandler, nil)
	f.broker.Send(sampleMessage())
	res := f.process()
	assert.Equal(t, retry.OutcomeCompleted, res.Outcome)
	assert.Len(t, f.broker.Completed(), 1)
	assert.Empty(t, f.broker.Scheduled())
	assert.Empty(t, f.broker.DeadLettered())
}

func TestProcessFailureSchedulesExactCopy(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
	f.broker.Send(sampleMessage())
	start := f.clock.Now()
	res := f.process()
	require.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)

	sched := f.broker.Scheduled()
	require.Len(t, sched, 1, "exactly one copy")
	s := sched[0]
	assert.Equal(t, start.Add(10*time.Second), s.At, "now + Fibonacci{}.Delay(1)")
	assert.Equal(t, chainOf(1).RetryMessageID(2), s.MessageID)
	assert.Equal(t, 2, s.Attempt)
	m := s.Message
	assert.Equal(t, []byte{0x00, 0xff, 'h', 'i', 0x00}, m.Body, "body byte-identical")
	assert.Equal(t, "application/octet-stream", *m.ContentType)
	assert.Equal(t, "corr-7", *m.CorrelationID)
	assert.Equal(t, "orders", *m.Subject)
	assert.Equal(t, "billing", *m.To)
	assert.Equal(t, "replies", *m.ReplyTo)
	assert.Equal(t, "session-1", *m.SessionID)
	assert.Equal(t, "session-1", *m.PartitionKey)
	assert.Equal(t, time.Hour-10*time.Second, *m.TimeToLive, "what is left of the producer's TimeToLive when the copy is due")
	assert.Equal(t, start.Add(time.Hour), m.ApplicationProperties[envelope.PropExpiresAt])
	assert.Equal(t, "orders", m.ApplicationProperties[envelope.PropSource])
	assert.Equal(t, int64(1), m.ApplicationProperties[envelope.PropFirstSequenceNumber])
	assert.Equal(t, "acme", m.ApplicationProperties["tenant"])
	assert.Equal(t, int64(3), m.ApplicationProperties["n"])
	assert.Equal(t, []byte{1, 2, 3}, m.ApplicationProperties["raw"])
	assert.Equal(t, int64(2), m.ApplicationProperties[envelope.PropAttempt])
	assert.Equal(t, "corr-7", m.ApplicationProperties[envelope.PropCorrelationID], "seeded from CorrelationID")
	assert.Equal(t, "order-42", m.ApplicationProperties[envelope.PropOriginalMessageID])
	assert.Equal(t, errBoom.Error(), m.ApplicationProperties[envelope.PropLastError])
	assert.Equal(t, start, m.ApplicationProperties[envelope.PropFirstEnqueuedTime])

	assert.Len(t, f.broker.Completed(), 1, "the original is completed")
	assert.Equal(t, 1, f.broker.Stats().Pending)
}

func TestRetryCopyIsDeepCopy(t *testing.T) {
	var got *azservicebus.ReceivedMessage
	f := newFixture(t, func(_ context.Context, m *azservicebus.ReceivedMessage) error {
		got = m
		return errBoom
	}, nil)
	f.broker.Send(sampleMessage())
	f.process()
	// Mutating the received message after the fact must not reach the scheduled copy.
	got.ApplicationProperties["raw"].([]byte)[0] = 99
	got.ApplicationProperties["tenant"] = "evil"
	got.Body[0] = 42
	f.clock.Add(10 * time.Second)
	next := f.receiveOne()
	assert.Equal(t, []byte{1, 2, 3}, next.ApplicationProperties["raw"])
	assert.Equal(t, "acme", next.ApplicationProperties["tenant"])
	assert.Equal(t, byte(0), next.Body[0])
}

func TestCorrelationIDSeededFromKeyWithoutCorrelationID(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("m-1"), Body: []byte("x")})
	f.process()
	s := f.broker.Scheduled()
	require.Len(t, s, 1)
	assert.Equal(t, "m-1", s[0].Message.ApplicationProperties[envelope.PropCorrelationID])
	assert.Nil(t, s[0].Message.CorrelationID)
}

func TestHandlerPanicIsAFailedAttempt(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { panic("nil map") }, nil)
	f.broker.Send(sampleMessage())
	res := f.process()
	assert.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
	assert.ErrorIs(t, res.HandlerErr, retry.ErrHandlerPanic)
}

func TestNoSettleWhenHandlerFailsAfterCancel(t *testing.T) {
	f := newFixture(t, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error { return ctx.Err() }, nil)
	f.broker.Send(sampleMessage())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res := f.proc.Process(ctx, f.recv, f.receiveOne())
	assert.Equal(t, retry.OutcomeLeftForRedelivery, res.Outcome)
	assert.Empty(t, f.broker.Scheduled())
	assert.Empty(t, f.broker.Completed())
	assert.Empty(t, f.broker.DeadLettered())
}

func TestSuccessAfterCancelStillCompletes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { cancel(); return nil }, nil)
	f.broker.Send(sampleMessage())
	res := f.proc.Process(ctx, f.recv, f.receiveOne())
	assert.Equal(t, retry.OutcomeCompleted, res.Outcome)
}

func TestUnsupportedBodyDeadLetters(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
	f.broker.Send(sampleMessage())
	msg := f.receiveOne()
	msg.Body = nil
	msg.RawAMQPMessage = &azservicebus.AMQPAnnotatedMessage{Body: azservicebus.AMQPAnnotatedMessageBody{Value: int64(5)}}
	res := f.proc.Process(context.Background(), f.recv, msg)
	assert.Equal(t, retry.OutcomeDeadLettered, res.Outcome)
	assert.Equal(t, "RetryUnsupportedBody", res.DeadLetterReason)
	assert.Empty(t, f.broker.Scheduled())
}

func TestNilBodyAndNilMessage(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
	f.broker.Send(&azservicebus.Message{})
	msg := f.receiveOne()
	// Service Bus gives every message a MessageID; one without can only come from another producer path.
	msg.MessageID = ""
	res := f.proc.Process(context.Background(), f.recv, msg)
	require.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
	assert.Nil(t, f.broker.Scheduled()[0].Message.Body)
	copyMsg := f.broker.Scheduled()[0].Message
	assert.Equal(t, "seq-1", copyMsg.ApplicationProperties[envelope.PropKey], "no MessageID: the sequence number keys it")
	assert.Equal(t, envelope.Envelope{Source: "orders", FirstSequenceNumber: 1}.RetryMessageID(2), *copyMsg.MessageID)

	res = f.proc.Process(context.Background(), f.recv, nil)
	assert.Equal(t, retry.OutcomeLeftForRedelivery, res.Outcome)
	assert.ErrorIs(t, res.SettleErr, retry.ErrNilMessage)
}

func TestLogLinesCarryIdentityAndNoBody(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&lockedWriter{w: &buf}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	calls := 0
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error {
		calls++
		switch calls {
		case 1:
			return errBoom
		default:
			return retry.Permanent(errors.New("bad payload"))
		}
	}, &retry.Options{Logger: logger})
	msg := sampleMessage()
	msg.Body = []byte("TOP-SECRET-BODY")
	f.broker.Send(msg)
	f.broker.Fail(retrytest.OpSchedule, 1, nil)
	f.process() // republish fails: ERROR
	f.clock.Add(time.Minute)
	calls = 0
	f.process() // retry scheduled: INFO
	f.clock.Add(10 * time.Second)
	f.process() // permanent: WARN dead-letter

	levels := map[string]string{}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.NotEmpty(t, lines)
	for _, line := range lines {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), line)
		assert.NotEmpty(t, rec["message_id"], line)
		assert.Equal(t, "corr-7", rec["correlation_id"], line)
		assert.NotNil(t, rec["attempt"], line)
		levels[rec["msg"].(string)] = rec["level"].(string)
	}
	assert.NotContains(t, buf.String(), "TOP-SECRET-BODY")
	assert.Equal(t, "ERROR", levels["republishing the retry failed; the original stays for redelivery"])
	assert.Equal(t, "INFO", levels["retry scheduled"])
	assert.Equal(t, "WARN", levels["message dead-lettered"])
}

func TestNewProcessorRejectsBadInput(t *testing.T) {
	_, err := retry.NewProcessor(nil, okHandler, nil)
	assert.ErrorIs(t, err, retry.ErrInvalidOptions)
	_, err = retry.NewProcessor(nopSender{}, nil, nil)
	assert.ErrorIs(t, err, retry.ErrInvalidOptions)
}

func TestMultipleDataSectionsDeadLetterInsteadOfLosingTheBody(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
	f.broker.Send(sampleMessage())
	msg := f.receiveOne()
	// What the SDK hands over for a body of two data sections: Body is nil, the data is only in the raw message.
	msg.Body = nil
	msg.RawAMQPMessage = &azservicebus.AMQPAnnotatedMessage{Body: azservicebus.AMQPAnnotatedMessageBody{Data: [][]byte{[]byte(`{"amount":`), []byte(`42}`)}}}
	res := f.proc.Process(context.Background(), f.recv, msg)
	assert.Equal(t, retry.OutcomeDeadLettered, res.Outcome)
	assert.Equal(t, "RetryUnsupportedBody", res.DeadLetterReason)
	assert.Empty(t, f.broker.Scheduled(), "no copy with an empty body")
}

// A deadline on the handler's context that expires is a failed attempt with its backoff, wherever the
// deadline comes from; only a cancellation of the caller's context leaves the message uncounted.
func TestHandlerDeadlineIsAFailedAttempt(t *testing.T) {
	waitForDeadline := func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
		<-ctx.Done()
		return ctx.Err()
	}
	ownTimeout := func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
		wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		<-wctx.Done()
		return fmt.Errorf("calling the downstream service: %w", wctx.Err())
	}
	cases := []struct {
		name    string
		handler retry.Handler
		onStart bool // Hooks.OnStart sets a 50 ms deadline
		callers bool // the caller's context has a 50 ms deadline
	}{
		{name: "set by OnStart", handler: waitForDeadline, onStart: true},
		{name: "the handler's own", handler: ownTimeout},
		{name: "the caller's", handler: waitForDeadline, callers: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var cancels []context.CancelFunc
				defer func() {
					for _, c := range cancels {
						c()
					}
				}()
				opts := &retry.Options{LockDuration: time.Minute}
				if tc.onStart {
					opts.Hooks.OnStart = func(p retry.StartParams) context.Context {
						ctx, cancel := context.WithTimeout(p.Context, 50*time.Millisecond)
						cancels = append(cancels, cancel)
						return ctx
					}
				}
				b, r, p := bubbleProcessor(t, tc.handler, opts)
				b.Send(sampleMessage())
				ctx := t.Context()
				if tc.callers {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
					cancels = append(cancels, cancel)
				}
				res := p.Process(ctx, r, receiveNow(t, r))
				assert.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
				assert.ErrorIs(t, res.HandlerErr, context.DeadlineExceeded)
				assert.Positive(t, res.Delay, "the retry gets its backoff")
				assert.Len(t, b.Scheduled(), 1)
			})
		})
	}
}
