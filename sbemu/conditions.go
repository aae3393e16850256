package sbemu

import "github.com/sbretry/retry/sbemu/internal/wire"

// AMQP and Service Bus error conditions the emulator sends. The SDK maps
// each to an error code or a recovery kind (azservicebus internal/errors.go),
// so the exact symbol matters.
const (
	condInternalError      wire.Symbol = "amqp:internal-error"
	condNotFound           wire.Symbol = "amqp:not-found"
	condUnauthorized       wire.Symbol = "amqp:unauthorized-access"
	condDecodeError        wire.Symbol = "amqp:decode-error"
	condNotAllowed         wire.Symbol = "amqp:not-allowed"
	condNotImplemented     wire.Symbol = "amqp:not-implemented"
	condIllegalState       wire.Symbol = "amqp:illegal-state"
	condFramingError       wire.Symbol = "amqp:connection:framing-error"
	condDetachForced       wire.Symbol = "amqp:link:detach-forced"
	condHandleInUse        wire.Symbol = "amqp:session:handle-in-use"
	condMessageSizeExceded wire.Symbol = "amqp:link:message-size-exceeded"
	condLockLost           wire.Symbol = "com.microsoft:message-lock-lost"
	condDeadLetter         wire.Symbol = "com.microsoft:dead-letter"
	condResourceLimit      wire.Symbol = "amqp:resource-limit-exceeded"
)
