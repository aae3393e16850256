package retrytest

import (
	"context"
	"sync"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry"
)

var _ retry.SessionReceiver = (*SessionReceiver)(nil)

// SessionConnector returns a [retry.SessionConnector] on the broker's session entity
// ([BrokerOptions.RequiresSession]; on a topic, the subscription [BrokerOptions.EntityPath] names, else
// the first), for a [retry.SessionConsumer]. Each connection's AcceptNext is
// [Broker.AcceptNextSession] (or its subscription form), with its timeout and errors; each call fails
// while [OpConnect] faults are set, and each accept while [OpAccept] faults are. Closing a connection
// closes the session receivers it accepted, which gives their sessions up, and later accepts fail with
// azservicebus.CodeClosed, as on a closed SDK client.
func (b *Broker) SessionConnector() retry.SessionConnector {
	return func(ctx context.Context) (*retry.SessionConnection, error) {
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
		sc := &sessionClient{b: b}
		conn := &retry.SessionConnection{AcceptNext: sc.acceptNext, EntityPath: b.consumed.Name(), Close: sc.close}
		if b.consumed == b.scheduleTarget {
			// A session queue: wake-ups of durable holds are scheduled into the queue itself. A
			// subscription gets none, as from the built-in connectors (its topic would fan them out).
			sc.sender = b.senderOn(b.newConnection())
			conn.Sender = sc.sender
		}
		return conn, nil
	}
}

// sessionClient is one connection of SessionConnector: the receivers it accepted, closed with it.
type sessionClient struct {
	b *Broker
	// sender schedules into the queue, nil on a subscription; it is closed with the connection.
	sender *sender

	mu        sync.Mutex
	closed    bool
	receivers []*SessionReceiver
}

// acceptNext is the connection's AcceptNext: [Broker.AcceptNextSession] on the consumed entity.
func (c *sessionClient) acceptNext(ctx context.Context) (retry.SessionReceiver, error) {
	// A closed SDK client refuses every call with CodeClosed; so does this one. The check is repeated
	// after the accept, which waits without the lock, so that a Close meanwhile does not leave a
	// session locked by a receiver nobody will close.
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, &azservicebus.Error{Code: azservicebus.CodeClosed}
	}
	r, err := c.b.acceptNextSession(ctx, c.b.consumed)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		_ = r.Close(ctx)
		return nil, &azservicebus.Error{Code: azservicebus.CodeClosed}
	}
	// Forget the receivers that gave their session up (closed, or their lock ran out), so that a long
	// test of many sessions does not keep them all.
	held := c.receivers[:0]
	for _, old := range c.receivers {
		if old.lock.Held() {
			held = append(held, old)
		}
	}
	c.receivers = append(held, r)
	return r, nil
}

// close closes every receiver the connection accepted: their sessions go back at once, their
// unsettled messages in order, as when an SDK client closes its links.
func (c *sessionClient) close(ctx context.Context) error {
	c.mu.Lock()
	c.closed = true
	rs := c.receivers
	c.receivers = nil
	c.mu.Unlock()
	for _, r := range rs {
		_ = r.Close(ctx)
	}
	if c.sender != nil {
		_ = c.sender.Close(ctx)
	}
	return nil
}
