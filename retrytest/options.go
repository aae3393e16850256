package retrytest

import (
	"fmt"
	"time"

	"github.com/sbretry/retry/sbemu/broker"
)

// Defaults of a [Broker]; they are Service Bus's, and the emulator's.
const (
	// DefaultEntityPath names the broker's entity when [BrokerOptions.EntityPath] is empty.
	DefaultEntityPath = "queue"
	// DefaultLockDuration is the lock of a peek-lock delivery.
	DefaultLockDuration = broker.DefaultLockDuration
	// DefaultMaxDeliveryCount is how many deliveries a message gets before the broker dead-letters it.
	DefaultMaxDeliveryCount = broker.DefaultMaxDeliveryCount
	// DefaultDuplicateDetectionWindow is the window of [BrokerOptions.DuplicateDetection] when
	// DuplicateDetectionWindow is zero: the Service Bus default.
	DefaultDuplicateDetectionWindow = 10 * time.Minute
	// DefaultMaxMessageSize is the largest encoded message accepted: 256 KiB, the Standard tier.
	DefaultMaxMessageSize = broker.DefaultMaxMessageSize
)

// BrokerOptions configures a [Broker]: the settings of its one entity, a queue unless Subscriptions
// are given. The zero value of each field means the Service Bus default; negative durations and sizes,
// and a LockDuration above 5 minutes, are invalid (see [New]). The settings mean exactly what the
// fields of the same meaning on [broker.QueueConfig] mean to the emulator.
type BrokerOptions struct {
	// EntityPath names the queue or topic, which shows in DeadLetterSource. Empty means
	// [DefaultEntityPath].
	EntityPath string

	// LockDuration is how long a peek-lock lasts. Zero means [DefaultLockDuration]; at most 5 minutes.
	// On a topic it is the default of subscriptions that set none.
	LockDuration time.Duration

	// MaxDeliveryCount dead-letters a message (reason MaxDeliveryCountExceeded) when a delivery that
	// brought its count to MaxDeliveryCount ends without a settle (its lock expired). Zero means
	// [DefaultMaxDeliveryCount]. On a topic it is the default of subscriptions that set none.
	MaxDeliveryCount int

	// DuplicateDetection drops a sent or scheduled message whose MessageID was accepted less than
	// DuplicateDetectionWindow ago; the send still reports success, as on Service Bus.
	DuplicateDetection bool

	// DuplicateDetectionWindow is the window of duplicate detection. Zero means
	// [DefaultDuplicateDetectionWindow] when DuplicateDetection is set; a positive window turns
	// duplicate detection on by itself. Unlike Service Bus (20 s minimum), any positive window is
	// accepted, to keep tests short.
	DuplicateDetectionWindow time.Duration

	// DefaultMessageTimeToLive is the time-to-live of messages that set no TimeToLive, and the cap of
	// those that set a longer one (the broker shortens it, as Service Bus does). Zero means messages
	// live until their own TimeToLive, if any.
	DefaultMessageTimeToLive time.Duration

	// DeadLetteringOnMessageExpiration moves expired messages to the dead-letter queue with reason
	// TTLExpiredException instead of dropping them. On a topic it applies to every subscription.
	DeadLetteringOnMessageExpiration bool

	// MaxMessageSize is the largest message accepted, in bytes of its AMQP encoding; a larger send or
	// schedule fails with an error wrapping azservicebus.ErrMessageTooLarge. Zero means
	// [DefaultMaxMessageSize].
	MaxMessageSize int

	// Subscriptions, when not empty, make the entity a topic with these subscriptions, their rules,
	// lock durations, delivery limits and TTLs: Send and every Sender publish to the topic, each
	// subscription gets the copies its rules select, [Broker.Receiver] and [Broker.Connector] receive
	// from the first subscription and [Broker.SubscriptionReceiver] from any. Inspection methods cover
	// every subscription. Forwarding is not supported (there is no other entity to forward to).
	Subscriptions []broker.SubscriptionConfig

	// ReleaseLocksOnClose returns the messages locked through a connection to the queue when the
	// connection closes, counting the delivery, as the emulator does for a dropped connection. False
	// (the default) leaves them locked until their locks expire, as the emulator's
	// KeepLocksOnDisconnect does.
	ReleaseLocksOnClose bool
}

// entityPath is EntityPath with its default.
func (o BrokerOptions) entityPath() string {
	if o.EntityPath == "" {
		return DefaultEntityPath
	}
	return o.EntityPath
}

// duplicateWindow is the duplicate detection window, zero when detection is off.
func (o BrokerOptions) duplicateWindow() time.Duration {
	switch {
	case o.DuplicateDetectionWindow != 0:
		return o.DuplicateDetectionWindow
	case o.DuplicateDetection:
		return DefaultDuplicateDetectionWindow
	}
	return 0
}

// modelConfig translates o into the configuration of the broker model: one queue, or one topic with
// its subscriptions. The model validates it.
func (o BrokerOptions) modelConfig() ([]broker.QueueConfig, []broker.TopicConfig, error) {
	if len(o.Subscriptions) == 0 {
		return []broker.QueueConfig{{
			Name:                     o.entityPath(),
			LockDuration:             o.LockDuration,
			MaxDeliveryCount:         o.MaxDeliveryCount,
			DuplicateDetectionWindow: o.duplicateWindow(),
			DefaultTTL:               o.DefaultMessageTimeToLive,
			DeadLetterOnExpiration:   o.DeadLetteringOnMessageExpiration,
			MaxMessageSize:           o.MaxMessageSize,
		}}, nil, nil
	}
	subs := make([]broker.SubscriptionConfig, len(o.Subscriptions))
	for i, sc := range o.Subscriptions {
		if sc.ForwardTo != "" || sc.ForwardDeadLetteredMessagesTo != "" {
			return nil, nil, fmt.Errorf("%w: subscription %q: forwarding is not supported by retrytest", broker.ErrInvalidConfig, sc.Name)
		}
		if sc.LockDuration == 0 {
			sc.LockDuration = o.LockDuration
		}
		if sc.MaxDeliveryCount == 0 {
			sc.MaxDeliveryCount = o.MaxDeliveryCount
		}
		sc.DeadLetterOnExpiration = sc.DeadLetterOnExpiration || o.DeadLetteringOnMessageExpiration
		subs[i] = sc
	}
	return nil, []broker.TopicConfig{{
		Name:                     o.entityPath(),
		DuplicateDetectionWindow: o.duplicateWindow(),
		DefaultTTL:               o.DefaultMessageTimeToLive,
		MaxMessageSize:           o.MaxMessageSize,
		Subscriptions:            subs,
	}}, nil
}
