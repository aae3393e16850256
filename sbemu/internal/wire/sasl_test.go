package wire

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var saslCases = []struct {
	name string
	v    any
}{
	{name: "mechanisms", v: &SASLMechanisms{Mechanisms: []Symbol{"ANONYMOUS"}}},
	{name: "mechanisms several", v: &SASLMechanisms{Mechanisms: []Symbol{"ANONYMOUS", "PLAIN", "EXTERNAL"}}},
	{name: "init anonymous", v: &SASLInit{Mechanism: "ANONYMOUS"}},
	{name: "init full", v: &SASLInit{Mechanism: "PLAIN", InitialResponse: []byte("\x00user\x00pass"), Hostname: "localhost"}},
	{name: "challenge", v: &SASLChallenge{Challenge: []byte("c")}},
	{name: "response", v: &SASLResponse{Response: []byte("r")}},
	{name: "outcome ok", v: &SASLOutcome{Code: SASLCodeOK}},
	{name: "outcome auth with data", v: &SASLOutcome{Code: SASLCodeAuth, AdditionalData: []byte{1}}},
}

func TestSASLRoundTrip(t *testing.T) {
	for _, tc := range saslCases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.v, roundTrip(t, tc.v))
		})
	}
}

func TestSASLMechanismsMandatoryWhenEmpty(t *testing.T) {
	b, err := AppendValue(nil, &SASLMechanisms{})
	require.NoError(t, err)
	// The mandatory field is sent as an empty array of symbols, not omitted.
	assert.Equal(t, []byte{0x00, 0x53, 0x40, 0xc0, 0x05, 0x01, 0xe0, 0x02, 0x00, 0xa3}, b)
}
