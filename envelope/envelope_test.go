package envelope_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/sbretry/retry/envelope"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDecodeEnvelopeFirstDelivery(t *testing.T) {
	enq := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	env, err := envelope.Decode(&azservicebus.ReceivedMessage{MessageID: "m-1", EnqueuedTime: &enq})
	require.NoError(t, err)
	assert.Equal(t, envelope.Envelope{Attempt: 1, OriginalMessageID: "m-1", FirstEnqueuedTime: enq, FirstSequenceNumber: -1}, env)
	assert.False(t, env.IsRetry())
	_, err = envelope.Decode(nil)
	assert.ErrorIs(t, err, envelope.ErrNilMessage)
}

// Decode returns its times in UTC, however they were decoded (go-amqp decodes an AMQP timestamp in the
// local zone): the delivery's own enqueue time as well as the envelope's properties.
func TestDecodeEnvelopeTimesInUTC(t *testing.T) {
	zone := time.FixedZone("UTC-5", -5*3600)
	enq := time.Date(2026, 1, 2, 3, 4, 5, 0, zone)
	env, err := envelope.Decode(&azservicebus.ReceivedMessage{MessageID: "m-1", EnqueuedTime: &enq})
	require.NoError(t, err)
	assert.Equal(t, time.UTC, env.FirstEnqueuedTime.Location())
	assert.True(t, enq.Equal(env.FirstEnqueuedTime))
	props := map[string]any{envelope.PropAttempt: int64(2), envelope.PropFirstEnqueuedTime: enq, envelope.PropExpiresAt: enq.Add(time.Hour), envelope.PropRedrivenAt: enq}
	env, err = envelope.Decode(&azservicebus.ReceivedMessage{MessageID: "m-1", EnqueuedTime: &enq, ApplicationProperties: props})
	require.NoError(t, err)
	for name, at := range map[string]time.Time{"first enqueued": env.FirstEnqueuedTime, "expires": env.ExpiresAt, "redriven": env.RedrivenAt} {
		assert.Equal(t, time.UTC, at.Location(), name)
	}
}

func TestDecodeEnvelopeAcceptsIntegerTypes(t *testing.T) {
	for _, v := range []any{int64(3), int32(3), int(3), int16(3), int8(3), uint8(3), uint16(3), uint32(3), uint64(3)} {
		env, err := envelope.Decode(&azservicebus.ReceivedMessage{ApplicationProperties: map[string]any{envelope.PropAttempt: v}})
		require.NoError(t, err, "%T", v)
		assert.Equal(t, 3, env.Attempt)
	}
}

func TestRetryMessageIDScheme(t *testing.T) {
	base := envelope.Envelope{Source: "orders", FirstSequenceNumber: 42, OriginalMessageID: "order-7"}
	id := base.RetryMessageID(2)
	assert.Regexp(t, `^sbretry-[0-9a-f]{40}-2$`, id)
	assert.Equal(t, id, base.RetryMessageID(2), "deterministic across redeliveries of one attempt")
	assert.NotEqual(t, id, base.RetryMessageID(3), "one id per attempt")
	assert.Equal(t, base.ChainID(), id[len("sbretry-"):len(id)-2])
	for name, other := range map[string]envelope.Envelope{
		"another sequence number":     {Source: "orders", FirstSequenceNumber: 43, OriginalMessageID: "order-7"},
		"another entity":              {Source: "orders2", FirstSequenceNumber: 42, OriginalMessageID: "order-7"},
		"another subscription":        {Source: "t/Subscriptions/b", FirstSequenceNumber: 42, OriginalMessageID: "order-7"},
		"fields shifted across seams": {Source: "orders4", FirstSequenceNumber: 2, OriginalMessageID: "order-7"},
	} {
		assert.NotEqual(t, id, other.RetryMessageID(2), name)
	}
	// The key no longer decides the id: two chains with the same key differ.
	k1 := envelope.Envelope{Key: "order-1", Source: "orders", FirstSequenceNumber: 1}
	k2 := envelope.Envelope{Key: "order-1", Source: "orders", FirstSequenceNumber: 2}
	assert.NotEqual(t, k1.RetryMessageID(2), k2.RetryMessageID(2))
	huge := envelope.Envelope{Source: strings.Repeat("s", 1024), FirstSequenceNumber: math.MaxInt64, OriginalMessageID: strings.Repeat("m", 1024)}
	assert.LessOrEqual(t, len(huge.RetryMessageID(math.MaxInt32)), envelope.MaxMessageIDLength)
}

func TestEnvelopeRedriveProperties(t *testing.T) {
	env, err := envelope.Decode(&azservicebus.ReceivedMessage{MessageID: "sbretry-resubmit-x", ApplicationProperties: map[string]any{envelope.PropResubmittedFrom: "order-7"}})
	require.NoError(t, err)
	assert.Equal(t, "order-7", env.OriginalMessageID)
	assert.Zero(t, env.Redrives)
	for _, bad := range []any{int64(-1), "3", int64(1) << 40} {
		_, err := envelope.Decode(&azservicebus.ReceivedMessage{MessageID: "m", ApplicationProperties: map[string]any{envelope.PropRedrives: bad}})
		assert.ErrorIs(t, err, envelope.ErrInvalid, "%v", bad)
	}
	_, err = envelope.Decode(&azservicebus.ReceivedMessage{MessageID: "m", ApplicationProperties: map[string]any{envelope.PropRedrivenAt: "yesterday"}})
	assert.ErrorIs(t, err, envelope.ErrInvalid)
}
