package broker

import (
	"errors"
	"fmt"
)

// Sentinel errors returned by the broker. The AMQP server maps each of them to
// the Service Bus error condition the SDK expects, so they are compared with
// [errors.Is] and never by message text.
var (
	// ErrLockLost reports a settlement or renewal for a lock token that is
	// unknown, expired or already settled. The server answers it with
	// com.microsoft:message-lock-lost, which the SDK surfaces as CodeLockLost.
	ErrLockLost = errors.New("broker: message lock lost")

	// ErrNotFound reports a scheduled sequence number that does not exist
	// (never scheduled, already activated or already cancelled).
	ErrNotFound = errors.New("broker: message not found")

	// ErrMessageTooLarge reports a message whose encoded size exceeds the
	// queue's [QueueConfig.MaxMessageSize].
	ErrMessageTooLarge = errors.New("broker: message too large")

	// ErrPropertiesTooLarge reports a message whose application properties exceed the Service Bus
	// limits: 32 KiB for one property, 64 KiB for all of them ([MaxPropertySize], [MaxPropertiesSize]).
	// The real service answers such a send with a SerializationException.
	ErrPropertiesTooLarge = errors.New("broker: message properties too large")

	// ErrClosed reports a call on a broker after [Broker.Close]; blocked
	// receivers return it when the broker closes.
	ErrClosed = errors.New("broker: closed")

	// ErrUnknownQueue is returned by lookups of queue names that were not
	// configured. [Broker.Queue] reports absence with a bool instead; this
	// error is for callers (the server) that need an error value.
	ErrUnknownQueue = errors.New("broker: unknown queue")

	// ErrInvalidConfig wraps every configuration error returned by [New].
	ErrInvalidConfig = errors.New("broker: invalid configuration")

	// ErrNotSupported reports an operation Service Bus forbids on the entity:
	// sending or scheduling directly to a dead-letter queue, or dead-lettering
	// a message received from a dead-letter queue.
	ErrNotSupported = errors.New("broker: operation not supported on this entity")

	// ErrPersistence wraps every failure of [Options.DataDir]: a data
	// directory that cannot be opened, read, locked (another broker uses
	// it) or written, or that is damaged ([ErrDamaged]). Once a write or
	// fsync failed, the journal stops for good: the broker's calls still
	// run in memory, but [Broker.Sync], [Broker.AfterSync] and
	// [Broker.WaitStored] report the error for every change from then on,
	// so the AMQP server answers errors instead of acknowledgements it
	// could not keep (persist_faults.go).
	ErrPersistence = errors.New("broker: persistence failed")
)

// persistErr wraps a file-system error of the data directory.
func persistErr(what string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrPersistence, what, err)
}
