package backoff_test

import (
	"math"
	"testing"
	"time"

	"github.com/sbretry/retry/backoff"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestFibonacciDefaultSchedule(t *testing.T) {
	want := []time.Duration{10, 10, 20, 30, 50, 80, 130, 210, 340, 550}
	for i, w := range want {
		assert.Equal(t, w*time.Second, backoff.Fibonacci{}.Delay(i+1), "attempt %d", i+1)
	}
	week := 604800 * time.Second
	for _, n := range []int{29, 50, 92, 93, 94, 1000, math.MaxInt} {
		assert.Equal(t, week, backoff.Fibonacci{}.Delay(n), "attempt %d", n)
	}
}

func TestBackoffBoundsAndMonotone(t *testing.T) {
	cases := []struct {
		name         string
		backoff      backoff.Backoff
		floor, limit time.Duration
	}{
		{"fibonacci default", backoff.Fibonacci{}, 10 * time.Second, backoff.DefaultCap},
		{"fibonacci ms base", backoff.Fibonacci{Base: time.Millisecond, Cap: time.Hour}, time.Millisecond, time.Hour},
		{"fibonacci floor above base", backoff.Fibonacci{Base: time.Second, Floor: 5 * time.Second, Cap: time.Minute}, 5 * time.Second, time.Minute},
		{"fibonacci 1ns base", backoff.Fibonacci{Base: 1, Cap: math.MaxInt64}, 1, math.MaxInt64},
		{"exponential default", backoff.Exponential{}, 10 * time.Second, backoff.DefaultCap},
		{"exponential factor 3", backoff.Exponential{Base: time.Second, Factor: 3, Floor: 2 * time.Second, Cap: time.Hour}, 2 * time.Second, time.Hour},
		{"exponential factor 1", backoff.Exponential{Base: time.Second, Factor: 1, Cap: time.Second}, time.Second, time.Second},
		{"exponential huge cap", backoff.Exponential{Base: 1, Factor: 1.5, Cap: math.MaxInt64}, 1, math.MaxInt64},
		{"constant", backoff.Constant{Interval: 3 * time.Second}, 3 * time.Second, 3 * time.Second},
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
	e := backoff.Exponential{Base: time.Second, Factor: 2, Cap: 10 * time.Second}
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
	inner := backoff.Fibonacci{Base: 10 * time.Second, Cap: time.Hour}
	low := backoff.Jitter{Backoff: inner, Fraction: 0.5, Rand: func() float64 { return 0 }}
	high := backoff.Jitter{Backoff: inner, Fraction: 0.5, Rand: func() float64 { return 0.999999 }}
	mid := backoff.Jitter{Backoff: inner, Fraction: 0.5, Rand: func() float64 { return 0.5 }}
	// Attempt 5: 50 s; ±50% is 25..75 s but the floor (10 s) and cap (1 h) still hold.
	assert.Equal(t, 50*time.Second, mid.Delay(5))
	assert.Equal(t, 25*time.Second, low.Delay(5))
	assert.InDelta(t, float64(75*time.Second), float64(high.Delay(5)), float64(time.Millisecond))
	assert.Equal(t, 10*time.Second, low.Delay(1), "jitter never goes below the inner floor")
	assert.Equal(t, time.Hour, high.Delay(100), "jitter never goes above the inner cap")
	// A hostile random source cannot push the delay out of range.
	bad := backoff.Jitter{Backoff: inner, Rand: func() float64 { return math.Inf(1) }}
	assert.Equal(t, 50*time.Second, bad.Delay(5))
}

// A Constant's one delay is its floor and its cap: Jitter spreads it by the whole ±Fraction instead
// of clamping every delay back to the constant (which made Jitter{Constant} no jitter at all), and its
// Bounds say so, for the consumer's cap on RetryAfter.
func TestJitterSpreadsAConstant(t *testing.T) {
	inner := backoff.Constant{Interval: time.Minute}
	low := backoff.Jitter{Backoff: inner, Fraction: 0.5, Rand: func() float64 { return 0 }}
	high := backoff.Jitter{Backoff: inner, Fraction: 0.5, Rand: func() float64 { return 0.999999 }}
	assert.Equal(t, 30*time.Second, low.Delay(3))
	assert.InDelta(t, float64(90*time.Second), float64(high.Delay(3)), float64(time.Millisecond))
	floor, ceiling := low.Bounds()
	assert.Equal(t, 30*time.Second, floor)
	assert.Equal(t, 90*time.Second, ceiling)
	floor, ceiling = backoff.Jitter{Backoff: inner}.Bounds()
	assert.Equal(t, 48*time.Second, floor, "the default fraction, 0.2")
	assert.Equal(t, 72*time.Second, ceiling)
	// A pointer to a Constant is one too.
	floor, _ = backoff.Jitter{Backoff: &inner, Fraction: 0.5}.Bounds()
	assert.Equal(t, 30*time.Second, floor)
	// The spread stops at DefaultCap, the duplicate-detection window, unless the constant is past it.
	week := backoff.Jitter{Backoff: backoff.Constant{Interval: backoff.DefaultCap}, Fraction: 0.2, Rand: func() float64 { return 0.999999 }}
	assert.Equal(t, backoff.DefaultCap, week.Delay(1))
	_, ceiling = week.Bounds()
	assert.Equal(t, backoff.DefaultCap, ceiling)
	// A huge constant saturates rather than overflowing.
	_, ceiling = backoff.Jitter{Backoff: backoff.Constant{Interval: math.MaxInt64}, Fraction: 1}.Bounds()
	assert.Equal(t, time.Duration(math.MaxInt64), ceiling)
	// Another backoff whose floor equals its cap keeps its cap: Cap is the largest delay returned.
	pinned := backoff.Jitter{Backoff: backoff.Fibonacci{Base: time.Hour, Cap: time.Hour}, Fraction: 0.2, Rand: func() float64 { return 0.999999 }}
	assert.Equal(t, time.Hour, pinned.Delay(3))
	floor, ceiling = pinned.Bounds()
	assert.Equal(t, time.Hour, floor)
	assert.Equal(t, time.Hour, ceiling)
}

// TestBackoffValidate: want is a fragment of the reason for invalid cases: the fields involved must be
// named. How a Validate error reaches the caller of NewProcessor is package retry's TestPolicyOptionsAreValidated.
func TestBackoffValidate(t *testing.T) {
	const day = 24 * time.Hour
	cases := []struct {
		name    string
		backoff backoff.Backoff
		want    string // empty means valid
	}{
		{"fibonacci zero", backoff.Fibonacci{}, ""},
		{"fibonacci negative base", backoff.Fibonacci{Base: -1}, "Base must not be negative"},
		{"fibonacci negative cap", backoff.Fibonacci{Cap: -1}, "Cap must not be negative"},
		{"fibonacci floor above cap", backoff.Fibonacci{Floor: time.Hour, Cap: time.Minute}, "Floor (1h0m0s) must not exceed Cap (1m0s)"},
		{"fibonacci floor above default cap", backoff.Fibonacci{Floor: 8 * day}, "Floor (192h0m0s) must not exceed Cap (zero, so the default 168h0m0s)"},
		{"fibonacci floor equals cap", backoff.Fibonacci{Base: time.Second, Floor: time.Minute, Cap: time.Minute}, ""},
		{"fibonacci base equals cap", backoff.Fibonacci{Base: time.Minute, Cap: time.Minute}, ""},
		{"fibonacci default base equals cap", backoff.Fibonacci{Cap: backoff.DefaultBase}, ""},
		// Floor defaults to Base, so these have a floor above the cap without naming Floor.
		{"fibonacci base above cap, floor defaulted", backoff.Fibonacci{Base: time.Minute, Cap: time.Second}, "Base (1m0s) must not exceed Cap (1s): Floor is zero, so the floor is Base"},
		{"fibonacci default base above cap", backoff.Fibonacci{Cap: 5 * time.Second}, "Base (zero, so the default 10s) must not exceed Cap (5s)"},
		{"fibonacci base above default cap", backoff.Fibonacci{Base: 8 * day}, "Base (192h0m0s) must not exceed Cap (zero, so the default 168h0m0s)"},
		{"fibonacci base above cap, explicit floor", backoff.Fibonacci{Base: time.Hour, Floor: time.Second, Cap: time.Minute}, "Base (1h0m0s) must not exceed Cap (1m0s)"},
		{"exponential zero", backoff.Exponential{}, ""},
		{"exponential factor below one", backoff.Exponential{Factor: 0.5}, "Factor (0.5) must be a finite number of at least 1"},
		{"exponential NaN factor", backoff.Exponential{Factor: math.NaN()}, "Factor (NaN)"},
		{"exponential infinite factor", backoff.Exponential{Factor: math.Inf(1)}, "Factor (+Inf) must be a finite number"},
		{"exponential factor one", backoff.Exponential{Factor: 1}, ""},
		{"exponential base equals cap", backoff.Exponential{Base: time.Second, Cap: time.Second}, ""},
		{"exponential base above cap, floor defaulted", backoff.Exponential{Base: time.Second, Cap: 500 * time.Millisecond}, "Base (1s) must not exceed Cap (500ms): Floor is zero, so the floor is Base"},
		{"exponential default base above cap", backoff.Exponential{Cap: time.Second}, "Base (zero, so the default 10s) must not exceed Cap (1s)"},
		{"exponential base above cap, explicit floor", backoff.Exponential{Base: time.Hour, Floor: time.Second, Cap: time.Minute}, "Base (1h0m0s) must not exceed Cap (1m0s)"},
		{"exponential floor above cap", backoff.Exponential{Base: time.Second, Floor: time.Hour, Cap: time.Minute}, "Floor (1h0m0s) must not exceed Cap (1m0s)"},
		{"constant zero", backoff.Constant{}, ""},
		{"constant negative", backoff.Constant{Interval: -time.Second}, "Interval must not be negative"},
		// Constant has no cap of its own; an explicit Fibonacci or Exponential Cap may exceed DefaultCap
		// too, so a long Interval is allowed.
		{"constant above default cap", backoff.Constant{Interval: 8 * day}, ""},
		{"jitter zero fraction means default", backoff.Jitter{Fraction: 0}, ""},
		{"jitter smallest fraction", backoff.Jitter{Fraction: math.SmallestNonzeroFloat64}, ""},
		{"jitter fraction one", backoff.Jitter{Fraction: 1}, ""},
		{"jitter fraction just above one", backoff.Jitter{Fraction: math.Nextafter(1, 2)}, "must be in (0, 1]; zero means 0.2"},
		{"jitter fraction too big", backoff.Jitter{Fraction: 2}, "Fraction (2) must be in (0, 1]"},
		{"jitter fraction just below zero", backoff.Jitter{Fraction: math.Nextafter(0, -1)}, "must be in (0, 1]"},
		{"jitter NaN fraction", backoff.Jitter{Fraction: math.NaN()}, "Fraction (NaN) must be in (0, 1]"},
		{"jitter infinite fraction", backoff.Jitter{Fraction: math.Inf(1)}, "Fraction (+Inf) must be in (0, 1]"},
		{"jitter bad inner", backoff.Jitter{Backoff: backoff.Fibonacci{Base: -1}}, "Base must not be negative"},
		{"jitter inner base above cap", backoff.Jitter{Backoff: backoff.Exponential{Base: time.Second, Cap: 500 * time.Millisecond}}, "Base (1s) must not exceed Cap (500ms)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.backoff.(interface{ Validate() error }).Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// boundlessBackoff has no [backoff.DelayBounds], so Jitter cannot clamp its delays.
type boundlessBackoff time.Duration

func (b boundlessBackoff) Delay(int) time.Duration { return time.Duration(b) }

// TestJitterFractionBoundaries checks that Delay uses exactly the range Validate accepts: (0, 1] as given,
// anything else as the 0.2 default.
func TestJitterFractionBoundaries(t *testing.T) {
	inner := boundlessBackoff(100 * time.Second)
	cases := []struct {
		name     string
		fraction float64
		x        float64
		want     time.Duration
	}{
		{"fraction one, lowest draw", 1, 0, 0},
		{"fraction one, draw 0.75", 1, 0.75, 150 * time.Second},
		{"fraction zero is the default", 0, 0, 80 * time.Second},
		{"fraction above one falls back to the default", math.Nextafter(1, 2), 0, 80 * time.Second},
		{"negative fraction falls back to the default", -0.5, 0, 80 * time.Second},
		{"tiny fraction barely moves", math.SmallestNonzeroFloat64, 0, 100 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			j := backoff.Jitter{Backoff: inner, Fraction: tc.fraction, Rand: func() float64 { return tc.x }}
			assert.Equal(t, tc.want, j.Delay(1))
		})
	}
}

func FuzzBackoff(f *testing.F) {
	f.Add(int64(10*time.Second), int64(0), int64(0), 1.0, 5)
	f.Add(int64(1), int64(0), int64(math.MaxInt64), 1.5, math.MaxInt)
	f.Add(int64(time.Hour), int64(time.Second), int64(time.Minute), 0.0, 93)
	f.Add(int64(time.Second), int64(0), int64(500*time.Millisecond), 2.0, 1)
	f.Fuzz(func(t *testing.T, base, floor, ceiling int64, factor float64, attempt int) {
		for _, b := range []backoff.Backoff{
			backoff.Fibonacci{Base: time.Duration(base), Floor: time.Duration(floor), Cap: time.Duration(ceiling)},
			backoff.Exponential{Base: time.Duration(base), Factor: factor, Floor: time.Duration(floor), Cap: time.Duration(ceiling)},
		} {
			bounds, ok := b.(backoff.DelayBounds)
			require.True(t, ok)
			lo, hi := bounds.Bounds()
			if v, ok := b.(interface{ Validate() error }); ok && v.Validate() == nil {
				// A backoff that passes validation keeps the floor it was given: resolve never has to
				// lower it to the cap behind the caller's back.
				require.Equal(t, effectiveFloor(base, floor), lo, "a valid backoff keeps its floor")
			}
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

// effectiveFloor is the floor the documentation promises: Floor, or Base when Floor is zero, or
// DefaultBase when both are.
func effectiveFloor(base, floor int64) time.Duration {
	switch {
	case floor > 0:
		return time.Duration(floor)
	case base > 0:
		return time.Duration(base)
	default:
		return backoff.DefaultBase
	}
}
