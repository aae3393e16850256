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
)

func TestDecodeEnvelopeFirstDelivery(t *testing.T) {
	enq := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	env, err := retry.DecodeEnvelope(&azservicebus.ReceivedMessage{MessageID: "m-1", EnqueuedTime: &enq})
	require.NoError(t, err)
	assert.Equal(t, retry.Envelope{Attempt: 1, OriginalMessageID: "m-1", FirstEnqueuedTime: enq, FirstSequenceNumber: -1}, env)
	assert.False(t, env.IsRetry())
	_, err = retry.DecodeEnvelope(nil)
	assert.ErrorIs(t, err, retry.ErrNilMessage)
}

func TestDecodeEnvelopeAcceptsIntegerTypes(t *testing.T) {
	for _, v := range []any{int64(3), int32(3), int(3), int16(3), int8(3), uint8(3), uint16(3), uint32(3), uint64(3)} {
		env, err := retry.DecodeEnvelope(&azservicebus.ReceivedMessage{ApplicationProperties: map[string]any{retry.PropAttempt: v}})
		require.NoError(t, err, "%T", v)
		assert.Equal(t, 3, env.Attempt)
	}
}

func TestDecodeEnvelopeRejectsHostileProperties(t *testing.T) {
	cases := []struct {
		name  string
		props map[string]any
	}{
		{"attempt as string", map[string]any{retry.PropAttempt: "3"}},
		{"attempt as float", map[string]any{retry.PropAttempt: 2.5}},
		{"attempt zero", map[string]any{retry.PropAttempt: int64(0)}},
		{"attempt negative", map[string]any{retry.PropAttempt: int64(-5)}},
		{"attempt beyond int32", map[string]any{retry.PropAttempt: int64(math.MaxInt32) + 1}},
		{"attempt huge uint64", map[string]any{retry.PropAttempt: uint64(math.MaxUint64)}},
		{"attempt min int64", map[string]any{retry.PropAttempt: int64(math.MinInt64)}},
		{"attempt nil", map[string]any{retry.PropAttempt: nil}},
		{"correlation id wrong type", map[string]any{retry.PropCorrelationID: int64(7)}},
		{"correlation id oversized", map[string]any{retry.PropCorrelationID: strings.Repeat("c", 5000)}},
		{"key oversized", map[string]any{retry.PropKey: strings.Repeat("k", 1025)}},
		{"original id as bytes", map[string]any{retry.PropOriginalMessageID: []byte("x")}},
		{"first enqueued as string", map[string]any{retry.PropFirstEnqueuedTime: "2026-01-01"}},
		{"last error oversized", map[string]any{retry.PropLastError: strings.Repeat("e", 40*1024)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := retry.DecodeEnvelope(&azservicebus.ReceivedMessage{ApplicationProperties: tc.props})
			require.ErrorIs(t, err, retry.ErrInvalidEnvelope)
			var envErr *retry.EnvelopeError
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
		ApplicationProperties: map[string]any{retry.PropAttempt: int64(math.MaxInt32)}})
	res := f.process()
	assert.Equal(t, retry.OutcomeDeadLettered, res.Outcome)
	assert.Equal(t, "RetryMaxAttemptsExceeded", res.DeadLetterReason)
}

func TestRetryMessageIDScheme(t *testing.T) {
	base := retry.Envelope{Source: "orders", FirstSequenceNumber: 42, OriginalMessageID: "order-7"}
	id := base.RetryMessageID(2)
	assert.Regexp(t, `^sbretry-[0-9a-f]{40}-2$`, id)
	assert.Equal(t, id, base.RetryMessageID(2), "deterministic across redeliveries of one attempt")
	assert.NotEqual(t, id, base.RetryMessageID(3), "one id per attempt")
	assert.Equal(t, base.ChainID(), id[len("sbretry-"):len(id)-2])
	for name, other := range map[string]retry.Envelope{
		"another sequence number":     {Source: "orders", FirstSequenceNumber: 43, OriginalMessageID: "order-7"},
		"another entity":              {Source: "orders2", FirstSequenceNumber: 42, OriginalMessageID: "order-7"},
		"another subscription":        {Source: "t/Subscriptions/b", FirstSequenceNumber: 42, OriginalMessageID: "order-7"},
		"fields shifted across seams": {Source: "orders4", FirstSequenceNumber: 2, OriginalMessageID: "order-7"},
	} {
		assert.NotEqual(t, id, other.RetryMessageID(2), name)
	}
	// The key no longer decides the id: two chains with the same key differ.
	k1 := retry.Envelope{Key: "order-1", Source: "orders", FirstSequenceNumber: 1}
	k2 := retry.Envelope{Key: "order-1", Source: "orders", FirstSequenceNumber: 2}
	assert.NotEqual(t, k1.RetryMessageID(2), k2.RetryMessageID(2))
	huge := retry.Envelope{Source: strings.Repeat("s", 1024), FirstSequenceNumber: math.MaxInt64, OriginalMessageID: strings.Repeat("m", 1024)}
	assert.LessOrEqual(t, len(huge.RetryMessageID(math.MaxInt32)), retry.MaxMessageIDLength)
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
		assert.LessOrEqual(t, len(s.MessageID), retry.MaxMessageIDLength)
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
			props[retry.PropAttempt] = attempt
		case 1:
			props[retry.PropAttempt] = int32(attempt)
		case 2:
			props[retry.PropAttempt] = uint64(attempt)
		case 3:
			props[retry.PropAttempt] = corr
		case 4:
			props[retry.PropAttempt] = float64(attempt)
		}
		props[retry.PropCorrelationID] = corr
		props[retry.PropOriginalMessageID] = orig
		props[retry.PropKey] = orig
		props[retry.PropFirstEnqueuedTime] = time.UnixMilli(ts % (1 << 50)).UTC()
		msg := &azservicebus.ReceivedMessage{MessageID: "m", ApplicationProperties: props, Body: []byte("b")}
		env, err := retry.DecodeEnvelope(msg)
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
			next := sender.msgs[0].ApplicationProperties[retry.PropAttempt].(int64)
			require.Equal(t, int64(env.Attempt+1), next)
			require.LessOrEqual(t, next, int64(maxAttempts))
			require.LessOrEqual(t, len(*sender.msgs[0].MessageID), retry.MaxMessageIDLength)
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
	_, err := retry.NewProcessor(nopSender{}, okHandler, &retry.Options{DescriptionLimit: retry.MaxDescriptionLimit + 1})
	assert.ErrorIs(t, err, retry.ErrInvalidOptions)
	_, err = retry.NewProcessor(nopSender{}, okHandler, &retry.Options{DescriptionLimit: retry.MaxDescriptionLimit})
	assert.NoError(t, err)
}
