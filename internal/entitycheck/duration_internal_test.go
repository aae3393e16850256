package entitycheck

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"PT1M", time.Minute}, {"PT30S", 30 * time.Second}, {"P1DT12H", 36 * time.Hour},
		{"PT0.5S", 500 * time.Millisecond}, {"P2W", 14 * 24 * time.Hour}, {"PT1H30M", 90 * time.Minute},
		{"P10675199DT2H48M5.4775807S", time.Duration(1<<63 - 1)},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := duration(&tc.in)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	for _, bad := range []string{"1M", "P", "PT", "P1M", "PT1D", "PTxS", "PT-1S"} {
		_, err := duration(&bad)
		assert.Error(t, err, bad)
	}
	d, err := duration(nil)
	assert.NoError(t, err)
	assert.Zero(t, d)
}

func FuzzDuration(f *testing.F) {
	for _, s := range []string{"PT1M", "P1DT12H", "PT0.5S", "P10675199DT2H48M5.4775807S", "PT"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := duration(&s)
		if err == nil && d < 0 {
			t.Fatalf("%q gave a negative duration %v", s, d)
		}
	})
}
