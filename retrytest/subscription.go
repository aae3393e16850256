package retrytest

import (
	"fmt"

	"github.com/sbretry/retry"
)

// The layout of [retry.Namespace.Subscription]: a topic subscription whose consumer schedules its
// retries to a queue of its own. One broker holds it: BrokerOptions.EntityPath names the subscription,
// BrokerOptions.RetryQueue the queue, and options.go builds the entities.

// RetryQueueReceiver returns a receiver of the retry queue of a broker configured with
// [BrokerOptions.RetryQueue], for tests that drive a [retry.Processor] themselves: the retry copies
// become receivable there when due. It is wrapped by [BrokerOptions.WrapReceiver], if set. A broker
// without a retry queue is an error.
func (b *Broker) RetryQueueReceiver() (retry.Receiver, error) {
	if b.retryQueue == nil {
		return nil, fmt.Errorf("retrytest: %q has no retry queue (see BrokerOptions.RetryQueue)", b.name)
	}
	return b.handOut(b.newConnection(), b.retryQueue), nil
}
