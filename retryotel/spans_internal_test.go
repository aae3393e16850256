package retryotel

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

func TestStatusTextRedactsAndBounds(t *testing.T) {
	err := errors.New("connect: Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=app;SharedAccessKey=c2VjcmV0c2VjcmV0")
	assert.NotContains(t, statusText(err), "c2VjcmV0c2VjcmV0", "a key in an error never reaches the tracing backend")

	long := statusText(errors.New(strings.Repeat("é", 2*statusLimit)))
	assert.LessOrEqual(t, len(long), statusLimit+len("…"))
	assert.True(t, utf8.ValidString(long), "cut on a rune boundary")
}
