package wire

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// roundTrip encodes v, decodes the result and checks nothing is left over.
func roundTrip(t *testing.T, v any) any {
	t.Helper()
	b, err := AppendValue(nil, v)
	require.NoError(t, err)
	got, rest, err := DecodeValue(b)
	require.NoError(t, err)
	require.Empty(t, rest)
	return got
}

func TestRoundTripPrimitives(t *testing.T) {
	long := strings.Repeat("é", 200) // 400 bytes: forces the 32-bit forms
	tests := []struct {
		name string
		v    any
	}{
		{name: "null", v: nil},
		{name: "true", v: true},
		{name: "false", v: false},
		{name: "ubyte max", v: uint8(math.MaxUint8)},
		{name: "ushort max", v: uint16(math.MaxUint16)},
		{name: "uint zero", v: uint32(0)},
		{name: "uint small", v: uint32(255)},
		{name: "uint max", v: uint32(math.MaxUint32)},
		{name: "ulong zero", v: uint64(0)},
		{name: "ulong small", v: uint64(1)},
		{name: "ulong max", v: uint64(math.MaxUint64)},
		{name: "byte min", v: int8(math.MinInt8)},
		{name: "byte max", v: int8(math.MaxInt8)},
		{name: "short min", v: int16(math.MinInt16)},
		{name: "short max", v: int16(math.MaxInt16)},
		{name: "int min", v: int32(math.MinInt32)},
		{name: "int max", v: int32(math.MaxInt32)},
		{name: "int small negative", v: int32(-128)},
		{name: "int just outside small", v: int32(128)},
		{name: "long min", v: int64(math.MinInt64)},
		{name: "long max", v: int64(math.MaxInt64)},
		{name: "long small", v: int64(127)},
		{name: "float", v: float32(-1.5)},
		{name: "float max", v: float32(math.MaxFloat32)},
		{name: "float smallest", v: float32(math.SmallestNonzeroFloat32)},
		{name: "double", v: math.Pi},
		{name: "double negative zero", v: math.Copysign(0, -1)},
		{name: "double inf", v: math.Inf(-1)},
		{name: "decimal32", v: Decimal32{1, 2, 3, 4}},
		{name: "decimal64", v: Decimal64{1, 2, 3, 4, 5, 6, 7, 8}},
		{name: "decimal128", v: Decimal128{15: 9}},
		{name: "char", v: Char('€')},
		{name: "char max", v: Char(0x10FFFF)},
		{name: "timestamp epoch", v: time.UnixMilli(0).UTC()},
		{name: "timestamp now", v: time.Date(2025, 6, 1, 12, 30, 45, 123_000_000, time.UTC)},
		{name: "timestamp before 1970", v: time.Date(1900, 1, 1, 0, 0, 0, 1_000_000, time.UTC)},
		{name: "timestamp far future", v: time.Date(9999, 12, 31, 23, 59, 59, 999_000_000, time.UTC)},
		{name: "uuid", v: UUID{0xde, 0xad, 0xbe, 0xef, 15: 0xff}},
		{name: "binary empty", v: []byte{}},
		{name: "binary", v: []byte{0, 1, 2, 255}},
		{name: "binary large", v: bytes.Repeat([]byte{7}, 70000)},
		{name: "string empty", v: ""},
		{name: "string utf8", v: "héllo wörld"},
		{name: "string 255", v: strings.Repeat("a", 255)},
		{name: "string 256", v: strings.Repeat("a", 256)},
		{name: "string large", v: long},
		{name: "symbol empty", v: Symbol("")},
		{name: "symbol", v: Symbol("amqp:accepted:list")},
		{name: "symbol large", v: Symbol(strings.Repeat("s", 300))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.v, roundTrip(t, tc.v))
		})
	}
}

func TestRoundTripNaN(t *testing.T) {
	got := roundTrip(t, math.NaN())
	f, ok := got.(float64)
	require.True(t, ok)
	assert.True(t, math.IsNaN(f))
}

func TestRoundTripTimestampTruncatesToMillis(t *testing.T) {
	in := time.Date(2025, 1, 2, 3, 4, 5, 678_901_234, time.FixedZone("X", 3600))
	got := roundTrip(t, in)
	assert.Equal(t, time.Date(2025, 1, 2, 2, 4, 5, 678_000_000, time.UTC), got)
}

func TestRoundTripCompound(t *testing.T) {
	big := make([]any, 300)
	for i := range big {
		big[i] = int32(i)
	}
	bigMap := &Map{}
	for i := range 200 {
		bigMap.Set(int64(i), strings.Repeat("v", i))
	}
	tests := []struct {
		name string
		v    any
		want any // nil: same as v
	}{
		{name: "empty list", v: []any{}},
		{name: "list of mixed", v: []any{nil, true, uint32(1), "two", Symbol("three"), []byte{4}, time.UnixMilli(5).UTC()}},
		{name: "nested lists", v: []any{[]any{[]any{}}, []any{int64(1)}}},
		{name: "list32", v: big},
		{name: "empty map", v: &Map{Entries: []MapEntry{}}},
		{name: "map keeps order and key types", v: &Map{Entries: []MapEntry{
			{Key: Symbol("z"), Value: int32(1)},
			{Key: "a", Value: &Map{Entries: []MapEntry{{Key: uint64(1), Value: []any{}}}}},
			{Key: []byte{1}, Value: nil},
			{Key: []any{int8(1)}, Value: Array{int32(1)}},
		}}},
		{name: "map32", v: bigMap},
		{name: "array of int", v: Array{int32(1), int32(-1000), int32(0)}},
		{name: "array of long", v: Array{int64(math.MinInt64), int64(0)}},
		{name: "array of uint", v: Array{uint32(1), uint32(math.MaxUint32)}},
		{name: "array of ulong", v: Array{uint64(0), uint64(math.MaxUint64)}},
		{name: "array of bool", v: Array{true, false}},
		{name: "array of ubyte", v: Array{uint8(1), uint8(2)}},
		{name: "array of ushort", v: Array{uint16(1)}},
		{name: "array of byte", v: Array{int8(-1)}},
		{name: "array of short", v: Array{int16(-1)}},
		{name: "array of float", v: Array{float32(1.5)}},
		{name: "array of double", v: Array{2.5, -0.5}},
		{name: "array of decimals", v: Array{Decimal64{1}, Decimal64{2}}},
		{name: "array of char", v: Array{Char('a'), Char('b')}},
		{name: "array of timestamp", v: Array{time.UnixMilli(-5).UTC(), time.UnixMilli(1e12).UTC()}},
		{name: "array of uuid", v: Array{UUID{1}, UUID{2}}},
		{name: "array of binary widened", v: Array{[]byte{1}, bytes.Repeat([]byte{2}, 300)}},
		{name: "array of string", v: Array{"a", strings.Repeat("b", 256)}},
		{name: "array of symbol", v: Array{Symbol("a"), Symbol("b")}},
		{name: "array of null", v: Array{nil, nil}},
		{name: "array of list", v: Array{[]any{int32(1)}, []any{}}},
		{name: "array of map", v: Array{&Map{Entries: []MapEntry{{Key: "a", Value: uint8(1)}}}, &Map{Entries: []MapEntry{}}}},
		{name: "array of array", v: Array{Array{int64(1)}, Array{int64(2), int64(3)}}},
		{name: "array of described", v: Array{&Described{Descriptor: Symbol("d"), Value: "x"}, &Described{Descriptor: Symbol("d"), Value: "yy"}}},
		{name: "array of described described", v: Array{&Described{Descriptor: uint64(1), Value: &Described{Descriptor: uint64(2), Value: int64(5)}}}},
		{name: "array of composite", v: Array{&Accepted{}, &Accepted{}}},
		{name: "array of rejected", v: Array{&Rejected{}, &Rejected{Error: &Error{Condition: "x"}}}},
		{name: "typed int64 slice", v: []int64{1, 2, 1 << 40}, want: Array{int64(1), int64(2), int64(1 << 40)}},
		{name: "typed empty uuid slice", v: []UUID{}, want: Array{}},
		{name: "typed time slice", v: []time.Time{time.UnixMilli(1).UTC()}, want: Array{time.UnixMilli(1).UTC()}},
		{name: "typed string slice", v: []string{"a"}, want: Array{"a"}},
		{name: "typed binary slice", v: [][]byte{{1}}, want: Array{[]byte{1}}},
		{name: "typed int slice", v: []int{-1}, want: Array{int64(-1)}},
		{name: "typed uint slices", v: []any{[]uint16{1}, []uint32{2}, []uint64{3}}, want: []any{Array{uint16(1)}, Array{uint32(2)}, Array{uint64(3)}}},
		{name: "typed signed slices", v: []any{[]int8{1}, []int16{2}, []int32{3}}, want: []any{Array{int8(1)}, Array{int16(2)}, Array{int32(3)}}},
		{name: "typed float slices", v: []any{[]float32{1}, []float64{2}, []bool{true}, []Char{'c'}}, want: []any{Array{float32(1)}, Array{float64(2)}, Array{true}, Array{Char('c')}}},
		{name: "empty array", v: Array{}},
		{name: "described symbol", v: &Described{Descriptor: Symbol("com.example:x"), Value: []any{int32(1)}}},
		{name: "described numeric unknown", v: &Described{Descriptor: uint64(0x0000013700000001), Value: "f"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			if want == nil {
				want = tc.v
			}
			got := roundTrip(t, tc.v)
			assert.Truef(t, Equal(want, got), "got %#v\nwant %#v", got, want)
		})
	}
}

func TestDecodeValueRest(t *testing.T) {
	v, rest, err := DecodeValue([]byte{0x52, 0x05, 0xAA, 0xBB})
	require.NoError(t, err)
	assert.Equal(t, uint32(5), v)
	assert.Equal(t, []byte{0xAA, 0xBB}, rest)
}

func TestDecodeValueBinaryDoesNotAlias(t *testing.T) {
	in := []byte{0xa0, 0x01, 0x07}
	v, _, err := DecodeValue(in)
	require.NoError(t, err)
	in[2] = 0
	assert.Equal(t, []byte{7}, v)
}

// TestDecodeValueAllConstructors decodes each constructor from hand-written
// bytes, including the ones the encoder never picks (list32 for a short list,
// boolean 0x56, zero-width array elements).
func TestDecodeValueAllConstructors(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		want any
	}{
		{name: "boolean true", in: []byte{0x56, 0x01}, want: true},
		{name: "boolean false", in: []byte{0x56, 0x00}, want: false},
		{name: "uint long form", in: []byte{0x70, 0, 0, 0, 1}, want: uint32(1)},
		{name: "ulong long form", in: []byte{0x80, 0, 0, 0, 0, 0, 0, 0, 1}, want: uint64(1)},
		{name: "int long form", in: []byte{0x71, 0xff, 0xff, 0xff, 0xff}, want: int32(-1)},
		{name: "long long form", in: []byte{0x81, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe}, want: int64(-2)},
		{name: "str32 short", in: []byte{0xb1, 0, 0, 0, 1, 'a'}, want: "a"},
		{name: "sym32 short", in: []byte{0xb3, 0, 0, 0, 1, 'a'}, want: Symbol("a")},
		{name: "vbin32 short", in: []byte{0xb0, 0, 0, 0, 1, 9}, want: []byte{9}},
		{name: "list32 short", in: []byte{0xd0, 0, 0, 0, 5, 0, 0, 0, 1, 0x40}, want: []any{nil}},
		{name: "map32 short", in: []byte{0xd1, 0, 0, 0, 6, 0, 0, 0, 2, 0x40, 0x40}, want: &Map{Entries: []MapEntry{{}}}},
		{name: "array32 short", in: []byte{0xf0, 0, 0, 0, 6, 0, 0, 0, 1, 0x50, 3}, want: Array{uint8(3)}},
		{name: "array of uint0", in: []byte{0xe0, 0x02, 0x03, 0x43}, want: Array{uint32(0), uint32(0), uint32(0)}},
		{name: "array of true", in: []byte{0xe0, 0x02, 0x02, 0x41}, want: Array{true, true}},
		{name: "array of list0", in: []byte{0xe0, 0x02, 0x01, 0x45}, want: Array{[]any{}}},
		{name: "array of list8", in: []byte{0xe0, 0x06, 0x01, 0xc0, 0x03, 0x01, 0x50, 0x01}, want: Array{[]any{uint8(1)}}},
		{name: "array of map8", in: []byte{0xe0, 0x04, 0x01, 0xc1, 0x01, 0x00}, want: Array{&Map{Entries: []MapEntry{}}}},
		{name: "array of array8", in: []byte{0xe0, 0x06, 0x01, 0xe0, 0x03, 0x01, 0x50, 0x07}, want: Array{Array{uint8(7)}}},
		{name: "array of accepted", in: []byte{0xe0, 0x05, 0x02, 0x00, 0x53, 0x24, 0x45}, want: Array{&Accepted{}, &Accepted{}}},
		{name: "symbolic descriptor", in: append([]byte{0x00, 0xa3, 18}, append([]byte("amqp:accepted:list"), 0x45)...), want: &Accepted{}},
		{name: "ulong descriptor long form", in: []byte{0x00, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x24, 0x45}, want: &Accepted{}},
		{name: "composite with extra fields", in: []byte{0x00, 0x53, 0x24, 0xc0, 0x03, 0x02, 0x40, 0x40}, want: &Accepted{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, rest, err := DecodeValue(tc.in)
			require.NoError(t, err)
			assert.Empty(t, rest)
			assert.Truef(t, Equal(tc.want, got), "got %#v, want %#v", got, tc.want)
		})
	}
}

func TestDecodeValueMalformed(t *testing.T) {
	deep := bytes.Repeat([]byte{0xc0, 0x01, 0x01}, 100) // 100 nested list8 headers
	tests := []struct {
		name string
		in   []byte
	}{
		{name: "empty", in: nil},
		{name: "unknown code", in: []byte{0x99}},
		{name: "reserved code", in: []byte{0x01}},
		{name: "truncated uint", in: []byte{0x70, 0, 0}},
		{name: "truncated uuid", in: []byte{0x98, 1}},
		{name: "truncated str8", in: []byte{0xa1, 0x05, 'a'}},
		{name: "truncated str32 length", in: []byte{0xb1, 0, 0}},
		{name: "huge str32", in: []byte{0xb1, 0xff, 0xff, 0xff, 0xff, 'a'}},
		{name: "list size beyond input", in: []byte{0xc0, 0x05, 0x01, 0x40}},
		{name: "list count beyond size", in: []byte{0xc0, 0x02, 0x05, 0x40}},
		{name: "list size zero", in: []byte{0xc0, 0x00}},
		{name: "list32 huge count", in: []byte{0xd0, 0, 0, 0, 5, 0xff, 0xff, 0xff, 0xff, 0x40}},
		{name: "list elements shorter than size", in: []byte{0xc0, 0x03, 0x01, 0x40, 0x40}},
		{name: "list elements longer than size", in: []byte{0xc0, 0x02, 0x01, 0x52, 0x01}},
		{name: "map odd count", in: []byte{0xc1, 0x02, 0x01, 0x40}},
		{name: "array without constructor", in: []byte{0xe0, 0x01, 0x00}},
		{name: "array unknown element code", in: []byte{0xe0, 0x02, 0x01, 0x99}},
		{name: "array count beyond bytes", in: []byte{0xe0, 0x03, 0x05, 0x50, 0x01}},
		{name: "array32 of null huge count", in: []byte{0xf0, 0, 0, 0, 5, 0xff, 0xff, 0xff, 0xff, 0x40}},
		{name: "described without value", in: []byte{0x00, 0x53, 0x24}},
		{name: "descriptor of wrong type", in: []byte{0x00, 0xa1, 0x01, 'x', 0x40}},
		{name: "known descriptor, not a list", in: []byte{0x00, 0x53, 0x24, 0x40}},
		{name: "composite field of wrong type", in: []byte{0x00, 0x53, 0x1d, 0xc0, 0x03, 0x01, 0xa1, 0x00}},
		{name: "nesting too deep", in: deep},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, rest, err := DecodeValue(tc.in)
			assert.Error(t, err)
			assert.Nil(t, v)
			assert.Equal(t, tc.in, rest)
		})
	}
}

// TestDecodeValueZeroWidthBudget checks that arrays of elements without data
// cannot be used to allocate far more than the input size.
func TestDecodeValueZeroWidthBudget(t *testing.T) {
	array := func(count uint32) []byte {
		return []byte{0xf0, 0, 0, 0, 5, byte(count >> 24), byte(count >> 16), byte(count >> 8), byte(count), 0x40}
	}
	v, _, err := DecodeValue(array(maxZeroWidthElements))
	require.NoError(t, err)
	assert.Len(t, v, maxZeroWidthElements)

	_, _, err = DecodeValue(array(maxZeroWidthElements + 1))
	assert.Error(t, err)

	// The budget is shared by the whole value, not per array.
	two := append([]byte{0xd0, 0, 0, 0, 4 + 20, 0, 0, 0, 2}, append(array(maxZeroWidthElements), array(1)...)...)
	_, _, err = DecodeValue(two)
	assert.Error(t, err)
}
