package retry_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
)

func TestFibonacciDefaultSchedule(t *testing.T) {
	want := []time.Duration{10, 10, 20, 30, 50, 80, 130, 210, 340, 550}
	for i, w := range want {
		assert.Equal(t, w*time.Second, retry.Fibonacci{}.Delay(i+1), "attempt %d", i+1)
	}
	week := 604800 * time.Second
	for _, n := range []int{29, 50, 92, 93, 94, 1000, math.MaxInt} {
		assert.Equal(t, week, retry.Fibonacci{}.Delay(n), "attempt %d", n)
	}
}

func TestBackoffBoundsAndMonotone(t *testing.T) {
	cases := []struct {
		name         string
		backoff      retry.Backoff
		floor, limit time.Duration
	}{
		{"fibonacci default", retry.Fibonacci{}, 10 * time.Second, retry.DefaultCap},
		{"fibonacci ms base", retry.Fibonacci{Base: time.Millisecond, Cap: time.Hour}, time.Millisecond, time.Hour},
		{"fibonacci floor above base", retry.Fibonacci{Base: time.Second, Floor: 5 * time.Second, Cap: time.Minute}, 5 * time.Second, time.Minute},
		{"fibonacci 1ns base", retry.Fibonacci{Base: 1, Cap: math.MaxInt64}, 1, math.MaxInt64},
		{"exponential default", retry.Exponential{}, 10 * time.Second, retry.DefaultCap},
		{"exponential factor 3", retry.Exponential{Base: time.Second, Factor: 3, Floor: 2 * time.Second, Cap: time.Hour}, 2 * time.Second, time.Hour},
		{"exponential factor 1", retry.Exponential{Base: time.Second, Factor: 1, Cap: time.Second}, time.Second, time.Second},
		{"exponential huge cap", retry.Exponential{Base: 1, Factor: 1.5, Cap: math.MaxInt64}, 1, math.MaxInt64},
		{"constant", retry.Constant{Interval: 3 * time.Second}, 3 * time.Second, 3 * time.Second},
	}
	attempts := []int{math.MinInt, -1, 0, 1, 2, 3, 10, 29, 50, 63, 64, 92, 93, 94, 200, 1 << 20, math.MaxInt32, math.MaxInt - 1, math.MaxInt}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prev := time.Duration(0)
			for _, n := range attempts {
				d := tc.backoff.Delay(n)
				assert.GreaterOrEqual(t, d, tc.floor, "attempt %d below floor", n)
				assert.LessOrEqual(t, d, tc.limit, "attempt %d above cap", n)
				assert.GreaterOrEqual(t, d, prev, "attempt %d not monotone", n)
				prev = d
			}
			assert.Equal(t, tc.limit, tc.backoff.Delay(math.MaxInt), "the largest attempt reaches the cap")
		})
	}
}

func TestExponentialSchedule(t *testing.T) {
	e := retry.Exponential{Base: time.Second, Factor: 2, Cap: 10 * time.Second}
	got := []time.Duration{}
	for n := 1; n <= 6; n++ {
		got = append(got, e.Delay(n))
	}
	assert.Equal(t, []time.Duration{1, 2, 4, 8, 10, 10}, scale(got, time.Second))
}

func scale(ds []time.Duration, unit time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d / unit
	}
	return out
}

func TestJitter(t *testing.T) {
	inner := retry.Fibonacci{Base: 10 * time.Second, Cap: time.Hour}
	low := retry.Jitter{Backoff: inner, Fraction: 0.5, Rand: func() float64 { return 0 }}
	high := retry.Jitter{Backoff: inner, Fraction: 0.5, Rand: func() float64 { return 0.999999 }}
	mid := retry.Jitter{Backoff: inner, Fraction: 0.5, Rand: func() float64 { return 0.5 }}
	// Attempt 5: 50 s; ±50% is 25..75 s but the floor (10 s) and cap (1 h) still hold.
	assert.Equal(t, 50*time.Second, mid.Delay(5))
	assert.Equal(t, 25*time.Second, low.Delay(5))
	assert.InDelta(t, float64(75*time.Second), float64(high.Delay(5)), float64(time.Millisecond))
	assert.Equal(t, 10*time.Second, low.Delay(1), "jitter never goes below the inner floor")
	assert.Equal(t, time.Hour, high.Delay(100), "jitter never goes above the inner cap")
	// A hostile random source cannot push the delay out of range.
	bad := retry.Jitter{Backoff: inner, Rand: func() float64 { return math.Inf(1) }}
	assert.Equal(t, 50*time.Second, bad.Delay(5))
}

func TestBackoffValidate(t *testing.T) {
	cases := []struct {
		name    string
		backoff retry.Backoff
		ok      bool
	}{
		{"fibonacci zero", retry.Fibonacci{}, true},
		{"fibonacci negative base", retry.Fibonacci{Base: -1}, false},
		{"fibonacci negative cap", retry.Fibonacci{Cap: -1}, false},
		{"fibonacci floor above cap", retry.Fibonacci{Floor: time.Hour, Cap: time.Minute}, false},
		{"exponential factor below one", retry.Exponential{Factor: 0.5}, false},
		{"exponential NaN factor", retry.Exponential{Factor: math.NaN()}, false},
		{"constant negative", retry.Constant{Interval: -time.Second}, false},
		{"jitter fraction too big", retry.Jitter{Fraction: 2}, false},
		{"jitter bad inner", retry.Jitter{Backoff: retry.Fibonacci{Base: -1}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := retry.NewProcessor(nopSender{}, okHandler, &retry.Options{Backoff: tc.backoff})
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, retry.ErrInvalidOptions)
			}
		})
	}
}

func FuzzBackoff(f *testing.F) {
	f.Add(int64(10*time.Second), int64(0), int64(0), 1.0, 5)
	f.Add(int64(1), int64(0), int64(math.MaxInt64), 1.5, math.MaxInt)
	f.Add(int64(time.Hour), int64(time.Second), int64(time.Minute), 0.0, 93)
	f.Fuzz(func(t *testing.T, base, floor, ceiling int64, factor float64, attempt int) {
		for _, b := range []retry.Backoff{
			retry.Fibonacci{Base: time.Duration(base), Floor: time.Duration(floor), Cap: time.Duration(ceiling)},
			retry.Exponential{Base: time.Duration(base), Factor: factor, Floor: time.Duration(floor), Cap: time.Duration(ceiling)},
		} {
			bounds, ok := b.(retry.DelayBounds)
			require.True(t, ok)
			lo, hi := bounds.Bounds()
			d := b.Delay(attempt)
			require.GreaterOrEqual(t, d, lo)
			require.LessOrEqual(t, d, hi)
			require.Positive(t, d)
			if attempt < math.MaxInt {
				require.LessOrEqual(t, d, b.Delay(attempt+1), "monotone")
			}
		}
	})
}
