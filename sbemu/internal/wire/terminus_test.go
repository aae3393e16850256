package wire

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTerminusRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		v    any
	}{
		{name: "source empty", v: &Source{}},
		{name: "source address", v: &Source{Address: "q/$DeadLetterQueue"}},
		{name: "source default outcome", v: &Source{DefaultOutcome: &Released{}, Outcomes: []Symbol{"amqp:released:list"}}},
		{name: "target empty", v: &Target{}},
		{name: "target cbs reply", v: &Target{Address: "$cbs$$cbs-reply-to-1234", Capabilities: []Symbol{"x"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := roundTrip(t, tc.v)
			assert.Truef(t, Equal(tc.v, got), "got %#v, want %#v", got, tc.v)
		})
	}
}

func TestTerminusSymbolAddress(t *testing.T) {
	// target with its address sent as a symbol rather than a string.
	got, _, err := DecodeValue([]byte{0x00, 0x53, 0x29, 0xc0, 0x04, 0x01, 0xa3, 0x01, 'q'})
	require.NoError(t, err)
	assert.Equal(t, &Target{Address: "q"}, got)
}
