package sessionmode

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParse(t *testing.T) {
	for _, name := range []string{"inplace", "durable"} {
		m, err := Parse(name)
		require.NoError(t, err)
		assert.Equal(t, Mode(name), m)
	}
	_, err := Parse("in-place")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "unknown (want inplace or durable)")
}
