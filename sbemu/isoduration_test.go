package sbemu

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseISODuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"PT1M", time.Minute},
		{"PT20S", 20 * time.Second},
		{"PT1H", time.Hour},
		{"P14D", 14 * 24 * time.Hour},
		{"P1W", 7 * 24 * time.Hour},
		{"P1DT12H30M5S", 36*time.Hour + 30*time.Minute + 5*time.Second},
		{"PT0.5S", 500 * time.Millisecond},
		{"PT1,5S", 1500 * time.Millisecond},
		{"pt5m", 5 * time.Minute},
	}
	for _, tc := range tests {
		got, err := parseISODuration(tc.in)
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
	}
}

func TestParseISODurationErrors(t *testing.T) {
	tests := []struct{ in, wantText string }{
		{"1M", `must start with "P"`},
		{"P", "no value after P"},
		{"PT", "no value after P"},
		{"P1Y", "years and months"},
		{"P1M", "years and months"},
		{"PT1X", "unknown unit X"},
		{"PT1M1M", "appears twice"},
		{"PT", "no value"},
		{"P1DT", "nothing after T"},
		{"PTM", "expected a number"},
		{"PT1.2.3S", "bad number"},
		{"P999999999999D", "exceeds about 292 years"},
		{"P10675199D", "exceeds about 292 years"}, // .NET's TimeSpan.MaxValue
		{"00:01:00", `must start with "P"`},
	}
	for _, tc := range tests {
		_, err := parseISODuration(tc.in)
		require.Error(t, err, tc.in)
		assert.Contains(t, err.Error(), tc.wantText, tc.in)
	}
}

// FuzzParseISODuration checks that no input panics and that every accepted
// duration is non-negative.
func FuzzParseISODuration(f *testing.F) {
	for _, s := range []string{"PT1M", "P1DT2H", "PT0.5S", "P1Y", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if d, err := parseISODuration(s); err == nil && d < 0 {
			t.Fatalf("%q gave negative %v", s, d)
		}
	})
}
