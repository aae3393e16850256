package sessionmode

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParse(t *testing.T) {
	m, err := Parse("inplace")
	require.NoError(t, err)
	assert.Equal(t, InPlace, m)

	_, err = Parse("durable")
	require.ErrorIs(t, err, ErrNotAvailable, "known, refused until the library has it")
	assert.Contains(t, err.Error(), "no durable hold yet")

	_, err = Parse("in-place")
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrNotAvailable)
	assert.Contains(t, err.Error(), "unknown")
}
