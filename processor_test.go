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
	"github.com/sbretry/retry/retrytest"
)

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

func TestLockRenewalKeepsLongHandlerAlive(t *testing.T) {
	cases := []struct {
		name    string
		disable bool
		want    retry.Outcome
	}{
		{"renewed", false, retry.OutcomeCompleted},
		{"not renewed", true, retry.OutcomeLeftForRedelivery},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// The handler works for 5 minutes under a 1 minute lock.
				b, r, p := bubbleProcessor(t, func(context.Context, *azservicebus.ReceivedMessage) error {
					<-time.After(5 * time.Minute)
					return nil
				}, &retry.Options{DisableLockRenewal: tc.disable})
				b.Send(sampleMessage())
				res := p.Process(t.Context(), r, receiveNow(t, r))
				assert.Equal(t, tc.want, res.Outcome)
				if !tc.disable {
					assert.Len(t, b.Completed(), 1)
				}
			})
		})
	}
}

func TestLockRenewalInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var renewals []time.Duration
		start := time.Now()
		b := newBroker(t, nil, nil)
		counting := &countingSettler{Receiver: b.Receiver(), onRenew: func() { renewals = append(renewals, time.Since(start)) }}
		p, err := retry.NewProcessor(b.Sender(), func(context.Context, *azservicebus.ReceivedMessage) error {
			<-time.After(100 * time.Second)
			return nil
		}, &retry.Options{Logger: discardLogger()})
		require.NoError(t, err)
		b.Send(sampleMessage())
		p.Process(t.Context(), counting, receiveNow(t, counting))
		// Half of the remaining 60 s lock each time: 30 s, then 30 s after each renewal.
		assert.Equal(t, []time.Duration{30 * time.Second, 60 * time.Second, 90 * time.Second}, renewals)
	})
}

type countingSettler struct {
	retry.Receiver
	onRenew func()
}

func (c *countingSettler) RenewMessageLock(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.RenewMessageLockOptions) error {
	c.onRenew()
	return c.Receiver.RenewMessageLock(ctx, m, o)
}

func TestLockLostCancelsHandlerAndRepublishesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var cause error
		var b *retrytest.Broker
		b, r, p := bubbleProcessor(t, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
			<-time.After(10 * time.Second)
			b.ExpireLocks() // the broker loses the lock while the handler runs
			<-ctx.Done()
			cause = context.Cause(ctx)
			return errBoom
		}, nil)
		b.Send(sampleMessage())
		res := p.Process(t.Context(), r, receiveNow(t, r))
		assert.ErrorIs(t, cause, retry.ErrLockLost)
		assert.Equal(t, retry.OutcomeLeftForRedelivery, res.Outcome)
		assert.ErrorIs(t, res.SettleErr, retry.ErrLockLost)
		assert.Empty(t, b.Scheduled(), "nothing republished")
		assert.Empty(t, b.Completed())
		assert.Empty(t, b.DeadLettered())
		assert.Equal(t, 1, b.Stats().Active, "the broker has it for redelivery")
	})
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

func TestOversizedCopyDeadLetters(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
	// The original fits the queue's 256 KiB; its copy, with the retry properties, would not.
	_, err := f.broker.Send(&azservicebus.Message{MessageID: strPtr("big"), Body: bytes.Repeat([]byte("x"), retry.DefaultMaxMessageSize-256)})
	require.NoError(t, err)
	res := f.process()
	assert.Equal(t, retry.OutcomeDeadLettered, res.Outcome)
	assert.Equal(t, "RetryMessageTooLarge", res.DeadLetterReason)
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
	assert.Equal(t, "seq-1", copyMsg.ApplicationProperties[retry.PropKey], "no MessageID: the sequence number keys it")
	assert.Equal(t, retry.Envelope{Source: "orders", FirstSequenceNumber: 1}.RetryMessageID(2), *copyMsg.MessageID)

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

func TestHangingRenewalDoesNotDelaySettle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The handler takes 40 s; the renewal at 30 s hangs (a broker that stopped answering). When the
		// handler returns, the hanging renewal is abandoned at once and the message is completed.
		b := newBroker(t, nil, nil)
		recv := &hangingRenewal{Receiver: b.Receiver()}
		p, err := retry.NewProcessor(b.Sender(), func(context.Context, *azservicebus.ReceivedMessage) error {
			<-time.After(40 * time.Second)
			return nil
		}, &retry.Options{Logger: discardLogger(), SettleTimeout: time.Hour})
		require.NoError(t, err)
		b.Send(sampleMessage())
		start := time.Now()
		res := p.Process(t.Context(), recv, receiveNow(t, recv))
		assert.Equal(t, retry.OutcomeCompleted, res.Outcome)
		assert.Equal(t, 40*time.Second, time.Since(start))
	})
}

type hangingRenewal struct{ retry.Receiver }

func (hangingRenewal) RenewMessageLock(ctx context.Context, _ *azservicebus.ReceivedMessage, _ *azservicebus.RenewMessageLockOptions) error {
	<-ctx.Done()
	return ctx.Err()
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

func TestCopyOverHeaderLimitsDeadLetters(t *testing.T) {
	cases := []struct {
		name  string
		props map[string]any
	}{
		{"one property near 32 KiB", map[string]any{"big": strings.Repeat("x", 32*1024-10)}},
		// Just under 64 KiB, which Service Bus accepts; the copy's retry properties take it over.
		{"properties over 64 KiB together with the copy's", map[string]any{"a": strings.Repeat("x", 30*1024), "b": strings.Repeat("x", 30*1024), "c": strings.Repeat("x", 4000)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
			_, err := f.broker.Send(&azservicebus.Message{MessageID: strPtr("hdr"), Body: []byte("x"), ApplicationProperties: tc.props})
			require.NoError(t, err)
			res := f.process()
			assert.Equal(t, retry.OutcomeDeadLettered, res.Outcome)
			assert.Equal(t, "RetryMessageTooLarge", res.DeadLetterReason)
			assert.Empty(t, f.broker.Scheduled())
		})
	}
	// Just inside the limits, the copy is scheduled.
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("ok"), Body: []byte("x"), ApplicationProperties: map[string]any{"a": strings.Repeat("x", 30*1024), "b": strings.Repeat("x", 30*1024)}})
	assert.Equal(t, retry.OutcomeRetryScheduled, f.process().Outcome)
}

// TestFirstAttemptDeadLetterRecordsItsIdentity: a message dead-lettered at its first attempt has no
// envelope of its own, so the dead letter records its key, correlation id and original MessageID for
// the operator tools; near the header limit they are left out rather than making the dead-letter fail.
func TestFirstAttemptDeadLetterRecordsItsIdentity(t *testing.T) {
	permanent := func(context.Context, *azservicebus.ReceivedMessage) error { return retry.Permanent(errBoom) }
	f := newFixture(t, permanent, nil)
	_, err := f.broker.Send(&azservicebus.Message{MessageID: strPtr("order-7"), CorrelationID: strPtr("trace-7"), Body: []byte("x")})
	require.NoError(t, err)
	require.Equal(t, retry.OutcomeDeadLettered, f.process().Outcome)
	dead := f.broker.DeadLettered()
	require.Len(t, dead, 1)
	props := dead[0].Message.ApplicationProperties
	assert.Equal(t, "order-7", props[retry.PropKey])
	assert.Equal(t, "trace-7", props[retry.PropCorrelationID])
	assert.Equal(t, "order-7", props[retry.PropOriginalMessageID])
	env, err := retry.DecodeEnvelope(dead[0].Message)
	require.NoError(t, err)
	assert.Equal(t, "order-7", env.Key)

	g := newFixture(t, permanent, nil)
	big := map[string]any{"a": strings.Repeat("x", 32*1024-40), "b": strings.Repeat("x", 32*1024-40)}
	_, err = g.broker.Send(&azservicebus.Message{MessageID: strPtr("big-7"), Body: []byte("x"), ApplicationProperties: big})
	require.NoError(t, err)
	require.Equal(t, retry.OutcomeDeadLettered, g.process().Outcome)
	dead = g.broker.DeadLettered()
	require.Len(t, dead, 1)
	assert.NotContains(t, dead[0].Message.ApplicationProperties, retry.PropKey, "no room under the header limit")
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
