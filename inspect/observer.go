package inspect

import (
	"context"
)

// Names of the broker operations an [Observer] is told about, in [Call].Operation. They are the
// operation names of the Service Bus messaging semantic conventions where those name one ("peek",
// "receive", "complete", "abandon", "send"), so that an Observer can put them in
// messaging.operation.name as they are.
const (
	// OpPeek is a PeekMessages call: it reads messages without locking or changing them.
	OpPeek = "peek"
	// OpReceive is a ReceiveMessages call in peek-lock mode (a redrive or purge of dead letters).
	OpReceive = "receive"
	// OpComplete is a CompleteMessage call: a purged or redriven dead letter is deleted.
	OpComplete = "complete"
	// OpAbandon is an AbandonMessage call: a message received on the way to the selected ones is
	// released untouched.
	OpAbandon = "abandon"
	// OpSend is a SendMessage call: a redrive's fresh first delivery.
	OpSend = "send"
	// OpCancelScheduled is a CancelScheduledMessages call: a pending retry copy is cancelled.
	OpCancelScheduled = "cancel_scheduled"
	// OpListSessions is one page of a session listing (the client's ListSessions pager): the
	// sessions of a session entity that have a state. Messages counts the session ids returned.
	OpListSessions = "list_sessions"
	// OpAcceptSession is an AcceptSessionForQueue (or ForSubscription) call: it locks one session
	// by id, to read it ([Inspector.ListHeldSessions]) or release it ([Inspector.Release]).
	OpAcceptSession = "accept_session"
	// OpGetSessionState is a GetSessionState call on an accepted session.
	OpGetSessionState = "get_session_state"
	// OpSetSessionState is a SetSessionState call on an accepted session: a release writes the
	// session's new state.
	OpSetSessionState = "set_session_state"
)

// Observer is told about every call the operator tools make to Service Bus: the [Inspector]'s peeks,
// cancels, session reads and releases and, for the inspector they were selected with, the receives, sends, completes and
// abandons of a redrive or purge. It is how those calls are traced and measured without this package
// depending on a telemetry library: github.com/sbretry/retry/retryotel's Instrumentation is an
// Observer that turns each call into an OpenTelemetry span and metrics. Set it in
// [Options].Observer.
//
// An Observer must be safe for concurrent use: an Inspector may be used from several goroutines.
type Observer interface {
	// StartCall is called just before the call c describes, with the context the call is made in. It
	// returns the context to make the call in (nil means ctx unchanged; a non-nil one must derive from
	// ctx) and a function that is called exactly once, when the call returns, with its result. Neither
	// should block: the call waits for them.
	StartCall(ctx context.Context, c Call) (context.Context, func(CallResult))
}

// Call describes one broker call to an [Observer]. It carries no secret and no message body. More
// fields may be added.
type Call struct {
	// Operation is what the call does: one of the Op constants ([OpPeek], [OpSend], ...).
	Operation string
	// Entity is the path of the entity the call is made on, as the inspector reports paths: a queue
	// ("orders"), a subscription ("events/Subscriptions/billing"), or the dead-letter queue of either
	// ("orders/$DeadLetterQueue", "events/Subscriptions/billing/$DeadLetterQueue"). For a send it is
	// the queue sent to.
	Entity string
	// MessageID is the MessageID of the one message a complete, abandon, send or cancel acts on (for
	// a send, the fresh delivery's or the wake-up's); empty for a peek or a receive, and when the
	// message has none.
	MessageID string
	// SessionID is the session a session call (accept, state read or write) acts on, and of a peek or
	// send in a session; empty otherwise.
	SessionID string
	// Properties are, for a send, the application properties of the message about to be sent, so
	// that an Observer can read the trace context they carry (a redrive keeps the dead letter's
	// traceparent). They must not be changed. Nil for every other operation.
	Properties map[string]any
}

// CallResult is the outcome of a broker call, passed to the function [Observer].StartCall returned.
// More fields may be added.
type CallResult struct {
	// Messages is the number of messages a peek or a receive returned; zero for other operations.
	Messages int
	// Err is the call's error, nil when it succeeded. A receive that waited its whole wait and got
	// nothing reports no error: that is how a redrive learns the queue has no more for it.
	Err error
}

// Observer returns the [Options].Observer the Inspector was created with, nil when none was set, so
// that the tools acting on its selections (a redrive, a purge) report their calls to the same one.
func (in *Inspector) Observer() Observer { return in.opts.Observer }

// observe makes the call c describes through f, telling the Inspector's Observer, if any, about it. f
// returns how many messages it got (peeks) and its error, which observe returns.
func (in *Inspector) observe(ctx context.Context, c Call, f func(ctx context.Context) (int, error)) error {
	return Observe(ctx, in.opts.Observer, c, f)
}

// Observe makes the call c describes through f, telling obs about it when obs is not nil: StartCall
// before f, with f run in the context StartCall returned, and the function it returned after, with f's
// message count and error. It returns f's error. The packages that make broker calls for an Inspector's
// selections use it, so that every call is reported the same way.
func Observe(ctx context.Context, obs Observer, c Call, f func(ctx context.Context) (int, error)) error {
	if obs == nil {
		_, err := f(ctx)
		return err
	}
	cctx, done := obs.StartCall(ctx, c)
	if cctx == nil {
		cctx = ctx
	}
	n, err := f(cctx)
	if done != nil {
		done(CallResult{Messages: n, Err: err})
	}
	return err
}
