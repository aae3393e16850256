package sbemu

import (
	"errors"
	"fmt"

	"github.com/Azure/go-amqp"

	"github.com/sbretry/retry/sbemu/broker"
	"github.com/sbretry/retry/sbemu/internal/wire"
)

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
	// condMessageNotFound is Service Bus's condition for a receive by
	// sequence number that names no deferred message (.NET's
	// ServiceBusFailureReason.MessageNotFound); the JavaScript SDK reports
	// it as MessageNotFound, and a bare 404 as ServiceCommunicationProblem.
	condMessageNotFound wire.Symbol = "com.microsoft:message-not-found"
	condDeadLetter      wire.Symbol = "com.microsoft:dead-letter"
	condResourceLimit   wire.Symbol = "amqp:resource-limit-exceeded"
	condEntityDisabled  wire.Symbol = "com.microsoft:entity-disabled"
)

// disabledDescription describes a refusal for an entity's status
// (broker/status.go, [broker.ErrEntityDisabled]) in Service Bus's words —
// "Messaging entity '…' is currently disabled for Send operations." for a
// send (as quoted in github.com/Azure/azure-sdk-for-net issue 10535) and
// "Messaging entity '…' is currently disabled." for a receive
// (github.com/Azure/azure-service-bus issue 677) — followed by the
// emulator's detail. The condition is com.microsoft:entity-disabled, which
// the Go SDK treats as fatal (azservicebus v1.11.0 internal/errors.go).
func disabledDescription(err error) string {
	var de *broker.DisabledError
	if !errors.As(err, &de) {
		return "sbemu: " + err.Error()
	}
	what := "disabled"
	if de.Sending {
		what = "disabled for Send operations"
	}
	return fmt.Sprintf("Messaging entity '%s' is currently %s. sbemu: %v", de.Entity, what, err)
}

// lockLostDescription is the description Service Bus gives a lost message
// lock, on a settlement and on a renewal's 410 alike, as users quote it
// (Azure/azure-sdk-for-java#25121 and #40655); the Go SDK's live test
// TestReceiverRenewMessageLock checks that its beginning comes through.
// Service Bus goes on with a reference and tracking id; the emulator adds
// what it knows instead.
const lockLostDescription = "The lock supplied is invalid. Either the lock expired, or the message has already been removed from the queue. For more information please see https://aka.ms/ServiceBusExceptions ."

// conditionForStatus is the error condition of a failed management reply
// with status code (the errorCondition property, see requests.go), for
// replies that do not name one themselves. The pairs are those the
// JavaScript SDK's ConditionStatusMapper maps back to statuses
// (@azure/core-amqp errors.ts), with the message-lock reading of 410, the
// only lock the emulator's management node reports on.
func conditionForStatus(code int32) amqp.Symbol {
	switch code {
	case 400:
		return "com.microsoft:argument-error"
	case 401:
		return amqp.Symbol(condUnauthorized)
	case 404:
		return amqp.Symbol(condNotFound)
	case 408:
		return "com.microsoft:timeout"
	case 409:
		return "com.microsoft:entity-already-exists"
	case 410:
		return amqp.Symbol(condLockLost)
	case 413:
		return amqp.Symbol(condMessageSizeExceded)
	case 501:
		return amqp.Symbol(condNotImplemented)
	case 503:
		return "com.microsoft:server-busy"
	default:
		return amqp.Symbol(condInternalError)
	}
}
