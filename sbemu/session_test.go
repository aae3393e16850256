package sbemu

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestWindowFrom(t *testing.T) {
	tests := []struct {
		name                        string
		window, peerCount, ourCount uint32
		want                        uint32
	}{
		{"fresh", 5000, 0, 0, 5000},
		{"peer behind by in-flight transfers", 5000, 10, 12, 4998},
		{"all used", 100, 0, 100, 0},
		{"stale flow clamps at zero", 10, 0, 100, 0},
		{"unlimited stays unlimited", math.MaxUint32, 7, 7, math.MaxUint32},
		{"wrapped counters", 100, math.MaxUint32 - 1, 3, 95},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, windowFrom(tc.window, tc.peerCount, tc.ourCount))
		})
	}
}
