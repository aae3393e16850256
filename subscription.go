package retry

import (
	"context"
	"fmt"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/internal/entitypath"
	"github.com/sbretry/retry/internal/redact"
)

// SubscriptionPath returns the entity path of a subscription, "topic/Subscriptions/subscription", the
// way Service Bus names it (and [envelope.Envelope.Source] records it).
func SubscriptionPath(topic, subscription string) string {
	return entitypath.Subscription(topic, subscription)
}

// validateSubscription checks the names a subscription connector needs.
func validateSubscription(topic, subscription, retryQueue string) error {
	switch {
	case topic == "":
		return &OptionError{Field: "topic", Reason: "must not be empty"}
	case subscription == "":
		return &OptionError{Field: "subscription", Reason: "must not be empty"}
	case retryQueue == "":
		return &OptionError{Field: "retryQueue", Reason: "must not be empty: a subscription's retries must not go back to its topic, where every subscription would get them"}
	case retryQueue == topic:
		return &OptionError{Field: "retryQueue", Reason: "must not be the topic: every subscription would get the retries"}
	}
	return nil
}

// subscriptionConnection opens the subscription's receiver, and the retry queue's receiver and sender.
func subscriptionConnection(ctx context.Context, client, sendClient *azservicebus.Client, topic, subscription, retryQueue, addr string, opts *ConnectOptions) (*Connection, error) {
	closeAll := closeClients(client, sendClient)
	recvOpts := peekLockOptions(opts)
	path := SubscriptionPath(topic, subscription)
	subReceiver, err := client.NewReceiverForSubscription(topic, subscription, &recvOpts)
	if err != nil {
		_ = closeAll(ctx)
		return nil, redact.Wrap(fmt.Errorf("retry: creating receiver for %q: %w", path, err))
	}
	retryReceiver, err := client.NewReceiverForQueue(retryQueue, &recvOpts)
	if err != nil {
		_ = closeAll(ctx)
		return nil, redact.Wrap(fmt.Errorf("retry: creating receiver for the retry queue %q: %w", retryQueue, err))
	}
	sender, err := sendClient.NewSender(retryQueue, nil)
	if err != nil {
		_ = closeAll(ctx)
		return nil, redact.Wrap(fmt.Errorf("retry: creating sender for the retry queue %q: %w", retryQueue, err))
	}
	ping := explainTimeouts(peekCheck(subReceiver), addr)
	retryPing := peekCheck(retryReceiver)
	return &Connection{
		Receiver:   subReceiver,
		Sender:     sender,
		EntityPath: path,
		Sources:    []Source{{Receiver: retryReceiver, EntityPath: retryQueue}},
		Close:      closeAll,
		Address:    addr,
		Check: func(ctx context.Context) error {
			if err := ping(ctx); err != nil {
				return fmt.Errorf("retry: reading the subscription %q: %w", path, err)
			}
			if err := retryPing(ctx); err != nil {
				return fmt.Errorf("retry: reading the retry queue %q (create it: one queue per subscription, duplicate detection on): %w", retryQueue, err)
			}
			return sendCheck(ctx, sender)
		},
		Ping: ping,
	}, nil
}

// Subscription returns a Connector for the subscription of topic.
//
// Retrying a subscription's message by scheduling the copy to the topic would deliver it to every
// subscription of the topic, including those of other teams. Instead the copies are scheduled to
// retryQueue, a queue that only this consumer reads: the consumer receives from the subscription and
// from retryQueue over one connection, with one handler, one concurrency limit and one health (see
// [Connection.Sources]). Create one retry queue per subscription, with duplicate detection on. The last
// attempt of a chain that started on the subscription is received from the retry queue, so a message
// dead-lettered after its retries lands in the retry queue's dead-letter queue; one that fails for good
// on its first delivery lands in the subscription's.
//
// The connection check proves, before any message is received, that the subscription can be read,
// that the retry queue exists and can be read, and that the credential can send to it. A subscription
// that forwards to a queue (ForwardTo) needs none of this: consume that queue with
// [Namespace.Queue].
func (n *Namespace) Subscription(topic, subscription, retryQueue string) (Connector, error) {
	if n.err != nil {
		return nil, n.err
	}
	if err := validateSubscription(topic, subscription, retryQueue); err != nil {
		return nil, err
	}
	cl, opts := n.cl, n.opts
	return cl.connector(opts, SubscriptionPath(topic, subscription), retryQueue, func(ctx context.Context, client, sendClient *azservicebus.Client) (*Connection, error) {
		return subscriptionConnection(ctx, client, sendClient, topic, subscription, retryQueue, cl.addr, opts)
	}), nil
}
