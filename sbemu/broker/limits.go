package broker

import (
	"fmt"
	"time"
)

// Service Bus limits on application properties (the quotas page: "Message property size for a queue,
// topic, or subscription entity"). The emulator enforces them on every send and schedule, so that a
// client that would be refused by the real service is refused here too.
const (
	// MaxPropertySize bounds one application property: its name plus its value, as encoded.
	MaxPropertySize = 32 * 1024
	// MaxPropertiesSize bounds all application properties of a message together.
	MaxPropertiesSize = 64 * 1024
)

// checkProperties reports application properties over the Service Bus limits. Sizes are those of the
// AMQP encoding (a str8/str32 name, then the value), computed from the decoded values: close to the
// bytes on the wire and never smaller than the payload they carry.
func checkProperties(props map[string]any) error {
	total := 0
	for name, value := range props {
		size := encodedStringSize(len(name)) + encodedValueSize(value)
		if size > MaxPropertySize {
			return fmt.Errorf("%w: property %q is %d bytes, the limit is %d", ErrPropertiesTooLarge, name, size, MaxPropertySize)
		}
		total += size
	}
	if total > MaxPropertiesSize {
		return fmt.Errorf("%w: %d bytes of properties, the limit is %d", ErrPropertiesTooLarge, total, MaxPropertiesSize)
	}
	return nil
}

// encodedStringSize is the size of a string or binary of n bytes: a one-byte constructor plus a one-
// or four-byte length.
func encodedStringSize(n int) int {
	if n <= 255 {
		return 2 + n
	}
	return 5 + n
}

// encodedValueSize sizes the property value types the SDK produces; fixed-width types are counted at
// their widest encoding, which is what keeps the estimate from undercounting.
func encodedValueSize(v any) int {
	switch x := v.(type) {
	case string:
		return encodedStringSize(len(x))
	case []byte:
		return encodedStringSize(len(x))
	case nil, bool:
		return 1
	case time.Time:
		return 9
	default:
		return 17 // uuid, long, double and smaller types fit
	}
}
