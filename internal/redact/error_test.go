package redact

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWrap(t *testing.T) {
	base := errors.New("bad SharedAccessKey=hunter2: refused")
	err := Wrap(fmt.Errorf("connect: %w", base))
	assert.Equal(t, "connect: bad SharedAccessKey=REDACTED: refused", err.Error())
	assert.ErrorIs(t, err, base, "errors.Is sees the original")
	assert.Same(t, err, Wrap(err), "wrapping twice adds nothing")
	assert.NoError(t, Wrap(nil))
}

func TestWrapKeepsTypes(t *testing.T) {
	pathErr := &fs.PathError{Op: "open", Path: "/etc/sb?sig=abc", Err: fs.ErrPermission}
	err := Wrap(pathErr)
	assert.Equal(t, "open /etc/sb?sig=REDACTED: permission denied", err.Error())
	var got *fs.PathError
	require.ErrorAs(t, err, &got, "errors.As sees the original")
	assert.Equal(t, "/etc/sb?sig=abc", got.Path, "the original keeps its text")
	assert.ErrorIs(t, err, fs.ErrPermission)
}
