// Package sessionmode names the ways the sessions soak can run retry.SessionConsumer's holds, so that
// the driver and the consumer process agree on one flag (-session-mode) and refuse, up front and in the
// same words, a mode this build cannot run.
package sessionmode

import (
	"errors"
	"fmt"
)

// Mode is how a failed attempt holds its session.
type Mode string

const (
	// InPlace is SessionConsumer's hold in place: the retry waits in memory, in the process holding the
	// session; a process that dies during a hold gives the message back (its attempt count restarts).
	InPlace Mode = "inplace"
	// Durable is the durable hold SessionOptions is gaining (the retry's state survives the process). Not
	// runnable yet: [Parse] refuses it with [ErrNotAvailable] until the library has it, when this is the
	// one place (with soakconsumer's sessionOptions) to switch it on.
	Durable Mode = "durable"
)

// ErrNotAvailable is Parse's error for a known mode this build cannot run.
var ErrNotAvailable = errors.New("not available in this build")

// Parse returns the mode s names, or an error: an unknown name, or [ErrNotAvailable] for durable.
func Parse(s string) (Mode, error) {
	switch Mode(s) {
	case InPlace:
		return InPlace, nil
	case Durable:
		return "", fmt.Errorf("-session-mode %s: %w: retry.SessionOptions has no durable hold yet; only %s runs", s, ErrNotAvailable, InPlace)
	}
	return "", fmt.Errorf("-session-mode %q: unknown (want %s or %s)", s, InPlace, Durable)
}
