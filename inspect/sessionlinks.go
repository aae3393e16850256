package inspect

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"
)

// The links of the session calls: a listing of the entity's sessions, a session receiver accepted by
// id (the only way the Go SDK reads a session entity: a plain receiver on one is refused, "It is not
// possible for an entity that requires sessions to create a non-sessionful message receiver", so even a
// peek needs the session's lock), and, for a release, a sender to the queue.

// acceptTimeout bounds one accept of a session by id. Service Bus refuses at once a session another
// receiver holds; an accept with no answer within this bound is reported as locked too, since a
// session receiver that cannot lock the session cannot read it either.
const acceptTimeout = 10 * time.Second

// sessionReceiver lists the methods of *azservicebus.SessionReceiver the session calls use.
type sessionReceiver interface {
	GetSessionState(ctx context.Context, options *azservicebus.GetSessionStateOptions) ([]byte, error)
	SetSessionState(ctx context.Context, state []byte, options *azservicebus.SetSessionStateOptions) error
	PeekMessages(ctx context.Context, maxMessageCount int, options *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	RenewSessionLock(ctx context.Context, options *azservicebus.RenewSessionLockOptions) error
	LockedUntil() time.Time
	Close(ctx context.Context) error
}

// sender lists the methods of *azservicebus.Sender a release calls: it sends the wake-up.
type sender interface {
	SendMessage(ctx context.Context, message *azservicebus.Message, options *azservicebus.SendMessageOptions) error
	Close(ctx context.Context) error
}

// sessionPager is the page loop of the client's ListSessions pagers (*runtime.Pager).
type sessionPager interface {
	More() bool
	NextPage(ctx context.Context) (azservicebus.ListSessionsResponse, error)
}

var (
	_ sessionReceiver = (*azservicebus.SessionReceiver)(nil)
	_ sender          = (*azservicebus.Sender)(nil)
)

// sessionLinks opens the links of the session calls on the inspected entity; tests substitute fakes.
type sessionLinks interface {
	// statefulSessions lists the sessions of the entity that have a state.
	statefulSessions() sessionPager
	// acceptSession locks the session id.
	acceptSession(ctx context.Context, id string) (sessionReceiver, error)
	// entitySender opens the sender of a release's wake-up: on the entity, a queue, or for a
	// subscription on Options.WakeTo.
	entitySender() (sender, error)
}

// stateEpoch is the SessionStateUpdatedAfter of a listing of every session with a state: Service Bus
// lists, for any time before DateTime.MaxValue, the sessions whose state was set after it, and a
// session's state is dropped when it is cleared (the consumer clears it when a hold ends).
var stateEpoch = time.Unix(0, 0).UTC()

func (c *clientLinks) statefulSessions() sessionPager {
	opts := &azservicebus.ListSessionsOptions{SessionStateUpdatedAfter: &stateEpoch}
	if c.entity.IsSubscription() {
		return c.client.NewListSessionsForSubscriptionPager(c.entity.Topic, c.entity.Subscription, opts)
	}
	return c.client.NewListSessionsForQueuePager(c.entity.Queue, opts)
}

func (c *clientLinks) acceptSession(ctx context.Context, id string) (sessionReceiver, error) {
	if c.entity.IsSubscription() {
		return c.client.AcceptSessionForSubscription(ctx, c.entity.Topic, c.entity.Subscription, id, nil)
	}
	return c.client.AcceptSessionForQueue(ctx, c.entity.Queue, id, nil)
}

func (c *clientLinks) entitySender() (sender, error) {
	if c.entity.IsSubscription() {
		if c.wakeTo == "" {
			return nil, fmt.Errorf("inspect: %s is a subscription, which cannot be sent to (Options.WakeTo names none)", c.entity)
		}
		return c.client.NewSender(c.wakeTo, nil)
	}
	return c.client.NewSender(c.entity.Queue, nil)
}

// condSessionCannotBeLocked is the AMQP condition Service Bus refuses an accept with when another
// receiver holds the session. azservicebus v1.11 does not translate it: it comes as go-amqp's
// *amqp.Error.
const condSessionCannotBeLocked amqp.ErrCond = "com.microsoft:session-cannot-be-locked"

// isSessionLocked reports an accept refused because a receiver holds the session, or that had no
// answer within [acceptTimeout] (the SDK's CodeTimeout, or the bound's own deadline while the caller's
// ctx is still live).
func isSessionLocked(ctx context.Context, err error) bool {
	var amqpErr *amqp.Error
	if errors.As(err, &amqpErr) && amqpErr.Condition == condSessionCannotBeLocked {
		return true
	}
	var sbErr *azservicebus.Error
	if errors.As(err, &sbErr) && sbErr.Code == azservicebus.CodeTimeout {
		return true
	}
	return errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil
}

// openSession accepts the session id, bounded by [acceptTimeout], telling the Observer. A session a
// receiver holds returns an error wrapping [ErrSessionLocked] (and the broker's error).
func (in *Inspector) openSession(ctx context.Context, id string) (sessionReceiver, error) {
	if in.sessions == nil {
		return nil, fmt.Errorf("inspect: %s: no session links", in.entity)
	}
	var r sessionReceiver
	err := in.observe(ctx, Call{Operation: OpAcceptSession, Entity: in.entity.Path(), SessionID: id}, func(ctx context.Context) (int, error) {
		actx, cancel := context.WithTimeout(ctx, acceptTimeout)
		defer cancel()
		var err error
		r, err = in.sessions.acceptSession(actx, id)
		return 0, err
	})
	switch {
	case err == nil:
		return r, nil
	case isSessionLocked(ctx, err):
		return nil, fmt.Errorf("%w: %s session %q: %w", ErrSessionLocked, in.entity, id, err)
	}
	return nil, fmt.Errorf("inspect: accepting %s session %q: %w", in.entity, id, err)
}

// sessionState reads the state of the accepted session r.
func (in *Inspector) sessionState(ctx context.Context, r sessionReceiver, id string) ([]byte, error) {
	var state []byte
	err := in.observe(ctx, Call{Operation: OpGetSessionState, Entity: in.entity.Path(), SessionID: id}, func(ctx context.Context) (int, error) {
		var err error
		state, err = r.GetSessionState(ctx, nil)
		return 0, err
	})
	if err != nil {
		return nil, fmt.Errorf("inspect: reading the state of %s session %q: %w", in.entity, id, err)
	}
	return state, nil
}
