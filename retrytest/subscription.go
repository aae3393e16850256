package retrytest

import (
	"context"
	"errors"
	"fmt"

	"github.com/sbretry/retry"
)

// The layout of [retry.SubscriptionConnectionString]: a topic subscription whose consumer schedules its
// retries to a queue of its own. One broker holds it (BrokerOptions.EntityPath naming the subscription,
// BrokerOptions.RetryQueue the queue; options.go builds the entities), or two brokers joined by the
// deprecated SubscriptionConnector.

// RetryQueueReceiver returns a receiver of the retry queue of a broker configured with
// [BrokerOptions.RetryQueue], for tests that drive a [retry.Processor] themselves: the retry copies
// become receivable there when due. A broker without a retry queue is an error.
func (b *Broker) RetryQueueReceiver() (retry.Receiver, error) {
	if b.err != nil {
		return nil, b.err
	}
	if b.retryQueue == nil {
		return nil, fmt.Errorf("retrytest: %q has no retry queue (see BrokerOptions.RetryQueue)", b.name)
	}
	return &receiver{conn: b.newConnection(), src: b.retryQueue}, nil
}

// SubscriptionConnector returns a [retry.Connector] for the layout of [retry.SubscriptionConnectionString]
// on two brokers: messages are received from sub (a queue standing for a topic subscription whose
// entity path is subPath, or a topic broker, whose consumed subscription it reads) and from retryQueue
// (path retryPath), and retry copies are scheduled to retryQueue. Each broker's Stats and inspection
// cover its own entity: an original completed after its copy was scheduled counts as Retried in sub,
// the copies in retryQueue.
//
// Deprecated: configure one broker with [BrokerOptions.RetryQueue] and use its [Broker.Connector]:
// the same layout, with the topic, the subscription and the retry queue in one model, and Stats,
// DeadLettered and AdvanceToNextScheduled covering all of them.
func SubscriptionConnector(sub, retryQueue *Broker, subPath, retryPath string) retry.Connector {
	return func(ctx context.Context) (*retry.Connection, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for _, b := range []*Broker{sub, retryQueue} {
			if b.err != nil {
				return nil, b.err
			}
			b.mu.Lock()
			err := b.takeFaultLocked(OpConnect)
			if err == nil {
				b.connects++
				b.notifyLocked()
			}
			b.mu.Unlock()
			if err != nil {
				return nil, err
			}
		}
		subConn, retryConn := sub.newConnection(), retryQueue.newConnection()
		return &retry.Connection{
			Receiver:   sub.receiverOn(subConn),
			EntityPath: subPath,
			Sender:     &sender{conn: retryConn, target: retryQueue.scheduleTarget, also: sub},
			Sources:    []retry.Source{{Receiver: retryQueue.receiverOn(retryConn), EntityPath: retryPath}},
			Close: func(ctx context.Context) error {
				return errors.Join(subConn.close(ctx), retryConn.close(ctx))
			},
		}, nil
	}
}
