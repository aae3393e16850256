package retry

import (
	"context"
	"errors"
	"fmt"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/internal/redact"
)

// Connection is one live client: the receiver the consumer reads from and the sender its retry copies go
// to. They are kept apart so that a topic subscription (receive from the subscription, republish to the
// topic) fits the same shape.
type Connection struct {
	Receiver Receiver
	// Sender is the republish target.
	Sender Sender
	// Close releases the client behind Receiver and Sender. Nil means closing Receiver and Sender.
	Close func(ctx context.Context) error
	// Check, if set, proves that the connection works before the consumer counts it as connected. The
	// SDK connects lazily, so building a client succeeds even while the namespace is unreachable;
	// without a check the consumer would report itself running until its first receive failed. A
	// failing Check counts as a failed connect: the connection is closed and the reconnect schedule
	// goes on. It runs bounded by the settle timeout.
	Check func(ctx context.Context) error
}

// close releases c, bounded by ctx.
func (c *Connection) close(ctx context.Context) error {
	if c.Close != nil {
		return c.Close(ctx)
	}
	return errors.Join(c.Receiver.Close(ctx), c.Sender.Close(ctx))
}

// Connector builds a fresh Connection. The consumer calls it at start and after every receive failure;
// a broken connection is closed and never reused, because the SDK's recovery cannot always heal a client
// whose connection was lost.
type Connector func(ctx context.Context) (*Connection, error)

// ConnectOptions tunes the connectors built by [QueueConnectionString] and [QueueCredential].
type ConnectOptions struct {
	// Client is passed to the azservicebus client constructor.
	Client *azservicebus.ClientOptions
	// Receiver is passed to NewReceiverForQueue. ReceiveMode is always PeekLock: retries need it.
	Receiver *azservicebus.ReceiverOptions
}

// QueueConnectionString returns a Connector for queue using a connection string. Errors never contain
// the shared access key.
func QueueConnectionString(connectionString, queue string, opts *ConnectOptions) Connector {
	return func(ctx context.Context) (*Connection, error) {
		var clientOpts *azservicebus.ClientOptions
		if opts != nil {
			clientOpts = opts.Client
		}
		client, err := azservicebus.NewClientFromConnectionString(connectionString, clientOpts)
		if err != nil {
			return nil, redact.Wrap(fmt.Errorf("retry: creating client: %w", err))
		}
		return queueConnection(ctx, client, queue, opts)
	}
}

// QueueCredential returns a Connector for queue in namespace (e.g. "myns.servicebus.windows.net") using
// an Entra ID credential such as azidentity's DefaultAzureCredential.
func QueueCredential(namespace string, credential azcore.TokenCredential, queue string, opts *ConnectOptions) Connector {
	return func(ctx context.Context) (*Connection, error) {
		var clientOpts *azservicebus.ClientOptions
		if opts != nil {
			clientOpts = opts.Client
		}
		client, err := azservicebus.NewClient(namespace, credential, clientOpts)
		if err != nil {
			return nil, fmt.Errorf("retry: creating client: %w", err)
		}
		return queueConnection(ctx, client, queue, opts)
	}
}

// queueConnection opens the receiver and sender of queue on client; on failure it closes client.
func queueConnection(ctx context.Context, client *azservicebus.Client, queue string, opts *ConnectOptions) (*Connection, error) {
	recvOpts := azservicebus.ReceiverOptions{}
	if opts != nil && opts.Receiver != nil {
		recvOpts = *opts.Receiver
	}
	recvOpts.ReceiveMode = azservicebus.ReceiveModePeekLock
	receiver, err := client.NewReceiverForQueue(queue, &recvOpts)
	if err != nil {
		_ = client.Close(ctx)
		return nil, redact.Wrap(fmt.Errorf("retry: creating receiver for %q: %w", queue, err))
	}
	sender, err := client.NewSender(queue, nil)
	if err != nil {
		_ = client.Close(ctx)
		return nil, redact.Wrap(fmt.Errorf("retry: creating sender for %q: %w", queue, err))
	}
	return &Connection{Receiver: receiver, Sender: sender, Close: client.Close, Check: peekCheck(receiver)}, nil
}

// peekCheck peeks at one message: it opens the connection, authenticates and confirms that the queue
// exists, without locking or changing anything (an empty queue answers with no messages).
func peekCheck(receiver *azservicebus.Receiver) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		_, err := receiver.PeekMessages(ctx, 1, nil)
		return err
	}
}
