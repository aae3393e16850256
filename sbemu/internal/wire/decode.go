package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// maxZeroWidthElements bounds, per DecodeValue call, the array elements whose
// constructor carries no data (null, true, false, uint0, ulong0, list0). Every
// other element costs at least one input byte, so only these could make a
// small input allocate a lot; no real peer sends many of them.
const maxZeroWidthElements = 4096

// DecodeValue decodes the AMQP value at the start of src and returns it with
// the bytes that follow it.
//
// AMQP types map to Go types as follows: null → nil, boolean → bool, ubyte →
// uint8, ushort → uint16, uint → uint32, ulong → uint64, byte → int8, short →
// int16, int → int32, long → int64, float → float32, double → float64,
// decimal32/64/128 → [Decimal32]/[Decimal64]/[Decimal128], char → [Char],
// timestamp → time.Time (UTC), uuid → [UUID], binary → []byte (a copy, never
// aliasing src), string → string, symbol → [Symbol], list → []any, map →
// *[Map], array → [Array]. A described value whose descriptor (numeric or
// symbolic) is known becomes a pointer to its composite type (*[Open],
// *[Accepted], *[Error], *[Source], *[SASLInit], ...); any other described
// value becomes *[Described].
//
// DecodeValue never panics. It rejects truncated input, unknown format codes,
// nesting deeper than 64 levels, and lengths or element counts that the
// remaining input cannot hold, before allocating for them. On error it returns
// src unchanged as rest.
func DecodeValue(src []byte) (v any, rest []byte, err error) {
	d := decoder{zeroWidthBudget: maxZeroWidthElements}
	v, n, err := d.value(src, 0)
	if err != nil {
		return nil, src, err
	}
	return v, src[n:], nil
}

// decoder carries the per-call allocation budget.
// A fresh decoder per DecodeValue call means the budget limits one
// frame's worth of input, not the lifetime of a connection.
type decoder struct {
	zeroWidthBudget int
}

// errTruncated reports input that ends before a value does; the counts
// help tell a truncated frame from a corrupt length field.
func errTruncated(what string, need, have int) error {
	return fmt.Errorf("wire: truncated %s: need %d bytes, have %d", what, need, have)
}

// value decodes one value at the start of b and reports how many bytes it used.
func (d *decoder) value(b []byte, depth int) (any, int, error) {
	if depth > maxDepth {
		return nil, 0, fmt.Errorf("wire: value nested deeper than %d levels", maxDepth)
	}
	if len(b) == 0 {
		return nil, 0, errTruncated("constructor", 1, 0)
	}
	if b[0] != codeDescribed {
		v, n, err := d.body(b[0], b[1:], depth)
		return v, n + 1, err
	}
	desc, n, err := d.descriptor(b[1:], depth)
	if err != nil {
		return nil, 0, err
	}
	// Described values nest (a descriptor may itself be described in the
	// type system), so each level counts towards maxDepth.
	val, m, err := d.value(b[1+n:], depth+1)
	if err != nil {
		return nil, 0, err
	}
	out, err := describe(desc, val)
	return out, 1 + n + m, err
}

// descriptor decodes a descriptor, which must be a ulong or a symbol.
func (d *decoder) descriptor(b []byte, depth int) (any, int, error) {
	desc, n, err := d.value(b, depth+1)
	if err != nil {
		return nil, 0, err
	}
	if err := checkDescriptor(desc); err != nil {
		return nil, 0, err
	}
	return desc, n, nil
}

// describe turns a described value with a known descriptor into its Go type.
func describe(desc, val any) (any, error) {
	var code uint64
	var known bool
	switch x := desc.(type) {
	case uint64:
		_, known = descriptorNames[x]
		code = x
	// Symbolic descriptors such as "amqp:open:list" are legal alternatives
	// to the numeric codes (part 1 section 1.5), so both are looked up.
	case Symbol:
		code, known = descriptorCodes[x]
	}
	if !known {
		return &Described{Descriptor: desc, Value: val}, nil
	}
	return decodeComposite(code, val)
}

// body decodes the data that follows format code at the start of b.
func (d *decoder) body(code byte, b []byte, depth int) (any, int, error) {
	if w, ok := fixedWidth(code); ok {
		if len(b) < w {
			return nil, 0, errTruncated(fmt.Sprintf("value of type %#x", code), w, len(b))
		}
		return fixedValue(code, b[:w]), w, nil
	}
	be := binary.BigEndian
	switch code {
	case codeVbin8, codeStr8, codeSym8:
		if len(b) < 1 {
			return nil, 0, errTruncated("length", 1, 0)
		}
		n := int(b[0])
		if len(b)-1 < n {
			return nil, 0, errTruncated("variable-width value", n, len(b)-1)
		}
		return variableValue(code, b[1:1+n]), 1 + n, nil
	// The length stays uint64 through the check, so a length near 4 GiB cannot
	// overflow int on a 32-bit platform before it is compared with the input.
	case codeVbin32, codeStr32, codeSym32:
		if len(b) < 4 {
			return nil, 0, errTruncated("length", 4, len(b))
		}
		n := uint64(be.Uint32(b))
		if uint64(len(b)-4) < n {
			return nil, 0, errTruncated("variable-width value", int(n), len(b)-4)
		}
		return variableValue(code, b[4:4+n]), 4 + int(n), nil
	case codeList8, codeMap8, codeArray8:
		return d.compound(code, b, 1, depth)
	case codeList32, codeMap32, codeArray32:
		return d.compound(code, b, 4, depth)
	}
	return nil, 0, fmt.Errorf("wire: unknown format code %#x", code)
}

// fixedValue converts the data of a fixed-width value; b has exactly the
// width fixedWidth reports.
func fixedValue(code byte, b []byte) any {
	be := binary.BigEndian
	switch code {
	case codeNull:
		return nil
	case codeTrue:
		return true
	case codeFalse:
		return false
	case codeUint0:
		return uint32(0)
	case codeUlong0:
		return uint64(0)
	case codeList0:
		return []any{}
	case codeUbyte:
		return b[0]
	case codeByte:
		return int8(b[0])
	case codeSmallUint:
		return uint32(b[0])
	case codeSmallUlong:
		return uint64(b[0])
	// smallint and smalllong are signed bytes, so 0xff must sign-extend to -1.
	case codeSmallInt:
		return int32(int8(b[0]))
	case codeSmallLong:
		return int64(int8(b[0]))
	// The specification defines only 0x00 and 0x01; any other byte reads as true
	// rather than failing the frame.
	case codeBool:
		return b[0] != 0
	case codeUshort:
		return be.Uint16(b)
	case codeShort:
		return int16(be.Uint16(b))
	case codeUint:
		return be.Uint32(b)
	case codeInt:
		return int32(be.Uint32(b))
	case codeFloat:
		return math.Float32frombits(be.Uint32(b))
	case codeChar:
		return Char(be.Uint32(b))
	case codeDecimal32:
		return Decimal32(b)
	case codeUlong:
		return be.Uint64(b)
	case codeLong:
		return int64(be.Uint64(b))
	case codeDouble:
		return math.Float64frombits(be.Uint64(b))
	// UTC so that decoded times print the same whatever the host's time zone.
	case codeTimestamp:
		return time.UnixMilli(int64(be.Uint64(b))).UTC()
	case codeDecimal64:
		return Decimal64(b)
	case codeDecimal128:
		return Decimal128(b)
	case codeUUID:
		return UUID(b)
	}
	return nil // unreachable: fixedWidth knows exactly these codes
}

// variableValue converts the data of a binary, string or symbol value.
// Binary is copied because b aliases the frame buffer, which callers
// may reuse; strings and symbols are copied by the conversion itself.
func variableValue(code byte, b []byte) any {
	switch code {
	case codeVbin8, codeVbin32:
		return append([]byte{}, b...)
	case codeStr8, codeStr32:
		return string(b)
	}
	return Symbol(b)
}

// compound decodes a list, map or array whose size and count fields are
// width bytes wide.
func (d *decoder) compound(code byte, b []byte, width, depth int) (any, int, error) {
	if len(b) < width {
		return nil, 0, errTruncated("size", width, len(b))
	}
	var size uint64
	if width == 1 {
		size = uint64(b[0])
	} else {
		size = uint64(binary.BigEndian.Uint32(b))
	}
	if size > uint64(len(b)-width) {
		return nil, 0, errTruncated("compound value", int(min(size, math.MaxInt32)), len(b)-width)
	}
	// The size field counts the count field too, so a size smaller than
	// the count's width is malformed rather than merely truncated.
	if size < uint64(width) {
		return nil, 0, fmt.Errorf("wire: compound size %d cannot hold its %d-byte count", size, width)
	}
	body := b[width : width+int(size)]
	var count uint64
	if width == 1 {
		count = uint64(body[0])
	} else {
		count = uint64(binary.BigEndian.Uint32(body))
	}
	body = body[width:]
	consumed := width + int(size)

	var (
		v   any
		n   int
		err error
	)
	switch code {
	case codeList8, codeList32:
		v, n, err = d.list(body, count, depth)
	case codeMap8, codeMap32:
		v, n, err = d.mapBody(body, count, depth)
	default:
		v, n, err = d.array(body, count, depth)
	}
	if err != nil {
		return nil, 0, err
	}
	if n != len(body) {
		return nil, 0, fmt.Errorf("wire: compound value of type %#x declares %d bytes but its elements use %d", code, len(body), n)
	}
	return v, consumed, nil
}

// list decodes count elements, each with its own constructor.
func (d *decoder) list(b []byte, count uint64, depth int) (any, int, error) {
	// Every element has a constructor, so it takes at least one byte.
	if count > uint64(len(b)) {
		return nil, 0, fmt.Errorf("wire: list of %d elements cannot fit in %d bytes", count, len(b))
	}
	items := make([]any, 0, count)
	off := 0
	for range count {
		v, n, err := d.value(b[off:], depth+1)
		if err != nil {
			return nil, 0, err
		}
		items = append(items, v)
		off += n
	}
	return items, off, nil
}

// mapBody decodes a map body; count is the number of keys plus values
// (part 1 section 1.6.23), so it must be even. Entries keep wire order
// and duplicate keys, which a Go map would lose.
func (d *decoder) mapBody(b []byte, count uint64, depth int) (any, int, error) {
	if count%2 != 0 {
		return nil, 0, fmt.Errorf("wire: map has an odd element count %d", count)
	}
	if count > uint64(len(b)) {
		return nil, 0, fmt.Errorf("wire: map of %d elements cannot fit in %d bytes", count, len(b))
	}
	m := &Map{Entries: make([]MapEntry, 0, count/2)}
	off := 0
	for range count / 2 {
		k, n, err := d.value(b[off:], depth+1)
		if err != nil {
			return nil, 0, err
		}
		off += n
		v, n, err := d.value(b[off:], depth+1)
		if err != nil {
			return nil, 0, err
		}
		off += n
		m.Entries = append(m.Entries, MapEntry{Key: k, Value: v})
	}
	return m, off, nil
}

// arrayCtor decodes the shared element constructor of an array.
func (d *decoder) arrayCtor(b []byte, depth int) (arrayCtor, int, error) {
	if depth > maxDepth {
		return arrayCtor{}, 0, fmt.Errorf("wire: value nested deeper than %d levels", maxDepth)
	}
	if len(b) == 0 {
		return arrayCtor{}, 0, errTruncated("array constructor", 1, 0)
	}
	if b[0] != codeDescribed {
		code := b[0]
		if _, ok := fixedWidth(code); !ok && !isVariableOrCompound(code) {
			return arrayCtor{}, 0, fmt.Errorf("wire: unknown format code %#x in array constructor", code)
		}
		return arrayCtor{code: code}, 1, nil
	}
	desc, n, err := d.descriptor(b[1:], depth)
	if err != nil {
		return arrayCtor{}, 0, err
	}
	inner, m, err := d.arrayCtor(b[1+n:], depth+1)
	if err != nil {
		return arrayCtor{}, 0, err
	}
	return arrayCtor{code: codeDescribed, descriptor: desc, inner: &inner}, 1 + n + m, nil
}

// isVariableOrCompound reports the format codes with a length prefix,
// the ones fixedWidth does not know.
func isVariableOrCompound(code byte) bool {
	switch code {
	case codeVbin8, codeStr8, codeSym8, codeVbin32, codeStr32, codeSym32,
		codeList8, codeMap8, codeArray8, codeList32, codeMap32, codeArray32:
		return true
	}
	return false
}

// elementWidth returns the smallest number of bytes one element under ctor can
// take: its fixed width, or 1 for variable and compound encodings (each has a
// length byte at least).
func elementWidth(c arrayCtor) int {
	for c.code == codeDescribed {
		c = *c.inner
	}
	if w, ok := fixedWidth(c.code); ok {
		return w
	}
	return 1
}

// array decodes an array body: one constructor shared by all count
// elements, then the elements' data without constructors.
func (d *decoder) array(b []byte, count uint64, depth int) (any, int, error) {
	ctor, off, err := d.arrayCtor(b, depth+1)
	if err != nil {
		return nil, 0, err
	}
	rest := uint64(len(b) - off)
	// Zero-width elements cost no input, so only the per-call budget stops
	// a few bytes from requesting millions of them.
	if w := uint64(elementWidth(ctor)); w == 0 {
		if count > uint64(d.zeroWidthBudget) {
			return nil, 0, fmt.Errorf("wire: too many zero-width array elements (%d)", count)
		}
		d.zeroWidthBudget -= int(count)
	} else if count > rest/w {
		return nil, 0, fmt.Errorf("wire: array of %d elements of at least %d bytes cannot fit in %d bytes", count, w, rest)
	}
	elems := make(Array, 0, count)
	for range count {
		v, n, err := d.element(ctor, b[off:], depth+1)
		if err != nil {
			return nil, 0, err
		}
		elems = append(elems, v)
		off += n
	}
	return elems, off, nil
}

func (d *decoder) element(c arrayCtor, b []byte, depth int) (any, int, error) {
	if depth > maxDepth {
		return nil, 0, fmt.Errorf("wire: value nested deeper than %d levels", maxDepth)
	}
	if c.code != codeDescribed {
		return d.body(c.code, b, depth)
	}
	v, n, err := d.element(*c.inner, b, depth+1)
	if err != nil {
		return nil, 0, err
	}
	out, err := describe(c.descriptor, v)
	return out, n, err
}
