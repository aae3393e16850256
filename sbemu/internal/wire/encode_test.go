package wire

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// goldenCases are encodings worked out by hand from the byte layouts in part 1
// of the specification. They also seed the fuzz corpora.
var goldenCases = []struct {
	name string
	v    any
	want []byte
}{
	{name: "null", v: nil, want: []byte{0x40}},
	{name: "true", v: true, want: []byte{0x41}},
	{name: "false", v: false, want: []byte{0x42}},
	{name: "uint 0 is uint0", v: uint32(0), want: []byte{0x43}},
	{name: "uint 5 is smalluint", v: uint32(5), want: []byte{0x52, 0x05}},
	{name: "uint 256", v: uint32(256), want: []byte{0x70, 0x00, 0x00, 0x01, 0x00}},
	{name: "ulong 0 is ulong0", v: uint64(0), want: []byte{0x44}},
	{name: "ulong 255 is smallulong", v: uint64(255), want: []byte{0x53, 0xff}},
	{name: "ulong max", v: uint64(math.MaxUint64), want: []byte{0x80, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
	{name: "ubyte", v: uint8(7), want: []byte{0x50, 0x07}},
	{name: "ushort", v: uint16(0x1234), want: []byte{0x60, 0x12, 0x34}},
	{name: "byte -1", v: int8(-1), want: []byte{0x51, 0xff}},
	{name: "short -2", v: int16(-2), want: []byte{0x61, 0xff, 0xfe}},
	{name: "int -1 is smallint", v: int32(-1), want: []byte{0x54, 0xff}},
	{name: "int 200", v: int32(200), want: []byte{0x71, 0x00, 0x00, 0x00, 0xc8}},
	{name: "long -128 is smalllong", v: int64(-128), want: []byte{0x55, 0x80}},
	{name: "long 128", v: int64(128), want: []byte{0x81, 0, 0, 0, 0, 0, 0, 0, 0x80}},
	{name: "float 1.0", v: float32(1), want: []byte{0x72, 0x3f, 0x80, 0x00, 0x00}},
	{name: "double 1.0", v: float64(1), want: []byte{0x82, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0}},
	{name: "char A", v: Char('A'), want: []byte{0x73, 0, 0, 0, 0x41}},
	{name: "timestamp 1ms", v: time.UnixMilli(1).UTC(), want: []byte{0x83, 0, 0, 0, 0, 0, 0, 0, 1}},
	{name: "timestamp -1ms", v: time.UnixMilli(-1).UTC(), want: []byte{0x83, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
	{name: "uuid", v: UUID{15: 1}, want: append([]byte{0x98}, UUID{15: 1}.bytes()...)},
	{name: "vbin8", v: []byte{1, 2}, want: []byte{0xa0, 0x02, 0x01, 0x02}},
	{name: "str8", v: "hi", want: []byte{0xa1, 0x02, 'h', 'i'}},
	{name: "sym8", v: Symbol("ok"), want: []byte{0xa3, 0x02, 'o', 'k'}},
	{name: "list0", v: []any{}, want: []byte{0x45}},
	{name: "list8", v: []any{true, uint32(0)}, want: []byte{0xc0, 0x03, 0x02, 0x41, 0x43}},
	{name: "map8", v: &Map{Entries: []MapEntry{{Key: Symbol("a"), Value: int32(1)}}}, want: []byte{0xc1, 0x06, 0x02, 0xa3, 0x01, 'a', 0x54, 0x01}},
	{name: "empty map", v: &Map{}, want: []byte{0xc1, 0x01, 0x00}},
	{name: "array8 of smalllong", v: Array{int64(1), int64(2)}, want: []byte{0xe0, 0x04, 0x02, 0x55, 0x01, 0x02}},
	{name: "array widens to long", v: []int64{1, 1000}, want: []byte{0xe0, 0x12, 0x02, 0x81, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0x03, 0xe8}},
	{name: "empty array of long", v: []int64{}, want: []byte{0xe0, 0x02, 0x00, 0x81}},
	{name: "array of symbol", v: []Symbol{"a"}, want: []byte{0xe0, 0x04, 0x01, 0xa3, 0x01, 'a'}},
	{name: "array of described", v: Array{&Described{Descriptor: uint64(9), Value: uint32(1)}}, want: []byte{0xe0, 0x06, 0x01, 0x00, 0x53, 0x09, 0x52, 0x01}},
	{name: "described", v: &Described{Descriptor: Symbol("x"), Value: "v"}, want: []byte{0x00, 0xa3, 0x01, 'x', 0xa1, 0x01, 'v'}},
	{name: "accepted", v: &Accepted{}, want: []byte{0x00, 0x53, 0x24, 0x45}},
	{name: "released", v: &Released{}, want: []byte{0x00, 0x53, 0x26, 0x45}},
	{name: "rejected with error", v: &Rejected{Error: &Error{Condition: "c"}}, want: []byte{0x00, 0x53, 0x25, 0xc0, 0x0a, 0x01, 0x00, 0x53, 0x1d, 0xc0, 0x04, 0x01, 0xa3, 0x01, 'c'}},
	{name: "close", v: &Close{}, want: []byte{0x00, 0x53, 0x18, 0x45}},
	{name: "flow", v: &Flow{IncomingWindow: 5, NextOutgoingID: 0, OutgoingWindow: 1},
		want: []byte{0x00, 0x53, 0x13, 0xc0, 0x07, 0x04, 0x40, 0x52, 0x05, 0x43, 0x52, 0x01}},
	{name: "sasl outcome ok", v: &SASLOutcome{Code: SASLCodeOK}, want: []byte{0x00, 0x53, 0x44, 0xc0, 0x03, 0x01, 0x50, 0x00}},
}

func (u UUID) bytes() []byte { return u[:] }

func TestAppendValueGolden(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := AppendValue(nil, tc.v)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)

			back, rest, err := DecodeValue(got)
			require.NoError(t, err)
			assert.Empty(t, rest)
			assert.Truef(t, Equal(normalizeForDecode(tc.v), back), "decoded %#v, want %#v", back, tc.v)
		})
	}
}

// normalizeForDecode maps encode-only conveniences to what decoding returns.
func normalizeForDecode(v any) any {
	if elems, _, ok := asArray(v); ok {
		return Array(elems)
	}
	return v
}

func TestAppendValueLongForms(t *testing.T) {
	long := strings.Repeat("x", 300)
	tests := []struct {
		name     string
		v        any
		wantCode byte
	}{
		{name: "str32", v: long, wantCode: 0xb1},
		{name: "sym32", v: Symbol(long), wantCode: 0xb3},
		{name: "vbin32", v: []byte(long), wantCode: 0xb0},
		{name: "list32 by size", v: []any{long}, wantCode: 0xd0},
		{name: "list32 by count", v: make([]any, 300), wantCode: 0xd0},
		{name: "map32", v: &Map{Entries: []MapEntry{{Key: "k", Value: long}}}, wantCode: 0xd1},
		{name: "array32", v: []string{long}, wantCode: 0xf0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := AppendValue(nil, tc.v)
			require.NoError(t, err)
			require.NotEmpty(t, got)
			assert.Equal(t, tc.wantCode, got[0])
		})
	}
}

func TestAppendValueAppendsToDst(t *testing.T) {
	got, err := AppendValue([]byte{0xAA}, uint32(5))
	require.NoError(t, err)
	assert.Equal(t, []byte{0xAA, 0x52, 0x05}, got)
}

func TestAppendValueErrors(t *testing.T) {
	cyclic := &Map{}
	cyclic.Set("self", cyclic)
	tests := []struct {
		name string
		v    any
	}{
		{name: "unsupported type", v: struct{}{}},
		{name: "unsupported nested", v: []any{make(chan int)}},
		{name: "mixed array", v: Array{int64(1), "x"}},
		{name: "array with mixed descriptors", v: Array{&Described{Descriptor: uint64(1), Value: 1}, &Described{Descriptor: uint64(2), Value: 1}}},
		{name: "bad descriptor", v: &Described{Descriptor: "string", Value: nil}},
		{name: "cyclic map", v: cyclic},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := AppendValue(nil, tc.v)
			assert.Error(t, err)
		})
	}
}

func TestAppendValueConveniences(t *testing.T) {
	tests := []struct {
		name string
		v    any
		want any
	}{
		{name: "int is long", v: 7, want: int64(7)},
		{name: "uint is ulong", v: uint(7), want: uint64(7)},
		{name: "role is boolean", v: RoleReceiver, want: true},
		{name: "map value", v: Map{Entries: []MapEntry{{Key: "a", Value: nil}}}, want: &Map{Entries: []MapEntry{{Key: "a", Value: nil}}}},
		{name: "described value", v: Described{Descriptor: uint64(1), Value: nil}, want: &Described{Descriptor: uint64(1), Value: nil}},
		{name: "Go map sorted", v: map[string]any{"b": int32(2), "a": int32(1)},
			want: &Map{Entries: []MapEntry{{Key: "a", Value: int32(1)}, {Key: "b", Value: int32(2)}}}},
		{name: "Go symbol map sorted", v: map[Symbol]any{"b": nil, "a": nil},
			want: &Map{Entries: []MapEntry{{Key: Symbol("a")}, {Key: Symbol("b")}}}},
		{name: "nil pointer is null", v: (*Open)(nil), want: nil},
		{name: "composite by value", v: Accepted{}, want: &Accepted{}},
		{name: "typed nil map", v: (*Map)(nil), want: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := AppendValue(nil, tc.v)
			require.NoError(t, err)
			got, _, err := DecodeValue(b)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}
