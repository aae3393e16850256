package inspect

import "errors"

// Sentinel errors. Every error returned by this package that stems from the caller's input wraps one of
// them; compare with [errors.Is]. Errors from Service Bus are wrapped as they come (an
// *azservicebus.Error stays reachable with [errors.As]).
var (
	// ErrInvalidOptions is wrapped by [New] for invalid [Options].
	ErrInvalidOptions = errors.New("inspect: invalid options")
	// ErrInvalidEntity is wrapped by [ParseEntity] and [New] for an entity path that is neither a
	// queue nor "topic/Subscriptions/subscription".
	ErrInvalidEntity = errors.New("inspect: invalid entity path")
	// ErrEmptyID is returned by [Inspector.Status] for an empty key: it would match every first
	// delivery.
	ErrEmptyID = errors.New("inspect: empty key, correlation id or message id")
	// ErrInvalidCursor is wrapped by [Inspector.ListPending] for a cursor it did not produce.
	ErrInvalidCursor = errors.New("inspect: invalid cursor")
	// ErrNotFound is wrapped when no message has the sequence number asked for.
	ErrNotFound = errors.New("inspect: no such message")
	// ErrNotPending is wrapped by [Inspector.Cancel] when the message with that sequence number is not
	// a scheduled retry copy (it is already receivable, or a message the retry library did not
	// schedule): cancelling it would delete a live message.
	ErrNotPending = errors.New("inspect: not a pending retry")
	// ErrNoRetryQueue is wrapped by [New] for a subscription without [Options.RetryQueue] (nor
	// [Options.SessionConsumer], for which it has none): a
	// subscription's retry copies are scheduled on another entity, and its last attempts are
	// dead-lettered there, so an inspector that read the subscription alone would answer "nothing
	// pending" for a place it never looked.
	ErrNoRetryQueue = errors.New("inspect: no retry queue configured for the subscription")
	// ErrSessionEntity is wrapped by the calls that would peek the entity itself (pending retries,
	// status, counts) when [Options.SessionConsumer] says it is a session entity: Service Bus refuses a
	// receiver without a session on it, so it can be read only session by session
	// ([Inspector.ListHeldSessions]).
	ErrSessionEntity = errors.New("inspect: the entity requires sessions")
	// ErrInvalidRef is wrapped by [ParseRef] and by the methods taking a [Ref] for a malformed one.
	ErrInvalidRef = errors.New("inspect: invalid message reference")
	// ErrAmbiguousRef is wrapped when a [Ref] without an entity could name a message in more than one
	// of the entities read (see [Ref]); name the entity.
	ErrAmbiguousRef = errors.New("inspect: sequence number without its entity")
	// ErrUnknownEntity is wrapped when a [Ref] names an entity that cannot hold what is asked for (a
	// dead letter outside the dead-letter queues read, a pending retry outside the retry entities).
	ErrUnknownEntity = errors.New("inspect: entity not read by this inspector")
	// ErrOtherEntity is wrapped when a [Ref] names a message of the retry queue whose chain belongs to
	// another entity (see [Scan.Foreign]): the inspector never acts on another consumer's messages.
	ErrOtherEntity = errors.New("inspect: message of another entity")
)

// Errors of the session calls ([Inspector.ListHeldSessions], [Inspector.PreviewRelease],
// [Inspector.Release]).
var (
	// ErrSessionLocked is wrapped when a session cannot be accepted because a receiver (a consumer)
	// holds its lock now: its state cannot be read or written until that receiver lets it go.
	ErrSessionLocked = errors.New("inspect: the session is locked by a consumer now")
	// ErrSessionChanged is wrapped by [Inspector.Release] when the session's state is no longer the one
	// its preview read: the release would not do what was shown, so it does nothing.
	ErrSessionChanged = errors.New("inspect: the session changed since the preview")
	// ErrWakeUpDropped is wrapped by [Inspector.Release] when the broker did not keep the wake-up it
	// sent (duplicate detection dropped it): the state is not written, and the release did nothing.
	ErrWakeUpDropped = errors.New("inspect: the broker dropped the release's wake-up")
	// ErrEmptySessionID is wrapped for an empty session id: Service Bus has a session "", but an
	// operator who typed nothing means none.
	ErrEmptySessionID = errors.New("inspect: empty session id")
)
