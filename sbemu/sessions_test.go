package sbemu

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sbretry/retry/sbemu/internal/wire"
)

// TestGrantedSessionFilterEchoesTheClientsForm: the attach reply grants the
// session in the form the client asked in, described for the Go SDK and
// a plain string for the JavaScript SDK (which compares it with ===), for
// a named session and for the next available one alike.
func TestGrantedSessionFilterEchoesTheClientsForm(t *testing.T) {
	described := wire.Described{Descriptor: sessionFilterCode, Value: "s1"}
	source := func(v any) *wire.Source {
		f := &wire.Map{}
		f.Set(wire.Symbol(sessionFilterName), v)
		return &wire.Source{Filter: f}
	}
	tests := []struct {
		name  string
		asked *wire.Source
		want  any
	}{
		{"described id (Go SDK)", source(wire.Described{Descriptor: sessionFilterCode, Value: "s1"}), described},
		{"described next available (Go SDK)", source(&wire.Described{Descriptor: sessionFilterCode}), described},
		{"plain id (JavaScript SDK)", source("s1"), "s1"},
		{"plain next available (JavaScript SDK)", source(nil), "s1"},
		{"no source", nil, described},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, grantedSessionFilter(tc.asked, "s1"))
		})
	}
}
