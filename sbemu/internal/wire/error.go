package wire

import "fmt"

// Error conditions the emulator sends (part 2 section 2.8.15 and the Service
// Bus extensions the SDK recognises).
const (
	// ConditionInternalError: the peer hit an internal error.
	ConditionInternalError Symbol = "amqp:internal-error"
	// ConditionNotFound: the addressed entity does not exist.
	ConditionNotFound Symbol = "amqp:not-found"
	// ConditionUnauthorizedAccess: the peer may not do this.
	ConditionUnauthorizedAccess Symbol = "amqp:unauthorized-access"
	// ConditionDecodeError: a frame or value could not be decoded.
	ConditionDecodeError Symbol = "amqp:decode-error"
	// ConditionResourceLimitExceeded: a limit (size, count) was hit.
	ConditionResourceLimitExceeded Symbol = "amqp:resource-limit-exceeded"
	// ConditionNotAllowed: the peer tried something not allowed.
	ConditionNotAllowed Symbol = "amqp:not-allowed"
	// ConditionInvalidField: a field had an invalid value.
	ConditionInvalidField Symbol = "amqp:invalid-field"
	// ConditionNotImplemented: the peer asked for an unsupported feature.
	ConditionNotImplemented Symbol = "amqp:not-implemented"
	// ConditionConnectionForced: the server is closing the connection.
	ConditionConnectionForced Symbol = "amqp:connection:forced"
	// ConditionFramingError: a frame was malformed.
	ConditionFramingError Symbol = "amqp:connection:framing-error"
	// ConditionLinkDetachForced: the server is detaching the link (for
	// example an idle link).
	ConditionLinkDetachForced Symbol = "amqp:link:detach-forced"
	// ConditionMessageLockLost: Service Bus lock expired or unknown; the SDK
	// maps it to CodeLockLost.
	ConditionMessageLockLost Symbol = "com.microsoft:message-lock-lost"
	// ConditionDeadLetter: the condition the SDK puts in a [Rejected] that
	// dead-letters a message.
	ConditionDeadLetter Symbol = "com.microsoft:dead-letter"
)

// Error is the AMQP error type (part 2 section 2.8.14) carried by [Detach],
// [End], [Close] and [Rejected]. It implements the error interface so the
// emulator can return it and send it without conversion.
type Error struct {
	// Condition is a symbolic error code such as [ConditionNotFound].
	Condition Symbol
	// Description is human-readable text; "" is absent.
	Description string
	// Info holds extra details; nil is absent.
	Info *Map
}

// Error formats the condition and description; a nil *Error reads as
// "wire: <nil> amqp error" instead of panicking.
func (e *Error) Error() string {
	if e == nil {
		return "wire: <nil> amqp error"
	}
	if e.Description == "" {
		return fmt.Sprintf("wire: amqp error %s", e.Condition)
	}
	return fmt.Sprintf("wire: amqp error %s: %s", e.Condition, e.Description)
}

func (Error) descriptor() uint64 { return descError }

// condition is the only mandatory field; description and info are trimmed
// when empty, which keeps a bare lock-lost rejection short.
func (e Error) fields() []any {
	return []any{e.Condition, optZero(e.Description), optRef(e.Info)}
}

func decodeError(r *fieldReader) *Error {
	e := &Error{}
	readField(r, &e.Condition)
	readField(r, &e.Description)
	readField(r, &e.Info)
	return e
}
