package retry

import (
	"context"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// Handler processes one message. Returning nil completes the message. Returning an error schedules a
// retry (or dead-letters the message once attempts are spent); wrap the error with [Permanent] to
// dead-letter at once, or with [RetryAfter] to choose the delay yourself.
//
// The context carries the message's [envelope.Envelope] (see [envelope.FromContext]) and is cancelled when the
// message lock is lost or the consumer shuts down; a handler that ignores it delays shutdown. A failure
// after the shutdown cancelled it leaves the message for redelivery without counting an attempt; a
// failure because a deadline expired (the handler's own, or one set by [Hooks].OnStart) is a failed
// attempt like any other. The message is the processor's: do not settle it yourself, and do not read
// msg.LockedUntil while the handler runs, because lock renewal updates it concurrently.
type Handler func(ctx context.Context, msg *azservicebus.ReceivedMessage) error

// Settler is the part of a receiver that settles messages. [Processor.Process] needs nothing else, so a
// team with its own receive loop can pass its *azservicebus.Receiver.
type Settler interface {
	CompleteMessage(ctx context.Context, msg *azservicebus.ReceivedMessage, options *azservicebus.CompleteMessageOptions) error
	DeadLetterMessage(ctx context.Context, msg *azservicebus.ReceivedMessage, options *azservicebus.DeadLetterOptions) error
	RenewMessageLock(ctx context.Context, msg *azservicebus.ReceivedMessage, options *azservicebus.RenewMessageLockOptions) error
}

// Receiver lists the methods of *azservicebus.Receiver that [Consumer] calls.
type Receiver interface {
	Settler
	ReceiveMessages(ctx context.Context, maxMessages int, options *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	Close(ctx context.Context) error
}

// Sender lists the methods of *azservicebus.Sender used to republish retries. ScheduleMessages is used
// (rather than SendMessage with a ScheduledEnqueueTime) because it returns the sequence number of the
// scheduled copy, which makes a pending retry observable and cancellable.
type Sender interface {
	ScheduleMessages(ctx context.Context, messages []*azservicebus.Message, scheduledEnqueueTime time.Time, options *azservicebus.ScheduleMessagesOptions) ([]int64, error)
	Close(ctx context.Context) error
}

// Compile-time proof that the SDK's types satisfy the interfaces above.
var (
	_ Receiver = (*azservicebus.Receiver)(nil)
	_ Sender   = (*azservicebus.Sender)(nil)
)

// Middleware wraps a [Handler] to add behaviour around every call: tracing, metrics, logging, or a
// classification of errors (for example marking validation errors [Permanent]) without forking the
// handler. Compose several with [Chain].
type Middleware func(Handler) Handler

// Chain returns h wrapped by mws, the first outermost: Chain(h, a, b) calls a, which calls b, which
// calls h. Nil middlewares are skipped.
func Chain(h Handler, mws ...Middleware) Handler {
	for i := len(mws) - 1; i >= 0; i-- {
		if mws[i] != nil {
			h = mws[i](h)
		}
	}
	return h
}
