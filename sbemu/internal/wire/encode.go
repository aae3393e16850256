package wire

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strings"
	"time"
)

// maxDepth bounds how deeply values may nest, on encode (to stop cyclic maps)
// and on decode (to stop a hostile peer from exhausting the stack).
// Real traffic nests only a few levels (a map inside a described list inside a
// frame), so 64 rejects nothing legitimate while keeping recursion shallow.
const maxDepth = 64

// composite is implemented by the struct types that travel as a described
// list: performatives, delivery states, [Error], [Source], [Target] and the SASL
// frames. fields returns the list in specification order with nil for an
// absent field; the encoder drops trailing nils.
type composite interface {
	descriptor() uint64
	fields() []any
}

// AppendValue appends the AMQP encoding of v to dst and returns the extended
// buffer. It always picks the most compact constructor (uint0, smalluint,
// list0, list8, sym8, vbin8, ...), so the output is deterministic.
//
// v may be any type that [DecodeValue] returns: nil, bool, uint8, uint16,
// uint32, uint64, int8, int16, int32, int64, float32, float64, [Decimal32],
// [Decimal64], [Decimal128], [Char], time.Time (sent with millisecond
// precision), [UUID], []byte, string, [Symbol], []any (a list), [Array], *[Map],
// *[Described], and the composite types ([Open], [Accepted], [Error], ...) by
// value or by pointer. As conveniences it also accepts:
//
//   - int and uint, encoded as long and ulong; use int32 for an AMQP int.
//   - [Role], encoded as boolean.
//   - [Map] and [Described] by value.
//   - map[string]any and map[Symbol]any, encoded as maps with sorted keys.
//   - typed slices, encoded as arrays that keep their element type even when
//     empty: []bool, []int8, []int16, []int32, []int64, []int, []uint16,
//     []uint32, []uint64, []float32, []float64, []Char, []time.Time, []UUID,
//     []string, []Symbol and [][]byte.
//
// A nil pointer encodes as null. AppendValue fails on any other type, on an
// [Array] whose elements need different constructors, on a descriptor that is
// neither uint64 nor [Symbol], and on nesting deeper than 64 levels.
func AppendValue(dst []byte, v any) ([]byte, error) {
	return appendValue(dst, v, 0)
}

func appendValue(dst []byte, v any, depth int) ([]byte, error) {
	if depth > maxDepth {
		return dst, fmt.Errorf("wire: value nested deeper than %d levels", maxDepth)
	}
	// A typed nil pointer (say an absent *Map) is not == nil inside an interface
	// and would miss case nil below, yet it must still encode as null.
	if isNilPointer(v) {
		return append(dst, codeNull), nil
	}
	switch x := v.(type) {
	case nil:
		return append(dst, codeNull), nil
	case bool:
		return appendBool(dst, x), nil
	case Role:
		return appendBool(dst, bool(x)), nil
	case uint8:
		return append(dst, codeUbyte, x), nil
	case uint16:
		return binary.BigEndian.AppendUint16(append(dst, codeUshort), x), nil
	// uint0 and smalluint are the short encodings part 1 section 1.6.5 gives
	// uint; always taking the narrowest keeps the output deterministic.
	case uint32:
		switch {
		case x == 0:
			return append(dst, codeUint0), nil
		case x <= math.MaxUint8:
			return append(dst, codeSmallUint, byte(x)), nil
		}
		return binary.BigEndian.AppendUint32(append(dst, codeUint), x), nil
	case uint64:
		return appendUlong(dst, x), nil
	case uint:
		return appendUlong(dst, uint64(x)), nil
	case int8:
		return append(dst, codeByte, byte(x)), nil
	case int16:
		return binary.BigEndian.AppendUint16(append(dst, codeShort), uint16(x)), nil
	case int32:
		if x >= math.MinInt8 && x <= math.MaxInt8 {
			return append(dst, codeSmallInt, byte(x)), nil
		}
		return binary.BigEndian.AppendUint32(append(dst, codeInt), uint32(x)), nil
	case int64:
		return appendLong(dst, x), nil
	case int:
		return appendLong(dst, int64(x)), nil
	case []byte:
		return appendVariable(dst, codeVbin8, codeVbin32, x), nil
	case string:
		return appendVariable(dst, codeStr8, codeStr32, []byte(x)), nil
	case Symbol:
		return appendVariable(dst, codeSym8, codeSym32, []byte(x)), nil
	// Types with a single encoding share appendBody with array elements, so their
	// byte layout is defined in one place.
	case float32, float64, Decimal32, Decimal64, Decimal128, Char, time.Time, UUID:
		code, _ := elementCode(x)
		return appendBody(append(dst, code), code, x, depth)
	case []any:
		return appendList(dst, x, depth)
	case Map:
		return appendMap(dst, x.Entries, depth)
	case *Map:
		return appendMap(dst, x.Entries, depth)
	// Go maps have no order, so asEntries sorts their keys; otherwise the same
	// value could encode differently from one call to the next.
	case map[string]any, map[Symbol]any:
		entries, _ := asEntries(x)
		return appendMap(dst, entries, depth)
	case Described:
		return appendDescribed(dst, x.Descriptor, x.Value, depth)
	case *Described:
		return appendDescribed(dst, x.Descriptor, x.Value, depth)
	// Composites travel as described lists (part 1 section 1.4); trailing absent
	// fields are dropped, which may leave list0.
	case composite:
		return appendDescribed(dst, x.descriptor(), trimFields(x.fields()), depth)
	}
	// Typed slices become arrays. []byte and []any are slices too but were taken
	// above as binary and list, which is why this check comes after the switch.
	if elems, emptyCode, ok := asArray(v); ok {
		return appendArray(dst, elems, emptyCode, depth)
	}
	return dst, fmt.Errorf("wire: cannot encode Go type %T as an AMQP value", v)
}

// isNilPointer reports whether v is a typed nil pointer, which encodes as null.
// It needs reflect because an interface holding a nil *T compares unequal to
// nil, and the pointer types involved are too many to list.
func isNilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// appendBool uses the zero-width true and false codes (0x41, 0x42), which
// part 1 section 1.6.2 offers alongside the one-byte 0x56 form; only array
// elements need the latter.
func appendBool(dst []byte, b bool) []byte {
	if b {
		return append(dst, codeTrue)
	}
	return append(dst, codeFalse)
}

// appendUlong picks ulong0, smallulong or ulong. Every receiver must accept all
// three, and the short forms keep descriptor codes such as 0x10 (open) at two
// bytes instead of nine.
func appendUlong(dst []byte, x uint64) []byte {
	switch {
	case x == 0:
		return append(dst, codeUlong0)
	case x <= math.MaxUint8:
		return append(dst, codeSmallUlong, byte(x))
	}
	return binary.BigEndian.AppendUint64(append(dst, codeUlong), x)
}

// appendLong uses smalllong when x fits a signed byte; long has no zero-width
// form, unlike ulong.
func appendLong(dst []byte, x int64) []byte {
	if x >= math.MinInt8 && x <= math.MaxInt8 {
		return append(dst, codeSmallLong, byte(x))
	}
	return binary.BigEndian.AppendUint64(append(dst, codeLong), uint64(x))
}

// appendVariable writes a binary, string or symbol with the one-byte length
// form when it fits and the four-byte form otherwise.
func appendVariable(dst []byte, code8, code32 byte, b []byte) []byte {
	if len(b) <= math.MaxUint8 {
		return append(append(dst, code8, byte(len(b))), b...)
	}
	dst = binary.BigEndian.AppendUint32(append(dst, code32), uint32(len(b)))
	return append(dst, b...)
}

// trimFields drops the trailing absent fields of a composite, as the
// specification allows, so an empty composite becomes list0.
// Part 1 section 1.4 lets a sender omit trailing null fields of a composite,
// and receivers must read the omitted ones as null, so this is always safe.
func trimFields(f []any) []any {
	for len(f) > 0 && f[len(f)-1] == nil {
		f = f[:len(f)-1]
	}
	return f
}

// appendDescribed writes 0x00, the descriptor and the value. Both count as a
// nesting level, as they do in the decoder, so whatever encodes also decodes.
func appendDescribed(dst []byte, descriptor, value any, depth int) ([]byte, error) {
	if err := checkDescriptor(descriptor); err != nil {
		return dst, err
	}
	dst, err := appendValue(append(dst, codeDescribed), descriptor, depth+1)
	if err != nil {
		return dst, err
	}
	return appendValue(dst, value, depth+1)
}

// checkDescriptor enforces the two descriptor types the specification uses, so
// that everything AppendValue writes, DecodeValue reads back.
func checkDescriptor(d any) error {
	switch d.(type) {
	case uint64, Symbol:
		return nil
	}
	return fmt.Errorf("wire: descriptor must be uint64 or Symbol, got %T", d)
}

// compoundHeader is the room reserved for the 32-bit form of a list, map or
// array (code, size, count); finishCompound shrinks it to the 8-bit form when
// the contents turn out to be small.
const compoundHeader = 9

// startCompound reserves the header in its 32-bit shape because the size is
// unknown until the contents are written; it returns where the header starts.
func startCompound(dst []byte) ([]byte, int) {
	return append(dst, make([]byte, compoundHeader)...), len(dst)
}

// finishCompound writes the final header. The size field counts the count field
// as well (part 1 section 1.2), hence payload+1 for the 8-bit form and
// payload+4 for the 32-bit one. Choosing the 8-bit form moves the contents six
// bytes to the left; that copy is cheaper than encoding everything twice.
func finishCompound(dst []byte, start int, code8, code32 byte, count int) ([]byte, error) {
	payload := len(dst) - start - compoundHeader
	if payload+1 <= math.MaxUint8 && count <= math.MaxUint8 {
		dst[start] = code8
		dst[start+1] = byte(payload + 1)
		dst[start+2] = byte(count)
		copy(dst[start+3:], dst[start+compoundHeader:])
		return dst[:start+3+payload], nil
	}
	if uint64(payload)+4 > math.MaxUint32 || uint64(count) > math.MaxUint32 {
		return dst[:start], fmt.Errorf("wire: compound value of %d bytes is too large", payload)
	}
	dst[start] = code32
	binary.BigEndian.PutUint32(dst[start+1:], uint32(payload+4))
	binary.BigEndian.PutUint32(dst[start+5:], uint32(count))
	return dst, nil
}

// appendList writes list0 for an empty list, which is also the form an empty
// composite (such as accepted) takes after trimFields.
func appendList(dst []byte, items []any, depth int) ([]byte, error) {
	if len(items) == 0 {
		return append(dst, codeList0), nil
	}
	dst, start := startCompound(dst)
	var err error
	for _, it := range items {
		if dst, err = appendValue(dst, it, depth+1); err != nil {
			return dst[:start], err
		}
	}
	return finishCompound(dst, start, codeList8, codeList32, len(items))
}

// appendMap writes entries in the given order. A map's count is keys plus
// values (part 1 section 1.6.23), hence 2*len(entries); there is no map0, so
// an empty map still takes three bytes.
func appendMap(dst []byte, entries []MapEntry, depth int) ([]byte, error) {
	dst, start := startCompound(dst)
	var err error
	for _, e := range entries {
		if dst, err = appendValue(dst, e.Key, depth+1); err != nil {
			return dst[:start], err
		}
		if dst, err = appendValue(dst, e.Value, depth+1); err != nil {
			return dst[:start], err
		}
	}
	return finishCompound(dst, start, codeMap8, codeMap32, 2*len(entries))
}

// asEntries turns every map representation AppendValue accepts into entries;
// Go maps are sorted by key so the encoding does not depend on map order.
func asEntries(v any) ([]MapEntry, bool) {
	switch x := v.(type) {
	case Map:
		return x.Entries, true
	case *Map:
		if x == nil {
			return nil, true
		}
		return x.Entries, true
	case map[string]any:
		keys := slices.Sorted(maps.Keys(x))
		out := make([]MapEntry, 0, len(keys))
		for _, k := range keys {
			out = append(out, MapEntry{Key: k, Value: x[k]})
		}
		return out, true
	case map[Symbol]any:
		keys := make([]Symbol, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b Symbol) int { return strings.Compare(string(a), string(b)) })
		out := make([]MapEntry, 0, len(keys))
		for _, k := range keys {
			out = append(out, MapEntry{Key: k, Value: x[k]})
		}
		return out, true
	}
	return nil, false
}
