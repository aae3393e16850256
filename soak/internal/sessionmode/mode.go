// Package sessionmode names the ways the sessions soak can run retry.SessionConsumer's holds, so that
// the driver and the consumer process agree on one flag (-session-mode) and refuse, up front and in the
// same words, a mode they do not know.
package sessionmode

import "fmt"

// Mode is how a failed attempt holds its session.
type Mode string

const (
	// InPlace is SessionConsumer's hold in place: the retry waits in memory, in the process holding the
	// session; a process that dies during a hold gives the message back (its attempt count restarts).
	// Holds longer than MaxHold are dead-lettered.
	InPlace Mode = "inplace"
	// Durable turns on SessionOptions.DurableHolds: a retry due after MaxHold is held in the session
	// itself (the message deferred, the hold recorded in the session state, a wake-up scheduled), so it
	// survives the process and keeps its attempt count. The soak's default MaxHold for it is 1 ns, which
	// makes every delayed retry durable.
	Durable Mode = "durable"
)

// Parse returns the mode s names, or an error naming the known ones.
func Parse(s string) (Mode, error) {
	switch Mode(s) {
	case InPlace, Durable:
		return Mode(s), nil
	}
	return "", fmt.Errorf("-session-mode %q: unknown (want %s or %s)", s, InPlace, Durable)
}
