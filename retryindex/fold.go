package retryindex

import (
	"fmt"
	"unicode/utf8"

	"github.com/sbretry/retry/internal/redact"
)

// The rules every Store applies the same way, exported so that a store in another package (the
// Postgres one) folds records exactly as the embedded one does.

// Validate reports a record a store must refuse: no chain id, an unknown kind, no time, or KindGone
// (which only [Store.MarkGone] writes). Errors wrap [ErrInvalidRecord].
func (r Record) Validate() error {
	switch {
	case !IsChainID(r.Chain):
		return fmt.Errorf("%w: chain %q is not 40 lower-case hex digits", ErrInvalidRecord, r.Chain)
	case stateOf(r.Kind) == 0 || r.Kind == KindGone:
		return fmt.Errorf("%w: kind %v", ErrInvalidRecord, r.Kind)
	case r.At.IsZero():
		return fmt.Errorf("%w: no time", ErrInvalidRecord)
	}
	return nil
}

// State is the state the record leaves its event in.
func (r Record) State() State { return stateOf(r.Kind) }

// Stage orders the records of one event so that a late record from one feed never overwrites a newer
// state from the other: a record applies to the event's state when its stage is higher than the
// state's, or equal and the record not older. It is the attempt the state is about, then pending <
// active < final.
func (r Record) Stage() int64 { return r.position() }

// StateAttempt is the attempt the event's state is about once the record applies: NextAttempt for a
// pending copy, else Attempt.
func (r Record) StateAttempt() int {
	if r.State() == StatePending {
		return r.NextAttempt
	}
	return r.Attempt
}

// RedactError prepares an error text for storage: secrets redacted (the library's redaction), then
// bounded to limit bytes at a character boundary, marked "…" when cut.
func RedactError(s string, limit int) string {
	s = redact.String(s)
	if len(s) <= limit {
		return s
	}
	const mark = "…"
	cut := max(limit-len(mark), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	if cut == 0 {
		return ""
	}
	return s[:cut] + mark
}
