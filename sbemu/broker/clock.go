package broker

import "time"

// Clock is the broker's source of time: every lock expiry, scheduled
// activation, time-to-live and duplicate-detection window is measured on
// it. It uses standard-library types only, so any fake clock fits: the
// Clock and *Mock of github.com/benbjohnson/clock satisfy it as they are,
// and so does the library's retry.Clock, which has the same two methods, so
// one fake clock can drive the library and the emulator together.
type Clock interface {
	// Now is the current time.
	Now() time.Time
	// After delivers the time on the returned channel once d has passed.
	// The broker never needs to stop it: a wake-up it no longer wants is
	// ignored, and the channel is left to the garbage collector.
	After(d time.Duration) <-chan time.Time
}

// realClock reads the time package directly. Unlike a wrapper that caches
// a clock object, that keeps it usable inside a testing/synctest bubble,
// where the time package itself is faked.
type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// RealClock returns the clock the broker uses when none is given: the
// system time.
func RealClock() Clock { return realClock{} }
