package redact

// Error is an error whose message is redacted by [String]. It keeps the original error, so
// [errors.Is] and [errors.As] still see the whole chain: classification never depends on the text.
type Error struct {
	err error
}

// Wrap returns err with its message redacted, or nil for nil. Wrapping an [*Error] again returns it
// unchanged, since redaction is idempotent.
func Wrap(err error) error {
	if err == nil {
		return nil
	}
	if e, ok := err.(*Error); ok {
		return e
	}
	return &Error{err: err}
}

// Error returns the original message with its secrets replaced by REDACTED.
func (e *Error) Error() string { return String(e.err.Error()) }

// Unwrap returns the original error so callers can still classify it.
func (e *Error) Unwrap() error { return e.err }
