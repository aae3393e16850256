package retrytest

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/internal/entitypath"
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

// BrokerOptions configures a [Broker]: the settings of its entity, a queue unless EntityPath names a
// subscription or Subscriptions are given, and of the subscription's retry queue when RetryQueue is
// set. The zero value of each field means the Service Bus default; negative durations and sizes, and a
// LockDuration above 5 minutes, are invalid (see [New]). The settings mean exactly what the fields of
// the same meaning on [broker.QueueConfig] mean to the emulator.
//
// The layout of [retry.Namespace.Subscription], a topic subscription whose consumer schedules its
// retries to a queue of its own, is one broker:
//
//	retrytest.BrokerOptions{EntityPath: "orders/Subscriptions/billing", RetryQueue: "orders-billing-retry"}
//
// [Broker.Send] publishes to the topic, [Broker.Connector] receives from the subscription and the retry
// queue and schedules copies to the retry queue, and [Broker.Stats] and [Broker.DeadLettered] cover
// the subscription, the retry queue and the topic's other subscriptions, if any.
type BrokerOptions struct {
	// EntityPath names the queue, or the topic, or a subscription of a topic as
	// "topic/Subscriptions/name" (see [retry.SubscriptionPath]); it shows in DeadLetterSource. A
	// subscription path makes the entity that topic, and the named subscription the one that
	// [Broker.Receiver] and [Broker.Connector] read: without Subscriptions the topic has just that
	// subscription, with the default rule; with Subscriptions it must be one of them. Empty means
	// [DefaultEntityPath].
	EntityPath string

	// RetryQueue, when set, adds the consumed subscription's retry queue, a queue of that name: the
	// layout of [retry.Namespace.Subscription]. [Broker.Sender] and the Connector's sender then
	// schedule to it (never to the topic, where every subscription would get the copies), the
	// Connector receives from it besides the subscription, and [Broker.RetryQueueReceiver] reads it.
	// It is configured like the consumed subscription (lock duration, MaxDeliveryCount, default
	// time-to-live, dead-lettering on expiration) and shares the topic's duplicate detection and
	// MaxMessageSize. It needs a topic (a subscription EntityPath or Subscriptions); a queue's retries go
	// back to the queue itself. Empty means no retry queue.
	RetryQueue string

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
	// lock durations, delivery limits and TTLs: Send publishes to the topic (and so does every Sender
	// unless RetryQueue is set), each subscription gets the copies its rules select,
	// [Broker.Receiver] and [Broker.Connector] receive from the subscription EntityPath names, else
	// the first, and [Broker.SubscriptionReceiver] from any. Inspection methods cover every
	// subscription. Forwarding is not supported.
	Subscriptions []broker.SubscriptionConfig

	// RequiresSession makes the entity session-aware, as Service Bus's RequiresSession does: the
	// queue, or on a topic every subscription (a subscription can also set its own
	// [broker.SubscriptionConfig.RequiresSession]). Its messages are then received only through a
	// [SessionReceiver] ([Broker.AcceptSession], [Broker.AcceptNextSession] and their subscription
	// forms), one session at a time and in order within it; the broker's plain receivers
	// ([Broker.Receiver], [Broker.SubscriptionReceiver], the Connector's) fail every call with the
	// refusal Service Bus gives a non-session receiver, and a message sent to a session-aware queue
	// without a SessionID is refused. A session-aware consumed subscription cannot have a RetryQueue:
	// a retry queue of its own would take the copies out of their session. False (the default)
	// means no sessions.
	RequiresSession bool

	// ReleaseLocksOnClose returns the messages locked through a connection to the queue when the
	// connection closes, counting the delivery, as the emulator does for a dropped connection. False
	// (the default) leaves them locked until their locks expire, as the emulator's
	// KeepLocksOnDisconnect does.
	ReleaseLocksOnClose bool

	// WrapReceiver, when set, wraps every receiver the broker hands out: those of [Broker.Receiver],
	// [Broker.SubscriptionReceiver] and [Broker.RetryQueueReceiver], and each one [Broker.Connector]
	// builds, the retry queue's [retry.Source] included. It lets a test intercept the calls a consumer
	// makes (a settle that hangs, a receive that records what it asked for) without writing a Connector
	// of its own: it is called once per receiver with the broker's own, and what it returns is handed
	// out instead, typically a struct that embeds the [retry.Receiver] it is given and overrides the
	// methods to intercept. It must return a non-nil receiver. It runs on the goroutine that asks for
	// the receiver (for the Connector's, the consumer's), so state it shares with the test must be
	// synchronised. It does not wrap a [SessionReceiver], which the accept calls return as it is (a
	// test intercepts one by embedding it in a type of its own). Nil means the broker's receivers as
	// they are.
	WrapReceiver func(retry.Receiver) retry.Receiver
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

// layout is what a [BrokerOptions] describes, ready for the broker model: its entities, the one sends
// go to, the one receivers read and the retry queue.
type layout struct {
	queues []broker.QueueConfig
	topics []broker.TopicConfig
	// name is the queue or the topic; consumed the subscription receivers read (empty for a queue);
	// retryQueue the retry queue (empty for none).
	name, consumed, retryQueue string
}

// layout translates o into the configuration of the broker model: one queue, or one topic with its
// subscriptions and possibly a retry queue. The model validates names and settings; layout refuses
// what only retrytest cannot do.
func (o BrokerOptions) layout() (layout, error) {
	invalid := func(format string, args ...any) (layout, error) {
		return layout{}, fmt.Errorf("%w: %s", broker.ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	l := layout{name: o.entityPath(), retryQueue: o.RetryQueue}
	topic, consumed, isSub := entitypath.Split(l.name)
	if !isSub && len(o.Subscriptions) == 0 {
		if o.RetryQueue != "" {
			return invalid("RetryQueue %q needs a topic subscription (EntityPath \"topic/Subscriptions/name\" or Subscriptions): a queue's retries go back to the queue itself", o.RetryQueue)
		}
		l.queues = []broker.QueueConfig{{
			Name:                     l.name,
			LockDuration:             o.LockDuration,
			MaxDeliveryCount:         o.MaxDeliveryCount,
			DuplicateDetectionWindow: o.duplicateWindow(),
			DefaultTTL:               o.DefaultMessageTimeToLive,
			DeadLetterOnExpiration:   o.DeadLetteringOnMessageExpiration,
			MaxMessageSize:           o.MaxMessageSize,
			RequiresSession:          o.RequiresSession,
		}}
		return l, nil
	}
	subs := o.Subscriptions
	if isSub {
		l.name = topic
		if len(subs) == 0 {
			subs = []broker.SubscriptionConfig{{Name: consumed}}
		} else if !slices.ContainsFunc(subs, func(sc broker.SubscriptionConfig) bool { return strings.EqualFold(sc.Name, consumed) }) {
			return invalid("EntityPath %q names subscription %q, which is not among Subscriptions", o.EntityPath, consumed)
		}
	}
	cfgs := make([]broker.SubscriptionConfig, len(subs))
	for i, sc := range subs {
		if sc.ForwardTo != "" || sc.ForwardDeadLetteredMessagesTo != "" {
			return invalid("subscription %q: forwarding is not supported by retrytest", sc.Name)
		}
		if sc.LockDuration == 0 {
			sc.LockDuration = o.LockDuration
		}
		if sc.MaxDeliveryCount == 0 {
			sc.MaxDeliveryCount = o.MaxDeliveryCount
		}
		sc.DeadLetterOnExpiration = sc.DeadLetterOnExpiration || o.DeadLetteringOnMessageExpiration
		sc.RequiresSession = sc.RequiresSession || o.RequiresSession
		cfgs[i] = sc
	}
	if !isSub {
		consumed = cfgs[0].Name
	}
	l.consumed = consumed
	l.topics = []broker.TopicConfig{{
		Name:                     l.name,
		DuplicateDetectionWindow: o.duplicateWindow(),
		DefaultTTL:               o.DefaultMessageTimeToLive,
		MaxMessageSize:           o.MaxMessageSize,
		Subscriptions:            cfgs,
	}}
	if strings.EqualFold(o.RetryQueue, l.name) {
		return invalid("RetryQueue %q must not be the topic: every subscription would get the retries", o.RetryQueue)
	}
	if o.RetryQueue != "" {
		sc := cfgs[slices.IndexFunc(cfgs, func(sc broker.SubscriptionConfig) bool { return strings.EqualFold(sc.Name, consumed) })]
		if sc.RequiresSession {
			return invalid("RetryQueue %q with the session-aware subscription %q: a retry queue of its own would take the copies out of their session", o.RetryQueue, sc.Name)
		}
		ttl := o.DefaultMessageTimeToLive
		if sc.DefaultTTL > 0 && (ttl == 0 || sc.DefaultTTL < ttl) {
			ttl = sc.DefaultTTL // a subscription's own default can only shorten the topic's
		}
		l.queues = []broker.QueueConfig{{
			Name:                     o.RetryQueue,
			LockDuration:             sc.LockDuration,
			MaxDeliveryCount:         sc.MaxDeliveryCount,
			DuplicateDetectionWindow: o.duplicateWindow(),
			DefaultTTL:               ttl,
			DeadLetterOnExpiration:   sc.DeadLetterOnExpiration,
			MaxMessageSize:           o.MaxMessageSize,
		}}
	}
	return l, nil
}
