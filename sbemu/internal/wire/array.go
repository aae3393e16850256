package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// arrayCtor is the single constructor shared by every element of an AMQP
// array: a format code, or a descriptor plus the constructor of the described
// values.
type arrayCtor struct {
	code       byte
	descriptor any        // when code == codeDescribed
	inner      *arrayCtor // when code == codeDescribed
}

// asArray returns the elements of every array representation AppendValue
// accepts, with the format code to use when there are no elements to infer it
// from.
//
// An empty array still carries an element constructor (part 1 section 1.6.24),
// so emptyCode matters: an [Array] has no element type and falls back to null,
// while a typed slice keeps its type, which is how an empty long[] reaches the
// SDK as an array of long. For variable-width types the 8-bit code is enough,
// since there are no element bodies to size.
func asArray(v any) (elems []any, emptyCode byte, ok bool) {
	switch x := v.(type) {
	case Array:
		return x, codeNull, true
	case []bool:
		return toAnys(x), codeBool, true
	case []int8:
		return toAnys(x), codeByte, true
	case []int16:
		return toAnys(x), codeShort, true
	case []int32:
		return toAnys(x), codeInt, true
	case []int64:
		return toAnys(x), codeLong, true
	// Go's int may be 64 bits wide, and long holds either width, so long is
	// the only AMQP type that fits every []int.
	case []int:
		return toAnys(x), codeLong, true
	case []uint16:
		return toAnys(x), codeUshort, true
	case []uint32:
		return toAnys(x), codeUint, true
	case []uint64:
		return toAnys(x), codeUlong, true
	case []float32:
		return toAnys(x), codeFloat, true
	case []float64:
		return toAnys(x), codeDouble, true
	case []Char:
		return toAnys(x), codeChar, true
	case []time.Time:
		return toAnys(x), codeTimestamp, true
	case []UUID:
		return toAnys(x), codeUUID, true
	case []string:
		return toAnys(x), codeStr8, true
	case []Symbol:
		return toAnys(x), codeSym8, true
	case [][]byte:
		return toAnys(x), codeVbin8, true
	}
	return nil, 0, false
}

// toAnys boxes a typed slice so typed slices and [Array] share one encoding
// path; the copy is the price of inferring a single constructor generically.
func toAnys[T any](s []T) []any {
	out := make([]any, len(s))
	for i, e := range s {
		out[i] = e
	}
	return out
}

// elementCode returns the narrowest constructor that can carry v inside an
// array. Unlike a standalone value it never picks a zero-width form (uint0,
// true, list0, ...), because all elements share the constructor. Compound
// elements always use their 32-bit form. Described values return
// codeDescribed.
//
// The zero-width forms are excluded because they hold the value in the
// constructor itself (true and false are different codes), so one shared
// constructor could not stand for two different elements.
func elementCode(v any) (byte, error) {
	if isNilPointer(v) {
		return codeNull, nil
	}
	switch x := v.(type) {
	case nil:
		return codeNull, nil
	case bool, Role:
		return codeBool, nil
	case uint8:
		return codeUbyte, nil
	case uint16:
		return codeUshort, nil
	case uint32:
		if x <= math.MaxUint8 {
			return codeSmallUint, nil
		}
		return codeUint, nil
	case uint64, uint:
		if asUint64(x) <= math.MaxUint8 {
			return codeSmallUlong, nil
		}
		return codeUlong, nil
	case int8:
		return codeByte, nil
	case int16:
		return codeShort, nil
	case int32:
		if x >= math.MinInt8 && x <= math.MaxInt8 {
			return codeSmallInt, nil
		}
		return codeInt, nil
	case int64, int:
		if n := asInt64(x); n >= math.MinInt8 && n <= math.MaxInt8 {
			return codeSmallLong, nil
		}
		return codeLong, nil
	case float32:
		return codeFloat, nil
	case float64:
		return codeDouble, nil
	case Decimal32:
		return codeDecimal32, nil
	case Decimal64:
		return codeDecimal64, nil
	case Decimal128:
		return codeDecimal128, nil
	case Char:
		return codeChar, nil
	case time.Time:
		return codeTimestamp, nil
	case UUID:
		return codeUUID, nil
	case []byte:
		if len(x) <= math.MaxUint8 {
			return codeVbin8, nil
		}
		return codeVbin32, nil
	case string:
		if len(x) <= math.MaxUint8 {
			return codeStr8, nil
		}
		return codeStr32, nil
	case Symbol:
		if len(x) <= math.MaxUint8 {
			return codeSym8, nil
		}
		return codeSym32, nil
	// A list element's size is not known until it is encoded, and every element
	// shares the constructor, so only the 32-bit form is safe for all of them.
	case []any:
		return codeList32, nil
	case Described, *Described, composite:
		return codeDescribed, nil
	}
	// Maps and typed slices come after the switch because they span several Go
	// types each (map[string]any, []int64, ...), which asEntries and asArray
	// already enumerate.
	if _, ok := asEntries(v); ok {
		return codeMap32, nil
	}
	if _, _, ok := asArray(v); ok {
		return codeArray32, nil
	}
	return 0, fmt.Errorf("wire: cannot encode Go type %T as an AMQP value", v)
}

// widen maps a narrow constructor to the wide one of the same AMQP type, so
// that, say, an array of int64 where one element needs eight bytes uses long
// for all of them.
//
// Each pair is one AMQP type with two encodings (part 1 section 1.6 lists both
// under the same type), so widening never changes what the receiver decodes.
func widen(code byte) byte {
	switch code {
	case codeSmallUint:
		return codeUint
	case codeSmallUlong:
		return codeUlong
	case codeSmallInt:
		return codeInt
	case codeSmallLong:
		return codeLong
	case codeVbin8:
		return codeVbin32
	case codeStr8:
		return codeStr32
	case codeSym8:
		return codeSym32
	}
	return code
}

// describedParts splits every described representation into its descriptor
// and value.
// Arrays need the two apart: the descriptor goes once into the shared
// constructor and only the values follow, one per element.
func describedParts(v any) (descriptor, value any) {
	switch x := v.(type) {
	case Described:
		return x.Descriptor, x.Value
	case *Described:
		return x.Descriptor, x.Value
	case composite:
		return x.descriptor(), trimFields(x.fields())
	}
	return nil, nil
}

// inferArrayCtor finds the one constructor that fits every element, or fails
// when the elements are of different AMQP types.
func inferArrayCtor(elems []any, depth int) (arrayCtor, error) {
	if depth > maxDepth {
		return arrayCtor{}, fmt.Errorf("wire: value nested deeper than %d levels", maxDepth)
	}
	var ctor arrayCtor
	for i, e := range elems {
		code, err := elementCode(e)
		if err != nil {
			return arrayCtor{}, err
		}
		if i == 0 {
			ctor.code = code
			if code == codeDescribed {
				ctor.descriptor, _ = describedParts(e)
				if err := checkDescriptor(ctor.descriptor); err != nil {
					return arrayCtor{}, err
				}
			}
			continue
		}
		// Every later element must match the first: the same constructor, the same
		// type in another width (the array then widens), or for described elements
		// an equal descriptor, because the constructor is written once up front.
		switch {
		case code == codeDescribed && ctor.code == codeDescribed:
			if d, _ := describedParts(e); !Equal(d, ctor.descriptor) {
				return arrayCtor{}, fmt.Errorf("wire: array elements have different descriptors %v and %v", ctor.descriptor, d)
			}
		case code == ctor.code:
		case widen(code) == widen(ctor.code):
			ctor.code = widen(code)
		default:
			return arrayCtor{}, fmt.Errorf("wire: array element %d is %T, which does not match the first element (%#x)", i, e, ctor.code)
		}
	}
	// The described values need a shared constructor of their own, found by the
	// same rules one level down; they may be described again, hence depth+1.
	if ctor.code == codeDescribed {
		values := make([]any, len(elems))
		for i, e := range elems {
			_, values[i] = describedParts(e)
		}
		inner, err := inferArrayCtor(values, depth+1)
		if err != nil {
			return arrayCtor{}, err
		}
		ctor.inner = &inner
	}
	return ctor, nil
}

// appendCtor writes the shared element constructor. A described constructor
// is 0x00, the descriptor value and then another constructor (part 1 section
// 1.2), so it recurses until it reaches a plain format code.
func appendCtor(dst []byte, c arrayCtor, depth int) ([]byte, error) {
	if c.code != codeDescribed {
		return append(dst, c.code), nil
	}
	dst, err := appendValue(append(dst, codeDescribed), c.descriptor, depth+1)
	if err != nil {
		return dst, err
	}
	return appendCtor(dst, *c.inner, depth+1)
}

// appendArray writes an array, in the array8 form when it fits.
// Unlike lists there is no zero-length form (AMQP has no array0), so even an
// empty array carries size, count and constructor.
func appendArray(dst []byte, elems []any, emptyCode byte, depth int) ([]byte, error) {
	ctor := arrayCtor{code: emptyCode}
	if len(elems) > 0 {
		var err error
		if ctor, err = inferArrayCtor(elems, depth+1); err != nil {
			return dst, err
		}
	}
	dst, start := startCompound(dst)
	dst, err := appendArrayContents(dst, ctor, elems, depth)
	if err != nil {
		return dst[:start], err
	}
	return finishCompound(dst, start, codeArray8, codeArray32, len(elems))
}

// appendArrayContents writes the constructor once and then each element's data
// without a constructor of its own, which is what makes an array smaller than a
// list of the same values.
func appendArrayContents(dst []byte, ctor arrayCtor, elems []any, depth int) ([]byte, error) {
	dst, err := appendCtor(dst, ctor, depth)
	if err != nil {
		return dst, err
	}
	for _, e := range elems {
		if dst, err = appendElement(dst, ctor, e, depth+1); err != nil {
			return dst, err
		}
	}
	return dst, nil
}

// appendElement writes one element's data. For described elements it drops the
// descriptor, which the constructor already carries, and writes the value.
func appendElement(dst []byte, ctor arrayCtor, v any, depth int) ([]byte, error) {
	if ctor.code == codeDescribed {
		_, value := describedParts(v)
		return appendElement(dst, *ctor.inner, value, depth+1)
	}
	return appendBody(dst, ctor.code, v, depth)
}

// asUint64 widens the unsigned Go types that share the uint and ulong codes.
// Callers chose the code from v's type, so the zero fallback is never used for
// valid input; it only keeps the function total.
func asUint64(v any) uint64 {
	switch x := v.(type) {
	case uint64:
		return x
	case uint:
		return uint64(x)
	case uint32:
		return uint64(x)
	}
	return 0
}

// asInt64 is asUint64 for the signed types behind the int and long codes.
func asInt64(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case int:
		return int64(x)
	case int32:
		return int64(x)
	}
	return 0
}

// appendBody writes the data that follows format code for v, which the caller
// has checked is of the matching Go type (elementCode or AppendValue chose the
// code from v).
func appendBody(dst []byte, code byte, v any, depth int) ([]byte, error) {
	if depth > maxDepth {
		return dst, fmt.Errorf("wire: value nested deeper than %d levels", maxDepth)
	}
	be := binary.BigEndian
	switch code {
	case codeNull:
		return dst, nil
	// A Role is a boolean on the wire (part 2 section 2.8.1), so it shares this
	// case; inside an array only the one-byte 0x56 form can be used.
	case codeBool:
		b, _ := v.(bool)
		if r, ok := v.(Role); ok {
			b = bool(r)
		}
		if b {
			return append(dst, 1), nil
		}
		return append(dst, 0), nil
	case codeUbyte:
		return append(dst, v.(uint8)), nil
	case codeByte:
		return append(dst, byte(v.(int8))), nil
	case codeUshort:
		return be.AppendUint16(dst, v.(uint16)), nil
	case codeShort:
		return be.AppendUint16(dst, uint16(v.(int16))), nil
	case codeSmallUint, codeSmallUlong:
		return append(dst, byte(asUint64(v))), nil
	case codeSmallInt, codeSmallLong:
		return append(dst, byte(asInt64(v))), nil
	case codeUint:
		return be.AppendUint32(dst, uint32(asUint64(v))), nil
	case codeUlong:
		return be.AppendUint64(dst, asUint64(v)), nil
	case codeInt:
		return be.AppendUint32(dst, uint32(asInt64(v))), nil
	case codeLong:
		return be.AppendUint64(dst, uint64(asInt64(v))), nil
	case codeFloat:
		return be.AppendUint32(dst, math.Float32bits(v.(float32))), nil
	case codeDouble:
		return be.AppendUint64(dst, math.Float64bits(v.(float64))), nil
	case codeChar:
		return be.AppendUint32(dst, uint32(v.(Char))), nil
	// AMQP timestamps are milliseconds since the Unix epoch (part 1 section
	// 1.6.17); finer precision is dropped here, as AppendValue documents.
	case codeTimestamp:
		return be.AppendUint64(dst, uint64(v.(time.Time).UnixMilli())), nil
	// Decimals are kept as their raw wire bytes, so they are copied unchanged.
	case codeDecimal32:
		d := v.(Decimal32)
		return append(dst, d[:]...), nil
	case codeDecimal64:
		d := v.(Decimal64)
		return append(dst, d[:]...), nil
	case codeDecimal128:
		d := v.(Decimal128)
		return append(dst, d[:]...), nil
	case codeUUID:
		u := v.(UUID)
		return append(dst, u[:]...), nil
	case codeVbin8, codeStr8, codeSym8:
		b := variableBytes(v)
		return append(append(dst, byte(len(b))), b...), nil
	case codeVbin32, codeStr32, codeSym32:
		b := variableBytes(v)
		return append(be.AppendUint32(dst, uint32(len(b))), b...), nil
	// Compound elements always use the 32-bit form (see elementCode), so the size
	// is reserved at four bytes and patched once the contents are written.
	case codeList32:
		items := v.([]any)
		dst, start := appendSizeCount(dst, len(items))
		var err error
		for _, it := range items {
			if dst, err = appendValue(dst, it, depth+1); err != nil {
				return dst, err
			}
		}
		return patchSize(dst, start)
	case codeMap32:
		entries, _ := asEntries(v)
		dst, start := appendSizeCount(dst, 2*len(entries))
		var err error
		for _, e := range entries {
			if dst, err = appendValue(dst, e.Key, depth+1); err != nil {
				return dst, err
			}
			if dst, err = appendValue(dst, e.Value, depth+1); err != nil {
				return dst, err
			}
		}
		return patchSize(dst, start)
	// A nested array writes its own constructor after size and count, like a
	// top-level one; only its leading 0xf0 is shared with its siblings.
	case codeArray32:
		elems, emptyCode, _ := asArray(v)
		ctor := arrayCtor{code: emptyCode}
		if len(elems) > 0 {
			var err error
			if ctor, err = inferArrayCtor(elems, depth+1); err != nil {
				return dst, err
			}
		}
		dst, start := appendSizeCount(dst, len(elems))
		dst, err := appendArrayContents(dst, ctor, elems, depth)
		if err != nil {
			return dst, err
		}
		return patchSize(dst, start)
	}
	return dst, fmt.Errorf("wire: no encoder for format code %#x", code)
}

// variableBytes returns the bytes of a binary, string or symbol. Go strings are
// already UTF-8, the encoding part 1 requires for str8 and str32, so no
// conversion is needed.
func variableBytes(v any) []byte {
	switch x := v.(type) {
	case []byte:
		return x
	case string:
		return []byte(x)
	case Symbol:
		return []byte(x)
	}
	return nil
}

// appendSizeCount reserves the 32-bit size and writes the 32-bit count of a
// compound body inside an array; patchSize fills the size in afterwards.
func appendSizeCount(dst []byte, count int) ([]byte, int) {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	return binary.BigEndian.AppendUint32(dst, uint32(count)), start
}

// patchSize fills in the size reserved by appendSizeCount. The size covers
// everything after the size field, count included, and it fails rather than
// wrap when that no longer fits 32 bits.
func patchSize(dst []byte, start int) ([]byte, error) {
	size := len(dst) - start - 4
	if uint64(size) > math.MaxUint32 {
		return dst, fmt.Errorf("wire: compound value of %d bytes is too large", size)
	}
	binary.BigEndian.PutUint32(dst[start:], uint32(size))
	return dst, nil
}
