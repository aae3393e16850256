package ledger

import (
	"fmt"
	"math/rand/v2"
)

// Class is how the soak handler treats a message, carried in its application properties so that every
// consumer process, and every retry copy, agrees without sharing the seed.
type Class string

const (
	// ClassOK succeeds on its first attempt.
	ClassOK Class = "ok"
	// ClassTransient fails its first FailAttempts attempts, then succeeds.
	ClassTransient Class = "transient"
	// ClassAlways fails every attempt: the consumer dead-letters it after MaxAttempts.
	ClassAlways Class = "always"
	// ClassPermanent fails with retry.Permanent: dead-lettered on its first attempt.
	ClassPermanent Class = "permanent"
)

// Application properties of a soak message. Retry copies keep them.
const (
	PropClass        = "soak-class"
	PropFailAttempts = "soak-fail-attempts"
)

// Mix is the share of each failing class; the rest is ClassOK.
type Mix struct {
	Transient, Always, Permanent float64
}

// IssueMix is the mix the soak issue asks for: 20 % transient, 1 % always, 0.5 % permanent.
var IssueMix = Mix{Transient: 0.20, Always: 0.01, Permanent: 0.005}

// Pick draws a class from m; a transient one fails between 1 and maxFail attempts (maxFail at least 1).
func (m Mix) Pick(r *rand.Rand, maxFail int) (Class, int) {
	x := r.Float64()
	switch {
	case x < m.Permanent:
		return ClassPermanent, 0
	case x < m.Permanent+m.Always:
		return ClassAlways, 0
	case x < m.Permanent+m.Always+m.Transient:
		return ClassTransient, 1 + r.IntN(max(maxFail, 1))
	}
	return ClassOK, 0
}

// Properties are the application properties that carry c and failAttempts.
func Properties(c Class, failAttempts int) map[string]any {
	return map[string]any{PropClass: string(c), PropFailAttempts: int64(failAttempts)}
}

// FromProperties reads a message's class back; an unknown or missing class is an error.
func FromProperties(props map[string]any) (Class, int, error) {
	s, _ := props[PropClass].(string)
	c := Class(s)
	switch c {
	case ClassOK, ClassTransient, ClassAlways, ClassPermanent:
	default:
		return "", 0, fmt.Errorf("ledger: message has no valid %s property (%q)", PropClass, s)
	}
	n, _ := props[PropFailAttempts].(int64)
	return c, int(n), nil
}

// Fails reports whether attempt (1-based) of a message of class c fails.
func Fails(c Class, failAttempts, attempt int) bool {
	switch c {
	case ClassOK:
		return false
	case ClassTransient:
		return attempt <= failAttempts
	}
	return true
}
