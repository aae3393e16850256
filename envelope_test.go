package retry_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
)

func TestDecodeEnvelopeRejectsHostileProperties(t *testing.T) {
	cases := []struct {
		name  string
		props map[string]any
	}{
		{"attempt as string", map[string]any{envelope.PropAttempt: "3"}},
		{"attempt as float", map[string]any{envelope.PropAttempt: 2.5}},
		{"attempt zero", map[string]any{envelope.PropAttempt: int64(0)}},
		{"attempt negative", map[string]any{envelope.PropAttempt: int64(-5)}},
		{"attempt beyond int32", map[string]any{envelope.PropAttempt: int64(math.MaxInt32) + 1}},
		{"attempt huge uint64", map[string]any{envelope.PropAttempt: uint64(math.MaxUint64)}},
		{"attempt min int64", map[string]any{envelope.PropAttempt: int64(math.MinInt64)}},
		{"attempt nil", map[string]any{envelope.PropAttempt: nil}},
		{"correlation id wrong type", map[string]any{envelope.PropCorrelationID: int64(7)}},
		{"correlation id oversized", map[string]any{envelope.PropCorrelationID: strings.Repeat("c", 5000)}},
		{"key oversized", map[string]any{envelope.PropKey: strings.Repeat("k", 1025)}},
		{"original id as bytes", map[string]any{envelope.PropOriginalMessageID: []byte("x")}},
		{"first enqueued as string", map[string]any{envelope.PropFirstEnqueuedTime: "2026-01-01"}},
		{"last error oversized", map[string]any{envelope.PropLastError: strings.Repeat("e", 40*1024)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := envelope.Decode(&azservicebus.ReceivedMessage{ApplicationProperties: tc.props})
			require.ErrorIs(t, err, retry.ErrInvalidEnvelope)
			var envErr *envelope.Error
			require.ErrorAs(t, err, &envErr)
			assert.NotEmpty(t, envErr.Property)

			// The processor dead-letters such a message with a reason and never calls the handler. The
			// properties are set on the received message: Service Bus refuses some of them from a
			// producer (over 32 KiB), so only a tampered delivery could carry them.
			called := false
			f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { called = true; return nil }, nil)
			_, err = f.broker.Send(&azservicebus.Message{MessageID: strPtr("bad"), Body: []byte("x")})
			require.NoError(t, err)
			msg := f.receiveOne()
			msg.ApplicationProperties = tc.props
			res := f.proc.Process(context.Background(), f.recv, msg)
			assert.False(t, called)
			assert.Equal(t, retry.OutcomeDeadLettered, res.Outcome)
			dl := f.broker.DeadLettered()
			require.Len(t, dl, 1)
			assert.Equal(t, "RetryInvalidProperties", dl[0].Reason)
			assert.Contains(t, dl[0].Description, envErr.Property)
		})
	}
}

func TestHugeValidAttemptDeadLettersInsteadOfLooping(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
	f.broker.Send(&azservicebus.Message{MessageID: strPtr("m"), Body: []byte("x"),
		ApplicationProperties: map[string]any{envelope.PropAttempt: int64(math.MaxInt32)}})
	res := f.process()
	assert.Equal(t, retry.OutcomeDeadLettered, res.Outcome)
	assert.Equal(t, "RetryMaxAttemptsExceeded", res.DeadLetterReason)
}

func TestLongIdempotencyKeyStaysDecodable(t *testing.T) {
	key := strings.Repeat("k", 5000)
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom },
		&retry.Options{IdempotencyKey: func(*azservicebus.ReceivedMessage) string { return key }})
	f.broker.Send(sampleMessage())
	require.Equal(t, retry.OutcomeRetryScheduled, f.process().Outcome)
	f.clock.Add(10 * time.Second)
	res := f.process()
	assert.Equal(t, retry.OutcomeRetryScheduled, res.Outcome, "the copy's envelope must decode")
	for _, s := range f.broker.Scheduled() {
		assert.LessOrEqual(t, len(s.MessageID), envelope.MaxMessageIDLength)
	}
}

// FuzzEnvelope feeds arbitrary retry properties through the decoder and the processor: never a panic,
// and every delivery ends either retried with attempt+1 within MaxAttempts, or dead-lettered.
func FuzzEnvelope(f *testing.F) {
	f.Add(uint8(0), int64(1), "corr", "orig", int64(0))
	f.Add(uint8(1), int64(-1), "", strings.Repeat("x", 2000), int64(-1))
	f.Add(uint8(2), int64(math.MaxInt64), "c", "o", int64(math.MaxInt64))
	f.Add(uint8(3), int64(4), "\xff\xfe", "o", int64(1))
	f.Add(uint8(4), int64(28), "c", "o", int64(1))
	f.Fuzz(func(t *testing.T, kind uint8, attempt int64, corr, orig string, ts int64) {
		props := map[string]any{}
		switch kind % 6 {
		case 0:
			props[envelope.PropAttempt] = attempt
		case 1:
			props[envelope.PropAttempt] = int32(attempt)
		case 2:
			props[envelope.PropAttempt] = uint64(attempt)
		case 3:
			props[envelope.PropAttempt] = corr
		case 4:
			props[envelope.PropAttempt] = float64(attempt)
		}
		props[envelope.PropCorrelationID] = corr
		props[envelope.PropOriginalMessageID] = orig
		props[envelope.PropKey] = orig
		props[envelope.PropFirstEnqueuedTime] = time.UnixMilli(ts % (1 << 50)).UTC()
		msg := &azservicebus.ReceivedMessage{MessageID: "m", ApplicationProperties: props, Body: []byte("b")}
		env, err := envelope.Decode(msg)
		if err == nil {
			require.GreaterOrEqual(t, env.Attempt, 1)
			require.LessOrEqual(t, env.Attempt, math.MaxInt32)
		}

		const maxAttempts = 29
		rec := &recordingSettler{}
		sender := &recordingSender{}
		p, perr := retry.NewProcessor(sender, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom },
			&retry.Options{Logger: discardLogger(), DisableLockRenewal: true, RetryBudget: 0})
		require.NoError(t, perr)
		res := p.Process(context.Background(), rec, msg)
		switch res.Outcome {
		case retry.OutcomeRetryScheduled:
			require.NoError(t, err)
			require.Len(t, sender.msgs, 1)
			next := sender.msgs[0].ApplicationProperties[envelope.PropAttempt].(int64)
			require.Equal(t, int64(env.Attempt+1), next)
			require.LessOrEqual(t, next, int64(maxAttempts))
			require.LessOrEqual(t, len(*sender.msgs[0].MessageID), envelope.MaxMessageIDLength)
			require.Equal(t, 1, rec.completed)
		case retry.OutcomeDeadLettered:
			require.Equal(t, 1, rec.deadLettered)
			require.Empty(t, sender.msgs)
		default:
			t.Fatalf("unexpected outcome %v", res.Outcome)
		}
	})
}

type recordingSender struct{ msgs []*azservicebus.Message }

func (s *recordingSender) ScheduleMessages(_ context.Context, msgs []*azservicebus.Message, _ time.Time, _ *azservicebus.ScheduleMessagesOptions) ([]int64, error) {
	s.msgs = append(s.msgs, msgs...)
	return []int64{1}, nil
}

func (s *recordingSender) Close(context.Context) error { return nil }

func TestDescriptionLimitBounds(t *testing.T) {
	for _, limit := range []int{1, 2, 3, 4, 10} {
		f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error {
			return retry.Permanent(errors.New("ééééééééééééé"))
		}, &retry.Options{DescriptionLimit: limit})
		f.broker.Send(sampleMessage())
		f.process()
		d := f.broker.DeadLettered()[0].Description
		assert.LessOrEqual(t, len(d), limit, "limit %d: %q", limit, d)
		assert.True(t, utf8.ValidString(d))
	}
	_, err := retry.NewProcessor(nopSender{}, okHandler, &retry.Options{DescriptionLimit: 16*1024 + 1})
	assert.ErrorIs(t, err, retry.ErrInvalidOptions)
	_, err = retry.NewProcessor(nopSender{}, okHandler, &retry.Options{DescriptionLimit: 16 * 1024})
	assert.NoError(t, err)
}
