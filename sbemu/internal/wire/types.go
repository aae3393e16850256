package wire

import (
	"fmt"
	"math"
	"reflect"
	"time"
)

// Symbol is the AMQP symbol type: an ASCII name such as an error condition, a
// capability or an annotation key. It is a distinct Go type so that a symbol and
// a string, which are different AMQP types, stay different after a round trip
// (Service Bus tells annotation keys, which are symbols, from application
// property keys, which are strings).
type Symbol string

// UUID is the AMQP uuid type: 16 bytes in network (RFC 4122) byte order.
type UUID [16]byte

// String formats u in the canonical 8-4-4-4-12 hexadecimal form, which makes
// test failures and logs readable.
func (u UUID) String() string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// Char is the AMQP char type: one UTF-32 code point. It is not a plain rune so
// that it does not collide with int32, which is the AMQP int type.
type Char rune

// Decimal32 is the AMQP decimal32 type, kept as its raw IEEE 754 bytes in
// network order because nothing in the emulator does decimal arithmetic.
type Decimal32 [4]byte

// Decimal64 is the AMQP decimal64 type, kept as raw IEEE 754 bytes.
type Decimal64 [8]byte

// Decimal128 is the AMQP decimal128 type, kept as raw IEEE 754 bytes.
type Decimal128 [16]byte

// MapEntry is one key/value pair of a [Map].
type MapEntry struct {
	// Key is any decodable value; AMQP allows keys of any type.
	Key any
	// Value is any decodable value.
	Value any
}

// Map is the AMQP map type. It is an ordered list of entries rather than a Go
// map because AMQP keys can be values that Go maps cannot hold (byte slices,
// lists, maps), and because keeping the wire order makes encoding deterministic.
//
// The zero value is an empty map ready to use. A nil *Map reads as empty.
type Map struct {
	// Entries holds the pairs in wire order.
	Entries []MapEntry
}

// Get returns the value stored under key. Keys are compared by AMQP value with
// [Equal], so the Go type matters: the string "a" and the [Symbol] "a" are
// different keys, as they are on the wire.
func (m *Map) Get(key any) (any, bool) {
	if m == nil {
		return nil, false
	}
	for _, e := range m.Entries {
		if Equal(e.Key, key) {
			return e.Value, true
		}
	}
	return nil, false
}

// Set stores val under key, replacing the value of an existing equal key in
// place (so order is stable) or appending a new entry.
func (m *Map) Set(key, val any) {
	for i := range m.Entries {
		if Equal(m.Entries[i].Key, key) {
			m.Entries[i].Value = val
			return
		}
	}
	m.Entries = append(m.Entries, MapEntry{Key: key, Value: val})
}

// Len returns the number of entries; a nil map has none.
func (m *Map) Len() int {
	if m == nil {
		return 0
	}
	return len(m.Entries)
}

// Array is the AMQP array type: a sequence of values that all share one
// constructor. [AppendValue] picks that constructor from the Go type of the
// elements (widening, for example, smalllong to long when one element needs
// it) and fails when the elements have different types.
//
// An empty Array has no element to take a type from and encodes as an array of
// null. To send an empty array of a particular type, which peers such as the
// Service Bus SDK expect (for example an empty array of long), encode a typed
// Go slice instead: []int64{}, []int32{}, []uint32{}, []uint64{}, []string{},
// []Symbol{}, []UUID{}, []time.Time{}, []bool{} and the other typed slices
// listed at [AppendValue] always carry their element type, even when empty.
// Decoding always yields an Array.
type Array []any

// Described is an AMQP described type whose descriptor this package does not
// know, for example a message section (descriptor 0x70..0x78) or a filter.
// Known descriptors decode to their own types instead ([Open], [Accepted], ...).
//
// Described also implements [DeliveryState] so that an unknown delivery state
// (such as a transactional state) survives decoding instead of failing it.
type Described struct {
	// Descriptor is a uint64 (numeric descriptor) or a [Symbol] (symbolic one).
	Descriptor any
	// Value is the described value, any decodable value.
	Value any
}

func (Described) isDeliveryState() {}

// Equal reports whether a and b are the same AMQP value: the same Go type and
// the same contents, looking through pointers. Floats compare by bit pattern so
// that NaN equals itself and 0 differs from -0 (they encode differently), times
// compare by instant, and a nil slice equals an empty one. [Map.Get] uses it to
// compare keys; tests use it to compare decoded values.
func Equal(a, b any) bool {
	return deepEqual(reflect.ValueOf(a), reflect.ValueOf(b), 0)
}

// maxEqualDepth stops Equal on cyclic values instead of overflowing the stack.
const maxEqualDepth = 100

var timeType = reflect.TypeFor[time.Time]()

func deepEqual(a, b reflect.Value, depth int) bool {
	if !a.IsValid() || !b.IsValid() {
		return a.IsValid() == b.IsValid()
	}
	if a.Type() != b.Type() || depth > maxEqualDepth {
		return false
	}
	switch a.Kind() {
	case reflect.Float32:
		return math.Float32bits(float32(a.Float())) == math.Float32bits(float32(b.Float()))
	case reflect.Float64:
		return math.Float64bits(a.Float()) == math.Float64bits(b.Float())
	case reflect.Pointer, reflect.Interface:
		if a.IsNil() || b.IsNil() {
			return a.IsNil() == b.IsNil()
		}
		return deepEqual(a.Elem(), b.Elem(), depth+1)
	case reflect.Slice, reflect.Array:
		if a.Len() != b.Len() {
			return false
		}
		for i := range a.Len() {
			if !deepEqual(a.Index(i), b.Index(i), depth+1) {
				return false
			}
		}
		return true
	case reflect.Struct:
		if a.Type() == timeType {
			return a.Interface().(time.Time).Equal(b.Interface().(time.Time))
		}
		for i := range a.NumField() {
			if !a.Type().Field(i).IsExported() {
				return false // none of this package's value types has one
			}
			if !deepEqual(a.Field(i), b.Field(i), depth+1) {
				return false
			}
		}
		return true
	case reflect.Map:
		if a.Len() != b.Len() {
			return false
		}
		it := a.MapRange()
		for it.Next() {
			bv := b.MapIndex(it.Key())
			if !bv.IsValid() || !deepEqual(it.Value(), bv, depth+1) {
				return false
			}
		}
		return true
	case reflect.Func, reflect.Chan, reflect.UnsafePointer:
		return a.Pointer() == b.Pointer()
	default:
		return a.Equal(b)
	}
}
