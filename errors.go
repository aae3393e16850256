package retry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"
	"github.com/sbretry/retry/envelope"
)

// Sentinel errors. Compare with [errors.Is].
var (
	// ErrInvalidOptions is wrapped by every error that [NewConsumer] and [NewProcessor] return for
	// invalid [Options].
	ErrInvalidOptions = errors.New("retry: invalid options")
	// ErrInvalidEnvelope is wrapped by [envelope.Decode] when a message carries retry properties of the
	// wrong type or out of range. Such a message is dead-lettered without calling the handler. It is
	// [envelope.ErrInvalid].
	ErrInvalidEnvelope = envelope.ErrInvalid
	// ErrLockLost is the cause of a handler context cancelled because the message lock (for a
	// [SessionConsumer], the session lock) was lost; the broker redelivers the message, so nothing is
	// republished or settled.
	ErrLockLost = errors.New("retry: message lock lost")
	// ErrAlreadyRunning is returned by [Consumer.Run] when it is called while another Run is active.
	ErrAlreadyRunning = errors.New("retry: consumer already running")
	// ErrHandlerPanic wraps a panic recovered from a handler; the delivery counts as a failed attempt.
	ErrHandlerPanic = errors.New("retry: handler panicked")
	// ErrNilMessage is returned by [Processor.Process] for a nil message. It is [envelope.ErrNilMessage].
	ErrNilMessage = envelope.ErrNilMessage
	// ErrNilSettler is returned by [Processor.Process] for a nil settler.
	ErrNilSettler = errors.New("retry: nil settler")
	// ErrNotConfigured is returned by the methods of a zero-value [Consumer] or [Processor]; use
	// [NewConsumer] and [NewProcessor].
	ErrNotConfigured = errors.New("retry: not configured; use NewConsumer or NewProcessor")
	// ErrShutdown is the cause of a handler context's cancellation when a shutdown's grace elapsed
	// (Options.ShutdownGrace): context.Cause(ctx) returns it, telling a shutdown from the handler's
	// own cancellations and from a lost lock ([ErrLockLost]). A handler that then fails is left for
	// redelivery without an attempt counted. It wraps context.Canceled, so code that asks
	// errors.Is(cause, context.Canceled) still sees a cancellation.
	ErrShutdown = fmt.Errorf("retry: the consumer is shutting down and its grace period elapsed: %w", context.Canceled)
	// ErrShutdownTimeout is wrapped by the error [Consumer.Run] returns when handlers were still running
	// after ShutdownGrace plus one SettleTimeout (see [ShutdownError]).
	ErrShutdownTimeout = errors.New("retry: shutdown timed out")
	// ErrEntityNotFound is wrapped by the error [Consumer.Run] returns when the first connect finds that
	// the queue or subscription does not exist (unless Options.RetryStartupErrors is set).
	ErrEntityNotFound = errors.New("retry: entity not found")
	// ErrUnauthorized is wrapped by the error [Consumer.Run] returns when the first connect is refused
	// for lack of rights, including the right to send to the republish target (unless
	// Options.RetryStartupErrors is set).
	ErrUnauthorized = errors.New("retry: unauthorized")
	// ErrSessionEntity is wrapped by the error [Consumer.Run] returns when a connection receives from a
	// session-enabled entity and Options.AllowReorder is not set: a retry copy would rejoin its session
	// behind later messages. Retrying cannot fix it, so Options.RetryStartupErrors does not apply. It is
	// also wrapped by the startup error of a receiver that holds no session, which such an entity
	// refuses, when the settings check (ConnectOptions.CheckSettings) can tell that it requires
	// sessions.
	ErrSessionEntity = errors.New("retry: the entity requires sessions, and a Consumer's retry copies would rejoin their session behind later messages; use NewSessionConsumer to keep the order, or set Options.AllowReorder to accept the reordering")
)

// permanentError marks an error as not worth retrying.
type permanentError struct{ err error }

func (e *permanentError) Error() string {
	if e.err == nil {
		return "retry: permanent failure"
	}
	return e.err.Error()
}
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err so that the message is dead-lettered at once instead of retried. Permanent(nil)
// returns nil, so `return retry.Permanent(err)` is safe on success paths too. The marker only steers the
// processor; the dead-letter description carries err's own text.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err (or any error it wraps) was marked with [Permanent].
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// RetryAfterError asks for the next attempt after Delay instead of the backoff's delay, e.g. from an
// HTTP 429 Retry-After header. The delay is still bounded by the backoff's cap (see DelayBounds in package backoff).
type RetryAfterError struct {
	Delay time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("retry: retry after %s", e.Delay)
	}
	return e.Err.Error()
}

// Unwrap returns the wrapped error.
func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryAfter returns an error that schedules the next attempt after d. A negative d counts as zero. Unlike
// [Permanent], RetryAfter(d, nil) is not nil: asking for a later retry is itself a failure.
func RetryAfter(d time.Duration, err error) error {
	if d < 0 {
		d = 0
	}
	return &RetryAfterError{Delay: d, Err: err}
}

// sdkCode returns the azservicebus error code carried by err, if any.
func sdkCode(err error) (azservicebus.Code, bool) {
	var sbErr *azservicebus.Error
	if errors.As(err, &sbErr) {
		return sbErr.Code, true
	}
	return "", false
}

// brokerWillRedeliver reports whether a settle failure means the lock is gone, so the broker
// redelivers the message on its own. CodeClosed counts too: a closed client can no longer settle, and
// the broker redelivers the message when its lock expires (or earlier, when the link goes away). Such
// failures are logged at warn rather than error, because
// nothing is lost and no one needs to act.
func brokerWillRedeliver(err error) bool {
	code, ok := sdkCode(err)
	return ok && (code == azservicebus.CodeLockLost || code == azservicebus.CodeConnectionLost || code == azservicebus.CodeClosed)
}

// ShutdownError is returned by [Consumer.Run] when handlers ignored their cancelled context past the
// shutdown bound. Run closed the connection anyway, so nothing they do afterwards is settled; their
// messages are redelivered when the locks run out. It wraps [ErrShutdownTimeout].
type ShutdownError struct {
	// Running is how many handlers were still running.
	Running int
}

func (e *ShutdownError) Error() string {
	return fmt.Sprintf("retry: shutdown timed out with %d handler(s) still running; their messages will be redelivered", e.Running)
}

// Unwrap returns [ErrShutdownTimeout].
func (e *ShutdownError) Unwrap() error { return ErrShutdownTimeout }

// OptionError reports an invalid option field. It wraps [ErrInvalidOptions].
type OptionError struct {
	Field  string
	Reason string
}

func (e *OptionError) Error() string {
	return fmt.Sprintf("retry: invalid options: %s: %s", e.Field, e.Reason)
}

// Unwrap returns [ErrInvalidOptions].
func (e *OptionError) Unwrap() error { return ErrInvalidOptions }

// startupError classifies a connect failure that retrying cannot fix: a missing entity, or a
// credential without the rights needed. It returns nil for anything else.
func startupError(err error) error {
	code, ok := sdkCode(err)
	switch {
	case errors.Is(err, ErrEntityNotFound), errors.Is(err, ErrUnauthorized):
		return err
	case ok && code == azservicebus.CodeNotFound, isAMQPCondition(err, amqp.ErrCondNotFound):
		// The SDK maps a 404 from the management node to CodeNotFound, but passes the attach refusal
		// for a missing entity through as the AMQP error amqp:not-found (azservicebus v1.11,
		// internal/errors.go TransformError).
		return fmt.Errorf("%w: %w", ErrEntityNotFound, err)
	case ok && code == azservicebus.CodeUnauthorizedAccess:
		return fmt.Errorf("%w: %w", ErrUnauthorized, err)
	}
	return nil
}

// isAMQPCondition reports whether err carries an AMQP error with the given condition: a typed check on
// go-amqp's *amqp.Error, the type the SDK wraps for errors it does not translate.
func isAMQPCondition(err error, cond amqp.ErrCond) bool {
	var amqpErr *amqp.Error
	return errors.As(err, &amqpErr) && amqpErr.Condition == cond
}
