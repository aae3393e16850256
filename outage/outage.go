// Package outage holds the types of outage mode (retry.Options.Outage): a breaker on the consumer that,
// while the handlers' failures say a dependency is down, stops receiving and holds the messages in
// hand for later instead of spending their attempts. After OpenFor, one probe (a message, or
// [Options].HealthCheck) decides: success closes the breaker, failure keeps it open twice as long, up to
// MaxOpenFor. The breaker itself is package retry's; this package is what configures it ([Options]),
// reports it ([Status], in retry.Health) and tells of its changes ([Change], to retry.Hooks.OnOutage).
package outage

import (
	"context"
	"time"
)

// Options configures outage mode (retry.Options.Outage). Zero fields mean their defaults; a negative
// ConsecutiveFailures or FailureRate turns that rule off (not both).
type Options struct {
	// ConsecutiveFailures trips the breaker after this many counted failures in a row, across all
	// messages. Zero means 10.
	ConsecutiveFailures int
	// FailureRate trips the breaker when at least this share of the attempts within Window failed, once
	// there were MinAttempts of them. Zero means 0.5; at most 1.
	FailureRate float64
	// Window is the span FailureRate looks back over. Zero means 1 minute.
	Window time.Duration
	// MinAttempts is how many attempts Window must hold before FailureRate applies. Zero means
	// 20.
	MinAttempts int
	// OpenFor is how long the breaker stays open before its first probe. Each failed probe doubles it,
	// and so does a trip within one Window of the last close (a flapping dependency), up to MaxOpenFor;
	// it starts again from OpenFor once the breaker has stayed closed for a Window. Zero means
	// 30 s.
	OpenFor time.Duration
	// MaxOpenFor bounds OpenFor's growth. Zero means 5 minutes.
	MaxOpenFor time.Duration
	// HealthCheck, if set, is the probe: called once per half-open period, its nil closes the breaker
	// and its error keeps it open, and no message is received until it has closed. Nil means the
	// probe is the next message: its handler's success closes the breaker; a counted failure keeps it
	// open (the message is held, not charged an attempt); a failure that does not count leaves the
	// next message to probe.
	HealthCheck func(ctx context.Context) error
	// HealthCheckTimeout bounds each HealthCheck call. Zero means
	// 10 s.
	HealthCheckTimeout time.Duration
	// Counts reports whether a handler error counts toward the trip rules. Nil means every error
	// counts. Whatever it says, retry.Permanent errors and the failures of a retry.Policy with NotOutage never
	// count: a bad message is not an outage.
	Counts func(error) bool
}

// State is the breaker's state, as retry.Health's Outage reports it.
type State int

const (
	// Closed: receiving and handling as usual.
	Closed State = iota
	// Open: paused. Nothing is received; messages still in hand are held for the next probe.
	Open
	// HalfOpen: probing. One message (or the health check) decides whether to close.
	HalfOpen
)

func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half-open"
	}
	return "unknown"
}

// Status is the breaker as retry.Health reports it.
type Status struct {
	State State
	// Manual is true while the consumer is paused by retry's Consumer.Pause (or SessionConsumer.Pause): no probe runs until Resume.
	Manual bool
	// Reason says why the breaker opened (redacted), empty while closed.
	Reason string
	// Since is when State began.
	Since time.Time
	// NextProbe is when the open breaker probes next; zero while closed, half-open or paused by hand.
	NextProbe time.Time
	// Trips counts automatic openings; Probes the probes started, FailedProbes those that failed.
	Trips, Probes, FailedProbes uint64
}

// Change describes one change of the breaker's state, for retry.Hooks.OnOutage.
type Change struct {
	From, To State
	// Manual is true for Pause and Resume (by hand).
	Manual bool
	// Reason says why it opened; NextProbe is when it probes next (zero if it will not).
	Reason    string
	NextProbe time.Time
	// Err is the failure that tripped it or failed the probe, if any.
	Err error
	// EntityPath is the entity the consumer receives from (empty until its first connection names it).
	EntityPath string
	// Time is when the change happened, on the consumer's Clock (the hook may run a little later).
	Time time.Time
}
