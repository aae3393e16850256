package sbemu

import (
	"math"
	"time"

	"github.com/Azure/go-amqp"

	"github.com/sbretry/retry/sbemu/internal/wire"
)

// headerDescriptor is the descriptor of the header section of a message
// (AMQP 1.0 part 3 section 3.2.1).
const headerDescriptor uint64 = 0x70

// marshalDelivery encodes a message handed to a client (a delivery or a
// peeked message). It is go-amqp's encoding except for the header, which is
// written with every field present.
//
// go-amqp leaves out fields that equal their AMQP default, so a first
// delivery carries no delivery-count. The Go SDK reads the missing field as
// 0, but the JavaScript SDK copies the raw field into deliveryCount and
// reports undefined (rhea's decoding; @azure/service-bus
// fromRheaMessage), which real Service Bus never makes it do: the service
// sends the count even when it is 0. Writing the header ourselves keeps
// both clients right. The sections that follow are unchanged, and the
// header is always the first section, so the two encodings concatenate.
func marshalDelivery(m *amqp.Message) ([]byte, error) {
	h := m.Header
	if h == nil {
		return m.MarshalBinary()
	}
	m.Header = nil
	rest, err := m.MarshalBinary()
	m.Header = h
	if err != nil {
		return nil, err
	}
	var ttl any // absent (null) means no time-to-live
	if h.TTL > 0 {
		ttl = uint32(min(h.TTL/time.Millisecond, math.MaxUint32))
	}
	buf, err := wire.AppendValue(make([]byte, 0, 16+len(rest)), wire.Described{
		Descriptor: headerDescriptor,
		Value:      []any{h.Durable, h.Priority, ttl, h.FirstAcquirer, h.DeliveryCount},
	})
	if err != nil {
		return nil, err
	}
	return append(buf, rest...), nil
}
