package retrytest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"

	"github.com/sbretry/retry/sbemu/broker"
)

// Session entities ([BrokerOptions.RequiresSession]). The semantics are the broker model's
// (sbemu/broker/session.go and defer.go, which cite Service Bus for each rule): a session is locked by
// one receiver at a time for the entity's lock duration; its messages come in sequence order and only to
// that receiver; the message locks live under the session lock, so they last while it is renewed and
// end with it; a receiver that closes gives the session up at once and its unsettled messages go back,
// in order and without counting the delivery, while a session lock that runs out counts it. This file
// is the in-process door on that model, shaped like the SDK's: the accept calls of azservicebus.Client
// and the methods of *azservicebus.SessionReceiver, with the errors the SDK returns.

// DefaultAcceptNextSessionTimeout is how long [Broker.AcceptNextSession] waits for a session when its
// context has no deadline: the one minute Service Bus waits when the SDK sends no
// com.microsoft:timeout (azservicebus v1.11.0 internal/errors.go TransformError: "It waits, up to one
// minute, and then returns this error"), as the emulator does.
const DefaultAcceptNextSessionTimeout = time.Minute

// maxAcceptNextJitter bounds the margin taken off a context's deadline for the accept timeout, as in
// the SDK (session_receiver.go maxAcceptNextSessionTimeoutJitter).
const maxAcceptNextJitter = 100 * time.Millisecond

// The answers Service Bus gives a receiver of the wrong kind, as the emulator gives them (sbemu
// sessions.go); the SDK's live test TestSessionReceiver_nonSessionReceiver checks the first one's text
// and its condition, amqp:not-allowed.
const (
	nonSessionReceiverText = "It is not possible for an entity that requires sessions to create a non-sessionful message receiver."
	sessionReceiverText    = "It is not possible for an entity that does not require sessions to create a sessionful message receiver."
	// condSessionCannotBeLocked refuses an accept of a session another receiver holds.
	condSessionCannotBeLocked amqp.ErrCond = "com.microsoft:session-cannot-be-locked"
)

// errNonSessionReceiver is the error of a plain receiver on a session-aware entity. Through the SDK,
// its first call attaches the link, Service Bus refuses it with amqp:not-allowed, and the SDK hands
// the *amqp.Error back as it is (internal/errors.go TransformError has no code for it; the live test
// TestSessionReceiver_nonSessionReceiver reads it with errors.As), so it is not an *azservicebus.Error.
func errNonSessionReceiver(src *broker.Queue) error {
	return fmt.Errorf("retrytest: receiver of %s: %w", src.Name(),
		&amqp.Error{Condition: amqp.ErrCondNotAllowed, Description: nonSessionReceiverText})
}

// AcceptSession locks the session sessionID of the queue, or on a topic of the subscription
// [BrokerOptions.EntityPath] names (else the first), and returns a receiver of it, as
// azservicebus.Client's AcceptSessionForQueue does. The session need not have messages yet. Like the
// SDK's, the receiver is in peek-lock mode and initialized at once: a session another receiver holds
// is refused with the *amqp.Error com.microsoft:session-cannot-be-locked, an entity without sessions, a
// session id over 128 characters or not valid UTF-8 with amqp:not-allowed. The empty id is a session
// id like any other, as on Service Bus. ctx only needs to be live: the accept does not wait.
func (b *Broker) AcceptSession(ctx context.Context, sessionID string) (*SessionReceiver, error) {
	return b.acceptSession(ctx, b.consumed, sessionID)
}

// AcceptNextSession locks the next available session, one no receiver holds with a message to receive
// now (the one whose first message is oldest), and returns a receiver of it, as
// azservicebus.Client's AcceptNextSessionForQueue does. A session with only a state, only deferred
// messages or only messages scheduled for later is not available.
//
// It waits for one on the broker's clock, as Service Bus waits on its own: for as long as the SDK asks
// (the time left before ctx's deadline, less the SDK's margin of 1 % and at most 100 ms, so that the
// broker's answer comes before the deadline), or [DefaultAcceptNextSessionTimeout] when ctx has no
// deadline. When that wait ends it returns an error wrapping an *azservicebus.Error with
// azservicebus.CodeTimeout, which is what the SDK returns (client.go AcceptNextSessionForQueue); when
// ctx ends first, ctx's error. The deadline is measured in real time, as the SDK measures it: on a mock
// clock that is not advanced, ctx ends first. Use a context without deadline and advance the mock
// clock, or run the test in a testing/synctest bubble.
func (b *Broker) AcceptNextSession(ctx context.Context) (*SessionReceiver, error) {
	return b.acceptNextSession(ctx, b.consumed)
}

// AcceptSubscriptionSession is [Broker.AcceptSession] on the topic subscription named subscription
// (ignoring case), as AcceptSessionForSubscription is in the SDK. Other names, and a queue broker,
// are an error.
func (b *Broker) AcceptSubscriptionSession(ctx context.Context, subscription, sessionID string) (*SessionReceiver, error) {
	sub, err := b.subscription(subscription)
	if err != nil {
		return nil, err
	}
	return b.acceptSession(ctx, sub, sessionID)
}

// AcceptNextSubscriptionSession is [Broker.AcceptNextSession] on the topic subscription named
// subscription (ignoring case), as AcceptNextSessionForSubscription is in the SDK. Other names, and a
// queue broker, are an error.
func (b *Broker) AcceptNextSubscriptionSession(ctx context.Context, subscription string) (*SessionReceiver, error) {
	sub, err := b.subscription(subscription)
	if err != nil {
		return nil, err
	}
	return b.acceptNextSession(ctx, sub)
}

// subscription finds a subscription of the topic by name.
func (b *Broker) subscription(name string) (*broker.Queue, error) {
	sub, ok := b.model.Subscription(b.name, name)
	if !ok {
		return nil, fmt.Errorf("retrytest: no subscription %q on %q", name, b.name)
	}
	return sub, nil
}

func (b *Broker) acceptSession(ctx context.Context, src *broker.Queue, id string) (*SessionReceiver, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.takeFaultLocked(OpAccept); err != nil {
		return nil, err
	}
	conn := b.newConnectionLocked()
	lock, until, err := src.AcceptSession(id, conn.id)
	if err != nil {
		return nil, acceptError(src, err)
	}
	b.notifyLocked()
	return &SessionReceiver{conn: conn, src: src, lock: lock, lockedUntil: until}, nil
}

func (b *Broker) acceptNextSession(ctx context.Context, src *broker.Queue) (*SessionReceiver, error) {
	timeout := acceptNextTimeout(ctx)
	b.mu.Lock()
	acceptBy := b.clock.Now().Add(timeout)
	conn := b.newConnectionLocked()
	b.mu.Unlock()
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		b.mu.Lock()
		if err := b.takeFaultLocked(OpAccept); err != nil {
			b.mu.Unlock()
			return nil, err
		}
		// Advance first: a session becomes available when a scheduled message falls due, a topic fans
		// a message out, or a session lock runs out.
		next := b.model.Advance()
		lock, until, err := src.TryAcceptNextSession(conn.id)
		if err != nil {
			b.mu.Unlock()
			return nil, acceptError(src, err)
		}
		if lock != nil {
			b.notifyLocked()
			b.mu.Unlock()
			return &SessionReceiver{conn: conn, src: src, lock: lock, lockedUntil: until}, nil
		}
		if !b.clock.Now().Before(acceptBy) {
			b.mu.Unlock()
			return nil, fmt.Errorf("retrytest: no session of %s became available within %v: %w",
				src.Name(), timeout, &azservicebus.Error{Code: azservicebus.CodeTimeout})
		}
		if next.IsZero() || acceptBy.Before(next) {
			next = acceptBy
		}
		// As in receive: sleep until the broker changes, the next deadline or the end of the wait
		// comes on the clock, or ctx ends.
		timer, passed := b.timerLocked(next)
		changed := b.changed
		b.mu.Unlock()
		if passed {
			continue
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
		case <-timer:
		}
	}
}

// acceptNextTimeout is how long an accept of the next session waits: what the SDK sends as
// com.microsoft:timeout for ctx (session_receiver.go calculateAcceptNextSessionTimeout, with the
// largest margin its jitter takes, so that the answer is deterministic), or the service's default when
// ctx has no deadline or less than a millisecond is left.
func acceptNextTimeout(ctx context.Context) time.Duration {
	deadline, ok := ctx.Deadline()
	if !ok {
		return DefaultAcceptNextSessionTimeout
	}
	d := time.Until(deadline)
	d -= min(d/100, maxAcceptNextJitter)
	if d < time.Millisecond {
		return DefaultAcceptNextSessionTimeout
	}
	return d
}

// acceptError turns the model's refusal of an accept into the error the SDK returns for Service Bus's
// (the conditions of sbemu sessions.go sessionErrorCondition; the SDK returns these *amqp.Error values
// untransformed, internal/errors.go).
func acceptError(src *broker.Queue, err error) error {
	switch {
	case errors.Is(err, broker.ErrSessionCannotBeLocked):
		return fmt.Errorf("retrytest: %w", &amqp.Error{Condition: condSessionCannotBeLocked, Description: err.Error()})
	case errors.Is(err, broker.ErrSessionRequired):
		return fmt.Errorf("retrytest: session receiver of %s: %w", src.Name(), &amqp.Error{Condition: amqp.ErrCondNotAllowed, Description: sessionReceiverText})
	case errors.Is(err, broker.ErrInvalidSessionID):
		return fmt.Errorf("retrytest: %w", &amqp.Error{Condition: amqp.ErrCondNotAllowed, Description: err.Error()})
	}
	return sdkError(err)
}

// SessionReceiver receives the messages of one session, which it holds locked: what
// *azservicebus.SessionReceiver is to the SDK, with the same methods and signatures, so a consumer
// written against a small interface of those methods runs on either. Get one from
// [Broker.AcceptSession], [Broker.AcceptNextSession] or their subscription forms. It is safe for
// concurrent use.
//
// Once the session lock has ended (it ran out on the clock, or [Broker.ExpireLocks]), every call but
// Close, SessionID and LockedUntil fails with an error wrapping an *azservicebus.Error with
// azservicebus.CodeLockLost, and the session may be accepted by another receiver. (The SDK first tries
// to recover the link, which takes seconds and may end in com.microsoft:session-cannot-be-locked; the
// code it settles on for a lost lock is this one.) After Close, calls fail with
// azservicebus.CodeClosed.
type SessionReceiver struct {
	// conn owns the session lock and the message locks in the model; it is the receiver's own, as
	// every SDK receiver has its own link.
	conn *connection
	src  *broker.Queue
	lock *broker.SessionLock

	mu          sync.Mutex // guards the fields below
	lockedUntil time.Time
	lastPeeked  int64
}

// SessionID is the id of the session the receiver holds.
func (r *SessionReceiver) SessionID() string { return r.lock.SessionID() }

// LockedUntil is when the session lock expires, as the broker granted it on accept or on the last
// [SessionReceiver.RenewSessionLock]. The messages received in the session are locked as long.
func (r *SessionReceiver) LockedUntil() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lockedUntil
}

// ReceiveMessages locks and returns up to maxMessages (1 to 5000, as the SDK allows) of the session's
// messages in sequence order, blocking until at least one is available, the session lock ends, the
// receiver closes or ctx ends (ctx's error). Like [Broker.Receiver]'s, it returns what is available at
// once instead of waiting a moment for more.
func (r *SessionReceiver) ReceiveMessages(ctx context.Context, maxMessages int, _ *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if maxMessages < 1 || maxMessages > maxReceive {
		return nil, fmt.Errorf("retrytest: maxMessages must be in [1, %d], got %d", maxReceive, maxMessages)
	}
	b := r.conn.b
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		b.mu.Lock()
		if err := r.callAllowedLocked(OpReceive); err != nil {
			b.mu.Unlock()
			return nil, err
		}
		next := b.model.Advance()
		if !r.lock.Held() {
			b.mu.Unlock()
			return nil, r.lockLost()
		}
		var out []*azservicebus.ReceivedMessage
		for len(out) < maxMessages {
			d, ok := r.lock.TryReceive(broker.PeekLock)
			if !ok {
				break
			}
			out = append(out, receivedMessage(d.Message, headerDeliveryCount(d.Message)+1, d.LockToken))
		}
		if len(out) > 0 {
			b.notifyLocked()
			b.mu.Unlock()
			return out, nil
		}
		// The session lock's expiry is among the model's deadlines, so the timer also ends the wait
		// when the lock runs out.
		timer, passed := b.timerLocked(next)
		changed, closed := b.changed, r.conn.closed
		b.mu.Unlock()
		if passed {
			continue
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
		case <-timer:
		case <-closed:
		}
	}
}

// CompleteMessage removes msg, received by this receiver, from the session. It counts in
// [Broker.Stats] and [Broker.Completed] as a completion through any receiver does.
func (r *SessionReceiver) CompleteMessage(ctx context.Context, msg *azservicebus.ReceivedMessage, _ *azservicebus.CompleteMessageOptions) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return r.conn.b.complete(r.conn, r.src, msg)
}

// AbandonMessage gives msg back to the session, at its place in sequence order, so it is the next
// message this receiver gets; the delivery counts, and the options' PropertiesToModify are merged
// into its application properties.
func (r *SessionReceiver) AbandonMessage(ctx context.Context, msg *azservicebus.ReceivedMessage, opts *azservicebus.AbandonMessageOptions) error {
	var props map[string]any
	if opts != nil {
		props = opts.PropertiesToModify
	}
	return r.settle(ctx, OpAbandon, msg, func(token [16]byte) error { return r.src.Abandon(token, anyKeys(props)) })
}

// DeferMessage sets msg aside: it stays in the session but only
// [SessionReceiver.ReceiveDeferredMessages] gets it back, by its sequence number. The options'
// PropertiesToModify are merged into its application properties.
func (r *SessionReceiver) DeferMessage(ctx context.Context, msg *azservicebus.ReceivedMessage, opts *azservicebus.DeferMessageOptions) error {
	var props map[string]any
	if opts != nil {
		props = opts.PropertiesToModify
	}
	return r.settle(ctx, OpDefer, msg, func(token [16]byte) error { return r.src.Defer(token, anyKeys(props)) })
}

// DeadLetterMessage moves msg to the entity's dead-letter queue (which has no sessions) with the
// reason, description and properties of opts.
func (r *SessionReceiver) DeadLetterMessage(ctx context.Context, msg *azservicebus.ReceivedMessage, opts *azservicebus.DeadLetterOptions) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return r.conn.b.deadLetter(r.conn, r.src, msg, opts)
}

// settle runs a settlement of msg that the broker records nothing about, after the common checks.
func (r *SessionReceiver) settle(ctx context.Context, op Op, msg *azservicebus.ReceivedMessage, do func(token [16]byte) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b := r.conn.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.settleLocked(op, r.conn, msg); err != nil {
		return err
	}
	if err := do(msg.LockToken); err != nil {
		return sdkError(err)
	}
	b.notifyLocked()
	return nil
}

// ReceiveDeferredMessages locks and returns the session's deferred messages with the given sequence
// numbers, in the order asked, under the session lock; their delivery counts and their State is
// azservicebus.MessageStateDeferred. It is all or nothing: a number that is not a deferred message of
// this session (unknown, not deferred, of another session, already received, or expired, which
// dead-letters or drops it as its entity says) returns an error wrapping an *azservicebus.Error with
// azservicebus.CodeNotFound, what the SDK makes of Service Bus's 404, and receives nothing. No numbers
// at all is an error too.
func (r *SessionReceiver) ReceiveDeferredMessages(ctx context.Context, sequenceNumbers []int64, _ *azservicebus.ReceiveDeferredMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(sequenceNumbers) == 0 {
		return nil, errors.New("retrytest: ReceiveDeferredMessages needs at least one sequence number")
	}
	b := r.conn.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := r.callAllowedLocked(OpReceive); err != nil {
		return nil, err
	}
	ds, err := r.src.ReceiveDeferredInSession(broker.PeekLock, r.conn.id, r.SessionID(), sequenceNumbers...)
	if err != nil {
		return nil, r.sessionError(err)
	}
	out := make([]*azservicebus.ReceivedMessage, len(ds))
	for i, d := range ds {
		out[i] = receivedMessage(d.Message, headerDeliveryCount(d.Message)+1, d.LockToken)
	}
	b.notifyLocked()
	return out, nil
}

// PeekMessages returns up to maxMessageCount of the session's messages in sequence order (active,
// locked, deferred and scheduled ones, with their State) without locking them, from the options'
// FromSequenceNumber or else from just after the last message the previous PeekMessages returned, as
// the SDK's does.
func (r *SessionReceiver) PeekMessages(ctx context.Context, maxMessageCount int, opts *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if maxMessageCount < 1 {
		return nil, fmt.Errorf("retrytest: maxMessageCount must be at least 1, got %d", maxMessageCount)
	}
	b := r.conn.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := r.callAllowedLocked(OpReceive); err != nil {
		return nil, err
	}
	if !r.lock.Held() {
		return nil, r.lockLost()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	from, implicit := r.lastPeeked+1, true
	if opts != nil && opts.FromSequenceNumber != nil {
		from, implicit = *opts.FromSequenceNumber, false
	}
	ds := r.src.PeekSession(r.SessionID(), from, maxMessageCount)
	out := make([]*azservicebus.ReceivedMessage, len(ds))
	for i, d := range ds {
		// Through the SDK a peeked message's DeliveryCount is the header's plus one, as for any other.
		out[i] = receivedMessage(d.Message, headerDeliveryCount(d.Message)+1, [16]byte{})
	}
	if implicit && len(ds) > 0 {
		r.lastPeeked = ds[len(ds)-1].SequenceNumber
	}
	return out, nil
}

// GetSessionState returns the session's state, nil when none is set.
func (r *SessionReceiver) GetSessionState(ctx context.Context, _ *azservicebus.GetSessionStateOptions) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b := r.conn.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := r.callAllowedLocked(OpSessionState); err != nil {
		return nil, err
	}
	state, err := r.src.SessionState(r.SessionID(), r.conn.id)
	if err != nil {
		return nil, r.sessionError(err)
	}
	return state, nil
}

// SetSessionState replaces the session's state with a copy of state; nil clears it. The state lives
// with the session, whether or not it has messages, until it is cleared. A state larger than the
// entity's MaxMessageSize ([BrokerOptions.MaxMessageSize], 256 KiB by default) is refused with an error
// wrapping azservicebus.ErrMessageTooLarge and the state is left as it was: Service Bus bounds a
// session's state by the entity's message size, as the emulator does (sbemu/broker/session.go
// SetSessionState).
func (r *SessionReceiver) SetSessionState(ctx context.Context, state []byte, _ *azservicebus.SetSessionStateOptions) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b := r.conn.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := r.callAllowedLocked(OpSessionState); err != nil {
		return err
	}
	if err := r.src.SetSessionState(r.SessionID(), r.conn.id, state); err != nil {
		return r.sessionError(err)
	}
	b.notifyLocked()
	return nil
}

// RenewSessionLock extends the session lock, and with it the locks of the messages received in the
// session, by the entity's lock duration from now; [SessionReceiver.LockedUntil] reports the new
// expiry. (Session receivers have no RenewMessageLock: the session lock is what keeps their messages.)
func (r *SessionReceiver) RenewSessionLock(ctx context.Context, _ *azservicebus.RenewSessionLockOptions) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b := r.conn.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := r.callAllowedLocked(OpRenew); err != nil {
		return err
	}
	until, err := r.src.RenewSessionLock(r.SessionID(), r.conn.id)
	if err != nil {
		return r.sessionError(err)
	}
	r.mu.Lock()
	r.lockedUntil = until
	r.mu.Unlock()
	b.notifyLocked()
	return nil
}

// Close gives the session up at once, so another receiver can accept it: the messages received and
// not settled go back to the session in sequence order, their delivery not counted, as Service Bus
// does when a session receiver closes. It is idempotent; later calls of the receiver fail with
// azservicebus.CodeClosed.
func (r *SessionReceiver) Close(ctx context.Context) error {
	b := r.conn.b
	b.mu.Lock()
	r.lock.Release() // a no-op once the lock has ended
	b.notifyLocked()
	b.mu.Unlock()
	return r.conn.close(ctx)
}

// callAllowedLocked runs the common checks of a call: an open receiver, no injected fault of op. b.mu
// must be held.
func (r *SessionReceiver) callAllowedLocked(op Op) error {
	if err := r.conn.checkLocked(); err != nil {
		return err
	}
	return r.conn.b.takeFaultLocked(op)
}

// lockLost is the error of a call on a session whose lock has ended.
func (r *SessionReceiver) lockLost() error {
	return fmt.Errorf("retrytest: the lock on session %q of %s has ended: %w",
		r.SessionID(), r.src.Name(), &azservicebus.Error{Code: azservicebus.CodeLockLost})
}

// sessionError turns a model error of a session call into the SDK's.
func (r *SessionReceiver) sessionError(err error) error {
	switch {
	case errors.Is(err, broker.ErrSessionLockLost):
		return r.lockLost()
	case errors.Is(err, broker.ErrNotFound):
		return fmt.Errorf("retrytest: %w: %w", &azservicebus.Error{Code: azservicebus.CodeNotFound}, err)
	}
	return sdkError(err)
}

// anyKeys converts the SDK's PropertiesToModify to the model's form; nil stays nil.
func anyKeys(props map[string]any) map[any]any {
	if props == nil {
		return nil
	}
	out := make(map[any]any, len(props))
	for k, v := range props {
		out[k] = v
	}
	return out
}
