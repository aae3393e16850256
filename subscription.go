package retry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"

	"github.com/sbretry/retry/internal/redact"
)

// SubscriptionPath returns the entity path of a subscription, "topic/Subscriptions/subscription", the
// way Service Bus names it (and [Envelope.Source] records it).
func SubscriptionPath(topic, subscription string) string {
	return topic + "/Subscriptions/" + subscription
}

// SubscriptionConnectionString returns a Connector for a topic subscription using a connection string.
//
// Retrying a subscription's message by scheduling the copy to the topic would deliver it to every
// subscription of the topic, including those of other teams. Instead the copies are scheduled to
// retryQueue, a queue that only this consumer reads: the consumer receives from the subscription and
// from retryQueue over one connection, with one handler, one concurrency limit and one health (see
// [Connection.Also]). Create one retry queue per subscription, with duplicate detection on. The last
// attempt of a chain that started on the subscription is received from the retry queue, so a message
// dead-lettered after its retries lands in the retry queue's dead-letter queue; one that fails for good
// on its first delivery lands in the subscription's.
//
// The connection check proves, before any message is received, that the subscription can be read,
// that the retry queue exists and can be read, and that the credential can send to it. A subscription
// that forwards to a queue (ForwardTo) needs none of this: consume that queue with
// [QueueConnectionString].
func SubscriptionConnectionString(connectionString, topic, subscription, retryQueue string, opts *ConnectOptions) (Connector, error) {
	if err := validateSubscription(topic, subscription, retryQueue); err != nil {
		return nil, err
	}
	var clientOpts *azservicebus.ClientOptions
	sendString := ""
	if opts != nil {
		clientOpts = opts.Client
		sendString = opts.SendConnectionString
	}
	for _, s := range []string{connectionString, sendString} {
		if s == "" && s != connectionString {
			continue
		}
		if err := validateConnectionString(s); err != nil {
			return nil, err
		}
	}
	host, addr := connectionStringEndpoint(connectionString)
	return func(ctx context.Context) (*Connection, error) {
		if err := resolveHost(ctx, host, clientOpts); err != nil {
			return nil, err
		}
		client, err := azservicebus.NewClientFromConnectionString(connectionString, clientOpts)
		if err != nil {
			return nil, redact.Wrap(fmt.Errorf("retry: creating client: %w", err))
		}
		sendClient := client
		if sendString != "" {
			if sendClient, err = azservicebus.NewClientFromConnectionString(sendString, clientOpts); err != nil {
				_ = client.Close(ctx)
				return nil, redact.Wrap(fmt.Errorf("retry: creating the republish client: %w", err))
			}
		}
		conn, err := subscriptionConnection(ctx, client, sendClient, topic, subscription, retryQueue, addr, opts)
		if conn != nil {
			conn.Settings = settingsCheck(opts, SubscriptionPath(topic, subscription), retryQueue, func(o *admin.ClientOptions) (*admin.Client, error) {
				return admin.NewClientFromConnectionString(connectionString, o)
			})
		}
		return conn, err
	}, nil
}

// SubscriptionCredential is [SubscriptionConnectionString] with an Entra ID credential for namespace
// (e.g. "myns.servicebus.windows.net").
func SubscriptionCredential(namespace string, credential azcore.TokenCredential, topic, subscription, retryQueue string, opts *ConnectOptions) (Connector, error) {
	switch {
	case namespace == "":
		return nil, &OptionError{Field: "namespace", Reason: "must not be empty"}
	case credential == nil:
		return nil, &OptionError{Field: "credential", Reason: "must not be nil"}
	}
	if err := validateSubscription(topic, subscription, retryQueue); err != nil {
		return nil, err
	}
	var clientOpts *azservicebus.ClientOptions
	sendCred := credential
	if opts != nil {
		clientOpts = opts.Client
		if opts.SendCredential != nil {
			sendCred = opts.SendCredential
		}
	}
	host := namespace
	if u, err := url.Parse(namespace); err == nil && u.Host != "" {
		host = u.Host
	}
	return func(ctx context.Context) (*Connection, error) {
		if err := resolveHost(ctx, host, clientOpts); err != nil {
			return nil, err
		}
		client, err := azservicebus.NewClient(namespace, credential, clientOpts)
		if err != nil {
			return nil, fmt.Errorf("retry: creating client: %w", err)
		}
		sendClient := client
		if sendCred != credential {
			if sendClient, err = azservicebus.NewClient(namespace, sendCred, clientOpts); err != nil {
				_ = client.Close(ctx)
				return nil, fmt.Errorf("retry: creating the republish client: %w", err)
			}
		}
		conn, err := subscriptionConnection(ctx, client, sendClient, topic, subscription, retryQueue, net.JoinHostPort(host, "5671"), opts)
		if conn != nil {
			conn.Settings = settingsCheck(opts, SubscriptionPath(topic, subscription), retryQueue, func(o *admin.ClientOptions) (*admin.Client, error) {
				return admin.NewClient(namespace, credential, o)
			})
		}
		return conn, err
	}, nil
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
	closeAll := func(ctx context.Context) error {
		err := client.Close(ctx)
		if sendClient != client {
			err = errors.Join(err, sendClient.Close(ctx))
		}
		return err
	}
	recvOpts := azservicebus.ReceiverOptions{}
	if opts != nil && opts.Receiver != nil {
		recvOpts = *opts.Receiver
	}
	recvOpts.ReceiveMode = azservicebus.ReceiveModePeekLock
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
		Also:       []Source{{Receiver: retryReceiver, EntityPath: retryQueue}},
		Close:      closeAll,
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
