// Package backoff holds the delay schedules of package retry: [Fibonacci] (the default), [Exponential],
// [Constant], and [Jitter] around any of them. A [Backoff] is a pure function of the attempt number, so
// it gives the same delay in every process; one that also implements [DelayBounds] tells the consumer its
// cap, which bounds a handler-chosen delay (retry.RetryAfter).
package backoff

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Backoff chooses the delay before the next attempt. Delay(n) is the wait after attempt n failed
// (n >= 1; smaller n count as 1). It must be a pure function of n: attempts span processes, so all state
// lives in the message (see package retry's Envelope), never in the Backoff.
type Backoff interface {
	Delay(attempt int) time.Duration
}

// DelayBounds is implemented by backoffs that know their floor and cap. The processor uses the cap to
// bound a handler-chosen delay (retry.RetryAfter); without it, [DefaultCap] applies.
type DelayBounds interface {
	Bounds() (floor, ceiling time.Duration)
}

// Defaults shared by the backoffs.
const (
	// DefaultBase is the base delay of [Fibonacci] and [Exponential] when Base is zero.
	DefaultBase = 10 * time.Second
	// DefaultCap is the largest delay when Cap is zero: 7 days, the longest duplicate-detection window
	// Service Bus allows, so a retry copy is always inside the window.
	DefaultCap = 7 * 24 * time.Hour
)

var errNegative = errors.New("must not be negative")

// Fibonacci grows delays as Base × F(n), where F(1)=F(2)=1, F(3)=2, ..., clamped to [Floor, Cap].
// It grows more gently than doubling, which suits outages measured in minutes to hours.
//
// The zero value is the package default: Base 10 s, Floor 10 s, Cap 7 days, giving
// 10, 10, 20, 30, 50, 80, 130, 210, 340, 550 s for attempts 1..10. It is safe for concurrent use.
type Fibonacci struct {
	// Base multiplies the Fibonacci number, so it is also the first delay. Zero means [DefaultBase].
	// It must not exceed Cap.
	Base time.Duration
	// Floor is the smallest delay returned. Zero means Base. It must not exceed Cap.
	Floor time.Duration
	// Cap is the largest delay returned. Zero means [DefaultCap].
	Cap time.Duration
}

// Bounds returns the effective floor and cap.
func (f Fibonacci) Bounds() (floor, ceiling time.Duration) {
	_, floor, ceiling = resolve(f.Base, f.Floor, f.Cap)
	return floor, ceiling
}

// Delay returns Base × F(attempt) clamped to [Floor, Cap]. It never overflows: the loop stops as soon
// as the product would pass the cap, which happens long before F(n) overflows int64 (near F(93)).
func (f Fibonacci) Delay(attempt int) time.Duration {
	base, floor, ceiling := resolve(f.Base, f.Floor, f.Cap)
	if attempt < 1 {
		attempt = 1
	}
	// Work in multiples of base: F(n) > ceiling/base means base×F(n) > ceiling, so the cap is reached
	// without ever forming the product, which could overflow.
	limit := ceiling / base // largest Fibonacci number that still fits under the cap
	prev, cur := int64(0), int64(1)
	for i := 1; i < attempt; i++ {
		// prev+cur > limit, written so that the sum itself can never overflow.
		if prev > int64(limit)-cur {
			return clamp(ceiling, floor, ceiling)
		}
		prev, cur = cur, prev+cur
	}
	return clamp(base*time.Duration(cur), floor, ceiling)
}

// Validate reports negative fields, or a Base or effective Floor above the effective Cap (see
// [validateBounds] for why the defaults count).
func (f Fibonacci) Validate() error { return validateBounds(f.Base, f.Floor, f.Cap) }

// Exponential grows delays as Base × Factor^(n-1), clamped to [Floor, Cap]. The zero value uses
// Base 10 s, Factor 2, Floor = Base and Cap 7 days. It is safe for concurrent use.
type Exponential struct {
	// Base is the first delay. Zero means [DefaultBase]. It must not exceed Cap.
	Base time.Duration
	// Factor multiplies the delay after each attempt. Zero means 2; values below 1, NaN and
	// infinities are invalid.
	Factor float64
	// Floor is the smallest delay returned. Zero means Base. It must not exceed Cap.
	Floor time.Duration
	// Cap is the largest delay returned. Zero means [DefaultCap].
	Cap time.Duration
}

// Bounds returns the effective floor and cap.
func (e Exponential) Bounds() (floor, ceiling time.Duration) {
	_, floor, ceiling = resolve(e.Base, e.Floor, e.Cap)
	return floor, ceiling
}

// Delay returns Base × Factor^(attempt-1) clamped to [Floor, Cap], computed in floating point so that
// no attempt number overflows.
func (e Exponential) Delay(attempt int) time.Duration {
	base, floor, ceiling := resolve(e.Base, e.Floor, e.Cap)
	factor := e.Factor
	if factor == 0 || factor < 1 || math.IsNaN(factor) {
		factor = 2
	}
	if attempt < 1 {
		attempt = 1
	}
	// Floating point saturates to +Inf instead of wrapping, so huge attempts simply reach the cap.
	d := float64(base) * math.Pow(factor, float64(attempt-1))
	if math.IsInf(d, 0) || math.IsNaN(d) || d >= float64(ceiling) {
		return clamp(ceiling, floor, ceiling)
	}
	return clamp(time.Duration(d), floor, ceiling)
}

// Validate reports negative fields, a Factor that is not a finite number of at least 1, or a Base or
// effective Floor above the effective Cap (see [validateBounds] for why the defaults count).
func (e Exponential) Validate() error {
	if e.Factor != 0 && (e.Factor < 1 || math.IsNaN(e.Factor) || math.IsInf(e.Factor, 0)) {
		//lint:ignore ST1005 the message starts with the exported field it names
		return fmt.Errorf("Factor (%v) must be a finite number of at least 1; zero means 2", e.Factor)
	}
	return validateBounds(e.Base, e.Floor, e.Cap)
}

// Constant waits the same Interval after every attempt. The zero value waits [DefaultBase]. It has no
// separate floor or cap, so Interval is both (see [Constant.Bounds]) and cannot contradict them.
type Constant struct {
	// Interval is the delay after every attempt. Zero means [DefaultBase].
	Interval time.Duration
}

// Delay returns Interval.
func (c Constant) Delay(int) time.Duration {
	if c.Interval <= 0 {
		return DefaultBase
	}
	return c.Interval
}

// Bounds returns Interval as both floor and cap.
func (c Constant) Bounds() (floor, ceiling time.Duration) {
	d := c.Delay(1)
	return d, d
}

// Validate reports a negative interval.
func (c Constant) Validate() error {
	if c.Interval < 0 {
		return errors.New("Interval " + errNegative.Error())
	}
	return nil
}

// Jitter spreads the delays of another Backoff by up to ±Fraction, so that messages that failed
// together do not all come back in the same instant. The result stays within the inner backoff's
// bounds when it has them ([DelayBounds]), except a [Constant]'s: its one delay is both its floor and
// its cap, so its delays are spread by the whole ±Fraction (never past [DefaultCap]), and
// [Jitter.Bounds] says so.
type Jitter struct {
	// Backoff is the backoff whose delays are spread. Nil means Fibonacci{}.
	Backoff Backoff
	// Fraction is the largest relative change, in (0, 1]. Zero means 0.2, which is why zero is
	// accepted but is not "no jitter": to turn jitter off, use the inner Backoff directly. At 1 a
	// delay may shrink to zero before the inner floor applies.
	Fraction float64
	// Rand returns a number in [0, 1). Nil means math/rand/v2's Float64. Inject one for
	// deterministic tests; it must be safe for concurrent use if the Consumer runs handlers
	// concurrently.
	Rand func() float64
}

// Delay returns the inner delay scaled by a random factor in [1-Fraction, 1+Fraction).
func (j Jitter) Delay(attempt int) time.Duration {
	inner := j.inner()
	d := inner.Delay(attempt)
	frac := j.fraction()
	r := rand.Float64
	if j.Rand != nil {
		r = j.Rand
	}
	x := r()
	if x < 0 || x >= 1 || math.IsNaN(x) {
		x = 0.5
	}
	out := scaleBy(d, 1-frac+2*frac*x)
	if _, ok := inner.(DelayBounds); ok {
		floor, ceiling := j.Bounds()
		out = clamp(out, floor, ceiling)
	}
	return out
}

// Bounds returns the inner backoff's bounds, or zero and [DefaultCap] when it has none. A [Constant]
// inner backoff, whose one delay is both its floor and its cap, is spread by ±Fraction instead: the
// bounds are that delay scaled by 1-Fraction and 1+Fraction, the upper one no later than
// [DefaultCap] (unless the constant itself is).
func (j Jitter) Bounds() (floor, ceiling time.Duration) {
	inner := j.inner()
	if c, ok := constantOf(inner); ok {
		d, frac := c.Delay(1), j.fraction()
		return scaleBy(d, 1-frac), min(scaleBy(d, 1+frac), max(d, DefaultCap))
	}
	if b, ok := inner.(DelayBounds); ok {
		return b.Bounds()
	}
	return 0, DefaultCap
}

// constantOf returns b as a Constant, if it is one.
func constantOf(b Backoff) (Constant, bool) {
	switch c := b.(type) {
	case Constant:
		return c, true
	case *Constant:
		if c != nil {
			return *c, true
		}
	}
	return Constant{}, false
}

// fraction is Fraction, or 0.2 when it is out of (0, 1] (zero, or rejected by Validate).
func (j Jitter) fraction() float64 {
	if j.Fraction <= 0 || j.Fraction > 1 || math.IsNaN(j.Fraction) {
		return 0.2
	}
	return j.Fraction
}

// scaleBy is d times f, saturating at the largest Duration.
func scaleBy(d time.Duration, f float64) time.Duration {
	scaled := float64(d) * f
	if scaled >= float64(math.MaxInt64) {
		return math.MaxInt64
	}
	return time.Duration(scaled)
}

// Validate checks Fraction and the inner backoff. The range it enforces is the one [Jitter.Delay]
// honours: a Fraction in (0, 1] is used as given, and zero selects the default, so zero passes but must
// not be described as a fraction of its own.
func (j Jitter) Validate() error {
	if j.Fraction < 0 || j.Fraction > 1 || math.IsNaN(j.Fraction) {
		//lint:ignore ST1005 the message starts with the exported field it names
		return fmt.Errorf("Fraction (%v) must be in (0, 1]; zero means 0.2", j.Fraction)
	}
	if v, ok := j.inner().(interface{ Validate() error }); ok {
		return v.Validate()
	}
	return nil
}

func (j Jitter) inner() Backoff {
	if j.Backoff == nil {
		return Fibonacci{}
	}
	return j.Backoff
}

// resolve applies the documented defaults. Negative values (rejected by Validate) fall back to the
// defaults too, so Delay never misbehaves on an unvalidated value.
func resolve(base, floor, ceiling time.Duration) (time.Duration, time.Duration, time.Duration) {
	if base <= 0 {
		base = DefaultBase
	}
	if floor <= 0 {
		floor = base
	}
	if ceiling <= 0 {
		ceiling = DefaultCap
	}
	if floor > ceiling {
		floor = ceiling
	}
	return base, floor, ceiling
}

// validateBounds rejects negative fields and bounds that contradict each other once the defaults are
// applied. The defaults matter: a zero Floor means Base and a zero Base means [DefaultBase], so
// {Base: 1s, Cap: 500ms} or {Cap: 5s} has a floor above its cap even though no Floor was written.
// [resolve] would quietly lower that floor to the cap and every delay would be the cap, hiding what is
// almost always a swapped or mistyped field. A Base above the cap is refused even with an explicit
// Floor for the same reason: Base is the first delay, and a first delay past the cap leaves nothing to
// grow.
func validateBounds(base, floor, ceiling time.Duration) error {
	switch {
	case base < 0:
		return errors.New("Base " + errNegative.Error())
	case floor < 0:
		return errors.New("Floor " + errNegative.Error())
	case ceiling < 0:
		return errors.New("Cap " + errNegative.Error())
	}
	baseText := fmt.Sprintf("Base (%v)", base)
	if base == 0 {
		base = DefaultBase
		baseText = fmt.Sprintf("Base (zero, so the default %v)", base)
	}
	capText := fmt.Sprintf("Cap (%v)", ceiling)
	if ceiling == 0 {
		ceiling = DefaultCap
		capText = fmt.Sprintf("Cap (zero, so the default %v)", ceiling)
	}
	switch {
	case floor > ceiling:
		//lint:ignore ST1005 the message starts with the exported field it names
		return fmt.Errorf("Floor (%v) must not exceed %s", floor, capText)
	case base > ceiling && floor == 0:
		return fmt.Errorf("%s must not exceed %s: Floor is zero, so the floor is Base and lies above the cap", baseText, capText)
	case base > ceiling:
		return fmt.Errorf("%s must not exceed %s", baseText, capText)
	}
	return nil
}

func clamp(d, lo, hi time.Duration) time.Duration {
	if d < lo {
		d = lo
	}
	if d > hi {
		d = hi
	}
	return d
}
