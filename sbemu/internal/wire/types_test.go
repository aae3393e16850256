package wire

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMapGetSet(t *testing.T) {
	var m Map
	m.Set(Symbol("a"), int32(1))
	m.Set("a", int32(2))
	m.Set([]byte{1, 2}, "bytes")
	m.Set(Symbol("a"), int32(3)) // replaces in place

	require.Equal(t, 3, m.Len())
	assert.Equal(t, Symbol("a"), m.Entries[0].Key, "replacement keeps order")

	tests := []struct {
		name string
		key  any
		want any
		ok   bool
	}{
		{name: "symbol key", key: Symbol("a"), want: int32(3), ok: true},
		{name: "string key differs from symbol", key: "a", want: int32(2), ok: true},
		{name: "binary key by value", key: []byte{1, 2}, want: "bytes", ok: true},
		{name: "missing", key: Symbol("b"), ok: false},
		{name: "same text other type", key: []byte("a"), ok: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := m.Get(tc.key)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestMapNil(t *testing.T) {
	var m *Map
	assert.Equal(t, 0, m.Len())
	v, ok := m.Get("x")
	assert.False(t, ok)
	assert.Nil(t, v)
}

func TestEqual(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name string
		a, b any
		want bool
	}{
		{name: "nil", a: nil, b: nil, want: true},
		{name: "nil vs value", a: nil, b: int32(0), want: false},
		{name: "different int types", a: int32(1), b: int64(1), want: false},
		{name: "NaN equals itself", a: nan, b: nan, want: true},
		{name: "zero vs negative zero", a: 0.0, b: math.Copysign(0, -1), want: false},
		{name: "nil slice vs empty", a: []any(nil), b: []any{}, want: true},
		{name: "pointers by value", a: &Map{Entries: []MapEntry{{Key: "k", Value: 1}}}, b: &Map{Entries: []MapEntry{{Key: "k", Value: 1}}}, want: true},
		{name: "nested list", a: []any{[]any{Symbol("x")}}, b: []any{[]any{"x"}}, want: false},
		{name: "composite", a: &Accepted{}, b: &Accepted{}, want: true},
		{name: "composite differs", a: &Error{Condition: "a"}, b: &Error{Condition: "b"}, want: false},
		{name: "Go maps", a: map[string]any{"a": 1}, b: map[string]any{"a": 1}, want: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, Equal(tc.a, tc.b))
		})
	}
}

func TestUUIDString(t *testing.T) {
	u := UUID{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef}
	assert.Equal(t, "01234567-89ab-cdef-0123-456789abcdef", u.String())
}
