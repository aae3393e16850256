package sbemu

import (
	"github.com/Azure/go-amqp"

	"github.com/sbretry/retry/sbemu/internal/wire"
)

// fromWire converts a value decoded by the wire codec into the Go types
// go-amqp uses for message contents, so it can be stored in a broker
// message and marshalled again: symbols, UUIDs and maps change type, lists
// and arrays become []any, described values keep only their value.
func fromWire(v any) any {
	switch v := v.(type) {
	case wire.Symbol:
		return amqp.Symbol(v)
	case wire.UUID:
		return amqp.UUID(v)
	case wire.Char:
		return int32(v)
	case *wire.Map:
		if v == nil {
			return nil
		}
		// go-amqp encodes map[string]any as a map with string keys, which is
		// what application properties must be; only maps with other keys fall
		// back to map[any]any.
		allStrings := true
		for _, e := range v.Entries {
			if _, ok := e.Key.(string); !ok {
				allStrings = false
				break
			}
		}
		if allStrings {
			out := make(map[string]any, len(v.Entries))
			for _, e := range v.Entries {
				out[e.Key.(string)] = fromWire(e.Value)
			}
			return out
		}
		out := make(map[any]any, len(v.Entries))
		for _, e := range v.Entries {
			key := fromWire(e.Key)
			switch key.(type) {
			case map[string]any, map[any]any, []any, []byte:
				continue // not hashable as a Go map key
			}
			out[key] = fromWire(e.Value)
		}
		return out
	case wire.Array:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = fromWire(e)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = fromWire(e)
		}
		return out
	case *wire.Described:
		if v == nil {
			return nil
		}
		return fromWire(v.Value)
	}
	return v
}
