package sbemu

import (
	"testing"
	"time"

	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/internal/wire"
)

func TestMarshalDeliveryWritesEveryHeaderField(t *testing.T) {
	m := amqp.NewMessage([]byte("body"))
	m.Header = &amqp.MessageHeader{Priority: 4}
	m.ApplicationProperties = map[string]any{"k": "v"}
	payload, err := marshalDelivery(m)
	require.NoError(t, err)

	// The header is a described list of all five fields, delivery-count 0
	// included.
	v, n, err := wire.DecodeValue(payload)
	require.NoError(t, err)
	d, ok := v.(*wire.Described)
	if !ok {
		dv, isValue := v.(wire.Described)
		require.True(t, isValue, "got %T", v)
		d = &dv
	}
	assert.Equal(t, headerDescriptor, d.Descriptor)
	fields, ok := d.Value.([]any)
	require.True(t, ok, "got %T", d.Value)
	require.Len(t, fields, 5)
	assert.Equal(t, uint32(0), fields[4], "delivery-count present")
	assert.Nil(t, fields[2], "no ttl")

	// go-amqp decodes the whole message as it was.
	var back amqp.Message
	require.NoError(t, back.UnmarshalBinary(payload))
	require.NotNil(t, back.Header)
	assert.Equal(t, uint8(4), back.Header.Priority)
	assert.Equal(t, "v", back.ApplicationProperties["k"])
	assert.Equal(t, []byte("body"), back.GetData())
	assert.Positive(t, n)

	m.Header.TTL = 90 * time.Second
	m.Header.DeliveryCount = 3
	payload, err = marshalDelivery(m)
	require.NoError(t, err)
	require.NoError(t, back.UnmarshalBinary(payload))
	assert.Equal(t, 90*time.Second, back.Header.TTL)
	assert.Equal(t, uint32(3), back.Header.DeliveryCount)
}
