package retrytest

import (
	"context"
	"fmt"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/sbemu/broker"
)

// connection is one client's view of the broker. Once closed, its operations fail with
// azservicebus.CodeClosed, like a closed SDK client.
type connection struct {
	b *Broker
	// id owns the locks taken through the connection in the broker model.
	id     uint64
	closed chan struct{}
	done   bool
}

// checkLocked fails every call on a closed connection with CodeClosed, the code the SDK returns for a
// closed client; the consumer treats it as "the broker will redeliver". b.mu must be held.
func (c *connection) checkLocked() error {
	if c.done {
		return &azservicebus.Error{Code: azservicebus.CodeClosed}
	}
	return nil
}

// close marks the connection closed and wakes its blocked receives. It is idempotent.
func (c *connection) close(context.Context) error {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	if !c.done {
		c.done = true
		close(c.closed)
		if c.b.opts.ReleaseLocksOnClose {
			c.b.model.ReleaseOwner(c.id)
			c.b.notifyLocked()
		}
	}
	return nil
}

// newConnection returns an open connection on b; receivers and senders built on it share its state.
func (b *Broker) newConnection() *connection {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.newConnectionLocked()
}

// newConnectionLocked is newConnection with b.mu held.
func (b *Broker) newConnectionLocked() *connection {
	b.nextConn++
	return &connection{b: b, id: b.nextConn, closed: make(chan struct{})}
}

// Receiver returns a receiver on the broker, for tests that drive a [retry.Processor] themselves. On a
// topic it receives from the subscription [BrokerOptions.EntityPath] names, else the first. It is
// wrapped by [BrokerOptions.WrapReceiver], if set. On a session-aware entity
// ([BrokerOptions.RequiresSession]) every call of it fails with Service Bus's refusal of a
// non-session receiver; use [Broker.AcceptSession] or [Broker.AcceptNextSession].
func (b *Broker) Receiver() retry.Receiver { return b.handOut(b.newConnection(), b.consumed) }

// handOut returns a receiver of src on conn, as the broker hands it to a test: wrapped by
// [BrokerOptions.WrapReceiver] when that is set. Every receiver the broker gives out is made here.
func (b *Broker) handOut(conn *connection, src *broker.Queue) retry.Receiver {
	r := &receiver{conn: conn, src: src}
	if b.opts.WrapReceiver == nil {
		return r
	}
	return b.opts.WrapReceiver(r)
}

// SubscriptionReceiver returns a receiver of the topic subscription named name (ignoring case), on a
// broker configured with [BrokerOptions.Subscriptions], wrapped by [BrokerOptions.WrapReceiver] if
// set. Other names, and a queue broker, are an error.
func (b *Broker) SubscriptionReceiver(name string) (retry.Receiver, error) {
	sub, ok := b.model.Subscription(b.name, name)
	if !ok {
		return nil, fmt.Errorf("retrytest: no subscription %q on %q", name, b.name)
	}
	return b.handOut(b.newConnection(), sub), nil
}

// Sender returns a sender on the broker, the one a [retry.Processor] schedules its copies with: they
// land in the queue itself, in the topic, or in the retry queue when [BrokerOptions.RetryQueue] is
// set.
func (b *Broker) Sender() retry.Sender { return b.senderOn(b.newConnection()) }

// senderOn returns a sender to the schedule target on conn.
func (b *Broker) senderOn(conn *connection) *sender {
	return &sender{conn: conn, target: b.scheduleTarget}
}

// Connector returns a [retry.Connector] that builds a fresh receiver and sender on every call (failing
// while [OpConnect] faults are set); [BrokerOptions.WrapReceiver], if set, wraps each receiver it
// builds. Closing the connection closes both. On a topic the receiver reads
// the subscription [BrokerOptions.EntityPath] names, else the first, and the sender publishes to the
// topic. With [BrokerOptions.RetryQueue] it is the connection [retry.Namespace.Subscription]
// makes: it receives from the subscription and from the retry queue (a second [retry.Source]), names
// each by its entity path ("topic/Subscriptions/name" and the retry queue's name, which the chains'
// [envelope.Envelope.Source] then records), and schedules the retry copies to the retry queue.
func (b *Broker) Connector() retry.Connector {
	return func(ctx context.Context) (*retry.Connection, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		b.mu.Lock()
		if err := b.takeFaultLocked(OpConnect); err != nil {
			b.mu.Unlock()
			return nil, err
		}
		b.connects++
		b.notifyLocked()
		b.mu.Unlock()
		conn := b.newConnection()
		c := &retry.Connection{Receiver: b.handOut(conn, b.consumed), Sender: b.senderOn(conn), Close: conn.close}
		if b.retryQueue != nil {
			c.EntityPath = b.consumed.Name()
			c.Sources = []retry.Source{{Receiver: b.handOut(conn, b.retryQueue), EntityPath: b.retryQueue.Name()}}
		}
		return c, nil
	}
}

// Connects returns how many connections the Connector has built.
func (b *Broker) Connects() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.connects
}

// receiver implements [retry.Receiver] on a connection, for one entity of the broker: the queue or a
// subscription.
type receiver struct {
	conn *connection
	src  *broker.Queue
}

// Every call of a plain receiver on a session-aware entity fails as its first call would through the
// SDK, whose receivers attach lazily (see errNonSessionReceiver).

func (r *receiver) ReceiveMessages(ctx context.Context, maxMessages int, _ *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if r.src.RequiresSession() {
		return nil, errNonSessionReceiver(r.src)
	}
	return r.conn.b.receive(ctx, r.conn, r.src, maxMessages)
}

func (r *receiver) CompleteMessage(ctx context.Context, msg *azservicebus.ReceivedMessage, _ *azservicebus.CompleteMessageOptions) error {
	if err := r.callAllowed(ctx); err != nil {
		return err
	}
	return r.conn.b.complete(r.conn, r.src, msg)
}

func (r *receiver) DeadLetterMessage(ctx context.Context, msg *azservicebus.ReceivedMessage, opts *azservicebus.DeadLetterOptions) error {
	if err := r.callAllowed(ctx); err != nil {
		return err
	}
	return r.conn.b.deadLetter(r.conn, r.src, msg, opts)
}

func (r *receiver) RenewMessageLock(ctx context.Context, msg *azservicebus.ReceivedMessage, _ *azservicebus.RenewMessageLockOptions) error {
	if err := r.callAllowed(ctx); err != nil {
		return err
	}
	return r.conn.b.renew(r.conn, r.src, msg)
}

// callAllowed refuses a settlement or renewal when ctx has ended or the entity needs sessions.
func (r *receiver) callAllowed(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.src.RequiresSession() {
		return errNonSessionReceiver(r.src)
	}
	return nil
}

func (r *receiver) Close(ctx context.Context) error { return r.conn.close(ctx) }

// sender implements [retry.Sender] on a connection; what it schedules lands in target, an entity of
// the connection's broker.
type sender struct {
	conn   *connection
	target *broker.Queue
}

func (s *sender) ScheduleMessages(ctx context.Context, msgs []*azservicebus.Message, at time.Time, _ *azservicebus.ScheduleMessagesOptions) ([]int64, error) {
	return s.conn.b.schedule(ctx, s.conn, s.target, msgs, at)
}

func (s *sender) Close(ctx context.Context) error { return s.conn.close(ctx) }
