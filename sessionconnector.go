package retry

import (
	"context"
	"fmt"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/internal/redact"
)

// SessionConnection is one live client of a session-enabled entity: the [SessionConsumer] accepts the
// sessions it holds through it.
type SessionConnection struct {
	// AcceptNext locks the next available session and returns its receiver, as
	// azservicebus.Client's AcceptNextSessionForQueue does. It waits for one until ctx's deadline; none
	// coming in time is an error wrapping an *azservicebus.Error with azservicebus.CodeTimeout (or
	// ctx's deadline), which the consumer takes as "no session now" and asks again. Any other error
	// means the connection is broken: the consumer closes it and builds a new one. It must not be nil.
	AcceptNext func(ctx context.Context) (SessionReceiver, error)
	// EntityPath is the entity the sessions are accepted from (a queue, or "topic/Subscriptions/sub");
	// it names retry chains and shows in the hooks. Empty means Options.EntityPath.
	EntityPath string
	// Sender schedules the wake-ups of durable holds (SessionOptions.DurableHolds) into the entity's
	// sessions: a sender to the queue itself. Nil means durable holds are not available on this
	// connection; the consumer then refuses to run with DurableHolds set. The built-in queue connectors
	// set it; the subscription connectors do not (a wake-up sent to the topic would reach every
	// subscription).
	Sender Sender
	// Close releases the client behind AcceptNext. The consumer closes every session receiver before.
	// Nil means nothing to release.
	Close func(ctx context.Context) error
	// Address is the namespace endpoint, as host:port (the built-in connectors set it); empty means
	// unknown. It is for telemetry: retryotel's SessionConnector reports it as server.address and server.port.
	Address string
}

// SessionConnector builds a fresh SessionConnection. The consumer calls it at start and after the
// connection broke; a broken connection is closed and never reused.
type SessionConnector func(ctx context.Context) (*SessionConnection, error)

// sessionPeekLock are the receiver options of every accept: the consumer settles each message itself.
var sessionPeekLock = azservicebus.SessionReceiverOptions{ReceiveMode: azservicebus.ReceiveModePeekLock}

// validateSessionSubscription checks the names and options of a session subscription connector.
func validateSessionSubscription(topic, subscription string, opts *ConnectOptions) error {
	switch {
	case topic == "":
		return &OptionError{Field: "topic", Reason: "must not be empty"}
	case subscription == "":
		return &OptionError{Field: "subscription", Reason: "must not be empty"}
	}
	return sessionConnectOptions(opts)
}

// sessionConnectOptions refuses the ConnectOptions a session connector has no use for, rather than
// ignoring them.
func sessionConnectOptions(opts *ConnectOptions) error {
	switch {
	case opts == nil:
		return nil
	case opts.SendConnectionString != "" || opts.SendCredential != nil:
		return &OptionError{Field: "ConnectOptions.SendConnectionString", Reason: "a session connector republishes nothing; it needs no send rights"}
	case opts.CheckSettings:
		return &OptionError{Field: "ConnectOptions.CheckSettings", Reason: "not supported by the session connectors yet"}
	case opts.Receiver != nil:
		return &OptionError{Field: "ConnectOptions.Receiver", Reason: "not used by the session connectors (sessions are always received in peek-lock mode)"}
	}
	return nil
}

// queueAccept accepts the next session of queue on a client.
func queueAccept(queue string) func(context.Context, *azservicebus.Client) (*azservicebus.SessionReceiver, error) {
	return func(ctx context.Context, client *azservicebus.Client) (*azservicebus.SessionReceiver, error) {
		opts := sessionPeekLock // a copy per call: no call can change what the next one passes
		return client.AcceptNextSessionForQueue(ctx, queue, &opts)
	}
}

// subscriptionAccept accepts the next session of a topic's subscription on a client.
func subscriptionAccept(topic, subscription string) func(context.Context, *azservicebus.Client) (*azservicebus.SessionReceiver, error) {
	return func(ctx context.Context, client *azservicebus.Client) (*azservicebus.SessionReceiver, error) {
		opts := sessionPeekLock
		return client.AcceptNextSessionForSubscription(ctx, topic, subscription, &opts)
	}
}

// sessionConnector returns the SessionConnector that opens a client (after looking the name up, see
// resolveHost) and accepts sessions of entity on it with accept; with a queue name in wakeTo, its
// connections schedule the wake-ups of durable holds into that queue.
func (cl *clients) sessionConnector(entity, wakeTo string, accept func(context.Context, *azservicebus.Client) (*azservicebus.SessionReceiver, error)) SessionConnector {
	return func(ctx context.Context) (*SessionConnection, error) {
		if err := resolveHost(ctx, cl.host, cl.opts); err != nil {
			return nil, err
		}
		// One client per connection; it connects lazily, so a dead namespace shows in the first
		// accept, which the consumer then treats as a broken connection.
		client, err := cl.newClient()
		if err != nil {
			return nil, redact.Wrap(fmt.Errorf("retry: creating client: %w", err))
		}
		var sender Sender
		if wakeTo != "" {
			// Links open lazily too: a sender costs nothing until the first wake-up.
			s, err := client.NewSender(wakeTo, nil)
			if err != nil {
				_ = client.Close(ctx)
				return nil, redact.Wrap(fmt.Errorf("retry: creating the sender of %q: %w", wakeTo, err))
			}
			sender = s
		}
		return &SessionConnection{
			Sender: sender,
			AcceptNext: func(ctx context.Context) (SessionReceiver, error) {
				r, err := accept(ctx, client)
				if err != nil {
					// Never a typed nil in the interface.
					return nil, redact.Wrap(fmt.Errorf("retry: accepting the next session of %q: %w", entity, err))
				}
				return r, nil
			},
			EntityPath: entity,
			Close:      client.Close,
			Address:    cl.addr,
		}, nil
	}
}

// SessionReceiver is what the session consumer calls on the receiver of one session: the methods of
// *azservicebus.SessionReceiver it uses, so that a test can pass a fake (retrytest's SessionReceiver
// is one). AbandonMessage is not among them: a message the consumer gives back is left unsettled and
// the receiver closed, which returns it to the session in order without counting a delivery.
type SessionReceiver interface {
	ReceiveMessages(ctx context.Context, maxMessages int, options *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	CompleteMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.CompleteMessageOptions) error
	DeadLetterMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.DeadLetterOptions) error
	RenewSessionLock(ctx context.Context, options *azservicebus.RenewSessionLockOptions) error
	// The durable hold's calls (sessiondurable.go): a held message and its followers are deferred and
	// received back by sequence number; what blocks the session is kept in its state.
	DeferMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.DeferMessageOptions) error
	ReceiveDeferredMessages(ctx context.Context, sequenceNumbers []int64, options *azservicebus.ReceiveDeferredMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	GetSessionState(ctx context.Context, options *azservicebus.GetSessionStateOptions) ([]byte, error)
	SetSessionState(ctx context.Context, state []byte, options *azservicebus.SetSessionStateOptions) error
	SessionID() string
	LockedUntil() time.Time
	Close(ctx context.Context) error
}

var _ SessionReceiver = (*azservicebus.SessionReceiver)(nil)

// SessionQueue returns a SessionConnector for the session-enabled queue. Of the namespace's
// ConnectOptions, only Client is used: nothing is republished, so the send rights and the settings
// check are refused.
func (n *Namespace) SessionQueue(queue string) (SessionConnector, error) {
	if n.err != nil {
		return nil, n.err
	}
	if queue == "" {
		return nil, &OptionError{Field: "queue", Reason: "must not be empty"}
	}
	if err := sessionConnectOptions(n.opts); err != nil {
		return nil, err
	}
	return n.cl.sessionConnector(queue, queue, queueAccept(queue)), nil
}

// SessionSubscription returns a SessionConnector for the session-enabled subscription of topic. No
// retry queue is needed: retries happen in place.
func (n *Namespace) SessionSubscription(topic, subscription string) (SessionConnector, error) {
	if n.err != nil {
		return nil, n.err
	}
	if err := validateSessionSubscription(topic, subscription, n.opts); err != nil {
		return nil, err
	}
	return n.cl.sessionConnector(SubscriptionPath(topic, subscription), "", subscriptionAccept(topic, subscription)), nil
}
