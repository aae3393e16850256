package broker

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestErrorsHavePrefix(t *testing.T) {
	for name, err := range map[string]error{
		"ErrLockLost":        ErrLockLost,
		"ErrNotFound":        ErrNotFound,
		"ErrMessageTooLarge": ErrMessageTooLarge,
		"ErrClosed":          ErrClosed,
		"ErrUnknownQueue":    ErrUnknownQueue,
		"ErrInvalidConfig":   ErrInvalidConfig,
		"ErrNotSupported":    ErrNotSupported,
	} {
		t.Run(name, func(t *testing.T) {
			assert.True(t, strings.HasPrefix(err.Error(), "broker: "), err.Error())
		})
	}
}
