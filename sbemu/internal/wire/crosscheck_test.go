package wire

import (
	"testing"
	"time"

	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Message section descriptors (part 3 section 3.2).
const (
	descHeader                uint64 = 0x70
	descMessageAnnotations    uint64 = 0x72
	descProperties            uint64 = 0x73
	descApplicationProperties uint64 = 0x74
	descData                  uint64 = 0x75
	descAMQPValue             uint64 = 0x77
)

// decodeSections decodes a bare message the way the emulator sees it on the
// wire: a run of described sections.
func decodeSections(t *testing.T, b []byte) map[uint64]any {
	t.Helper()
	out := map[uint64]any{}
	for len(b) > 0 {
		v, rest, err := DecodeValue(b)
		require.NoError(t, err)
		d, ok := v.(*Described)
		require.Truef(t, ok, "section is %T", v)
		code, ok := d.Descriptor.(uint64)
		require.True(t, ok)
		out[code] = d.Value
		b = rest
	}
	return out
}

// TestCrossCheckClientMessage decodes bytes produced by go-amqp, the client
// library of the Service Bus SDK.
func TestCrossCheckClientMessage(t *testing.T) {
	locked := time.Date(2025, 3, 4, 5, 6, 7, 890_000_000, time.UTC)
	msgID := "message-1"
	lockToken := amqp.UUID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	msg := &amqp.Message{
		Header: &amqp.MessageHeader{Durable: true, DeliveryCount: 3},
		Annotations: amqp.Annotations{
			"x-opt-locked-until":    locked,
			"x-opt-sequence-number": int64(1 << 40),
		},
		Properties: &amqp.MessageProperties{MessageID: msgID, CorrelationID: lockToken},
		ApplicationProperties: map[string]any{
			"status-code": int32(200),
			"numbers":     []int64{1, -2, 1 << 50},
			"name":        "put-token",
		},
		Data: [][]byte{[]byte("hello")},
	}
	raw, err := msg.MarshalBinary()
	require.NoError(t, err)

	sections := decodeSections(t, raw)

	header, ok := sections[descHeader].([]any)
	require.True(t, ok, "header is a list")
	require.GreaterOrEqual(t, len(header), 5)
	assert.Equal(t, true, header[0])
	assert.Equal(t, uint32(3), header[4])

	annotations, ok := sections[descMessageAnnotations].(*Map)
	require.True(t, ok)
	v, ok := annotations.Get(Symbol("x-opt-locked-until"))
	require.True(t, ok, "annotation keys are symbols")
	assert.Equal(t, locked, v)
	v, _ = annotations.Get(Symbol("x-opt-sequence-number"))
	assert.Equal(t, int64(1<<40), v)

	props, ok := sections[descProperties].([]any)
	require.True(t, ok)
	assert.Equal(t, msgID, props[0], "message-id")
	assert.Equal(t, UUID(lockToken), props[5], "correlation-id")

	app, ok := sections[descApplicationProperties].(*Map)
	require.True(t, ok)
	v, _ = app.Get("status-code")
	assert.Equal(t, int32(200), v)
	v, _ = app.Get("numbers")
	assert.Equal(t, Array{int64(1), int64(-2), int64(1 << 50)}, v)
	v, _ = app.Get("name")
	assert.Equal(t, "put-token", v)

	assert.Equal(t, []byte("hello"), sections[descData])

	// Re-encoding every section gives bytes go-amqp reads back to the same message.
	var again []byte
	for _, code := range []uint64{descHeader, descMessageAnnotations, descProperties, descApplicationProperties, descData} {
		again, err = AppendValue(again, &Described{Descriptor: code, Value: sections[code]})
		require.NoError(t, err)
	}
	var back amqp.Message
	require.NoError(t, back.UnmarshalBinary(again))
	assert.Equal(t, msg.ApplicationProperties, back.ApplicationProperties)
	backLocked, ok := back.Annotations["x-opt-locked-until"].(time.Time)
	require.True(t, ok)
	assert.True(t, locked.Equal(backLocked), "go-amqp returns local time; the instant must match")
	assert.Equal(t, int64(1<<40), back.Annotations["x-opt-sequence-number"])
	assert.Equal(t, msg.Properties.MessageID, back.Properties.MessageID)
	assert.Equal(t, msg.Data, back.Data)
}

// TestCrossCheckServerReplyDecodedByClient builds a management reply the way
// the emulator does and checks go-amqp decodes it into the Go types the
// Service Bus SDK type-asserts.
func TestCrossCheckServerReplyDecodedByClient(t *testing.T) {
	expiry := time.UnixMilli(1_700_000_000_123).UTC()
	app := &Map{}
	app.Set("status-code", int32(200))
	body := &Map{}
	body.Set("sequence-numbers", []int64{5, 1 << 33})
	body.Set("expirations", []time.Time{expiry})
	body.Set("lock-tokens", []UUID{{1}, {2}})
	body.Set("empty", []int64{})

	var raw []byte
	var err error
	raw, err = AppendValue(raw, &Described{Descriptor: descProperties, Value: []any{nil, nil, nil, nil, nil, "request-1"}})
	require.NoError(t, err)
	raw, err = AppendValue(raw, &Described{Descriptor: descApplicationProperties, Value: app})
	require.NoError(t, err)
	raw, err = AppendValue(raw, &Described{Descriptor: descAMQPValue, Value: body})
	require.NoError(t, err)

	var msg amqp.Message
	require.NoError(t, msg.UnmarshalBinary(raw))
	assert.Equal(t, int32(200), msg.ApplicationProperties["status-code"])
	assert.Equal(t, "request-1", msg.Properties.CorrelationID)
	value, ok := msg.Value.(map[string]any)
	require.True(t, ok, "value is %T", msg.Value)
	assert.Equal(t, []int64{5, 1 << 33}, value["sequence-numbers"])
	assert.Equal(t, []time.Time{expiry}, value["expirations"])
	assert.Equal(t, []amqp.UUID{{1}, {2}}, value["lock-tokens"])
	assert.IsType(t, []int64(nil), value["empty"], "an empty typed slice keeps its element type")
	assert.Empty(t, value["empty"])
}
