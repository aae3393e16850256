// Package redact removes secrets from text before it reaches a log line or an error.
package redact

import (
	"regexp"
	"strings"
)

// secretPattern matches the value of a SharedAccessKey or SharedAccessSignature, whether it appears in a
// connection string ("SharedAccessKey=...;"), a token ("SharedAccessSignature sr=...&sig=..."), or a
// URL query ("sig=..."). Matching is case-insensitive because connection string keys are.
var secretPattern = regexp.MustCompile(`(?i)(SharedAccessKey\s*=\s*|SharedAccessSignature[\s=]+|\bsig=)[^;\s"'&]*`)

// signatureTail matches the rest of a SharedAccessSignature token after its first field, which carries
// the signature and expiry in "&key=value" pairs.
var signatureTail = regexp.MustCompile(`(?i)(SharedAccessSignature[\s=]+REDACTED)(&[^;\s"']*)`)

// String returns s with every shared access key and signature replaced by REDACTED.
func String(s string) string {
	if lower := strings.ToLower(s); !strings.Contains(lower, "sharedaccess") && !strings.Contains(lower, "sig=") {
		return s // the common case: nothing to redact, skip the regular expressions
	}
	out := secretPattern.ReplaceAllString(s, "${1}REDACTED")
	return signatureTail.ReplaceAllString(out, "${1}")
}

// Error is an error whose text has been redacted; it keeps the original for errors.Is/As.
type Error struct {
	err error
}

// Wrap returns err with its message redacted, or nil for nil.
func Wrap(err error) error {
	if err == nil {
		return nil
	}
	return &Error{err: err}
}

func (e *Error) Error() string { return String(e.err.Error()) }

// Unwrap returns the original error so callers can still classify it.
func (e *Error) Unwrap() error { return e.err }
