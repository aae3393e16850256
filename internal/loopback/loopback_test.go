package loopback

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestAllowed(t *testing.T) {
	for _, tc := range []struct {
		host    string
		allowed []string
		want    bool
	}{
		{"localhost:8080", nil, true},
		{"LOCALHOST", nil, true},
		{"localhost.:8080", nil, true},
		{"ops.internal.", []string{"ops.internal"}, true},
		{"127.0.0.1:80", nil, true},
		{"127.1.2.3", nil, true},
		{"[::1]:8080", nil, true},
		{"::1", nil, true},
		{"attacker.example:8080", nil, false},
		{"localhost.attacker.example", nil, false},
		{"10.0.0.5:8080", nil, false},
		{"ops.internal:8080", []string{"OPS.internal"}, true},
		{"", nil, false},
	} {
		assert.Equal(t, tc.want, Allowed(tc.host, tc.allowed), "%q %v", tc.host, tc.allowed)
	}
}
