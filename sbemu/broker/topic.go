package broker

import (
	"fmt"
	"time"

	"github.com/Azure/go-amqp"

	"github.com/sbretry/retry/internal/entitypath"
)

// SubscriptionsSegment joins a topic and a subscription name in an entity
// path, as the SDK's NewReceiverForSubscription addresses it:
// "<topic>/Subscriptions/<subscription>".
const SubscriptionsSegment = "/" + entitypath.SubscriptionsSegment + "/"

// SubscriptionPath is the entity path of subscription sub of topic.
func SubscriptionPath(topic, sub string) string { return entitypath.Subscription(topic, sub) }

// entityKind tells queues, topics and subscriptions apart; all three are a
// [Queue] underneath, because they share storage, sequence numbers,
// scheduling, TTL and the timeline.
type entityKind int

const (
	kindQueue entityKind = iota
	// kindTopic: accepts, deduplicates and holds scheduled messages; a
	// message that becomes available is copied to the subscriptions whose
	// rules match and leaves the topic. Nothing is ever received from it.
	kindTopic
	// kindSubscription: a queue that only its topic (or a forwarding
	// entity) feeds; clients receive from it but cannot send to it.
	kindSubscription
)

// String names the kind in errors.
func (k entityKind) String() string {
	switch k {
	case kindTopic:
		return "topic"
	case kindSubscription:
		return "subscription"
	}
	return "queue"
}

// TopicConfig describes one topic and its subscriptions. Zero fields mean
// the Service Bus defaults, as for [QueueConfig].
type TopicConfig struct {
	// Name is the topic's entity path: non-empty, no '/', unique among
	// queues and topics ignoring case.
	Name string

	// DuplicateDetectionWindow enables duplicate detection on MessageId at
	// the topic when positive, as [QueueConfig.DuplicateDetectionWindow].
	DuplicateDetectionWindow time.Duration

	// DefaultTTL is the time-to-live of messages without their own; a
	// message that expires in the topic (still scheduled, say) is dropped,
	// and the copies in subscriptions expire no later than it would have.
	DefaultTTL time.Duration

	// MaxMessageSize is the largest encoded message accepted, in bytes;
	// zero means 256 KiB. Subscriptions share it.
	MaxMessageSize int

	// Status is the topic's status (status.go): Disabled and SendDisabled
	// refuse sends with [ErrEntityDisabled], and Disabled also refuses
	// receives from its subscriptions. Zero means Active.
	Status EntityStatus

	// Subscriptions are the topic's subscriptions. A topic without any
	// accepts messages and drops them, as Service Bus does.
	Subscriptions []SubscriptionConfig
}

// SubscriptionConfig describes one subscription of a topic. It behaves like
// a queue that the topic fills: zero fields mean the defaults documented on
// [QueueConfig].
type SubscriptionConfig struct {
	// Name is unique within the topic ignoring case, non-empty, no '/'.
	Name string

	// LockDuration, MaxDeliveryCount, DefaultTTL and
	// DeadLetterOnExpiration are the subscription's own, with the defaults
	// and limits of the [QueueConfig] fields of the same names. A
	// subscription's DefaultTTL can shorten, never lengthen, the topic's.
	LockDuration           time.Duration
	MaxDeliveryCount       int
	DefaultTTL             time.Duration
	DeadLetterOnExpiration bool

	// RequiresSession makes the subscription session-aware, as
	// [QueueConfig.RequiresSession] does for a queue; a message without a
	// session id is stored under the empty session id there.
	RequiresSession bool

	// ForwardTo and ForwardDeadLetteredMessagesTo auto-forward as on
	// [QueueConfig].
	ForwardTo                     string
	ForwardDeadLetteredMessagesTo string

	// Rules select the messages the subscription gets. Empty means the
	// single rule $Default with a TrueFilter.
	Rules []RuleConfig

	// Status is the subscription's status (status.go): Disabled and
	// ReceiveDisabled refuse receives and completions with
	// [ErrEntityDisabled]; the topic still copies messages into it. Zero
	// means Active.
	Status EntityStatus
}

// queueConfig is the configuration the subscription runs with as a queue:
// its own settings, with its topic's message size limit.
func (sc SubscriptionConfig) queueConfig(maxMessageSize int) QueueConfig {
	return QueueConfig{
		Name:                   sc.Name,
		LockDuration:           sc.LockDuration,
		MaxDeliveryCount:       sc.MaxDeliveryCount,
		DefaultTTL:             sc.DefaultTTL,
		DeadLetterOnExpiration: sc.DeadLetterOnExpiration,
		MaxMessageSize:         maxMessageSize,
		RequiresSession:        sc.RequiresSession,
		Status:                 sc.Status,
	}
}

// addTopic validates and registers a topic and its subscriptions, noting
// their forwarding for resolveForwards.
func (b *Broker) addTopic(tc TopicConfig, forwards map[*Queue]forwardConfig) error {
	qc := QueueConfig{
		Name:                     tc.Name,
		DuplicateDetectionWindow: tc.DuplicateDetectionWindow,
		DefaultTTL:               tc.DefaultTTL,
		MaxMessageSize:           tc.MaxMessageSize,
		Status:                   tc.Status,
	}
	if err := qc.validateAs("topic"); err != nil {
		return err
	}
	topic, err := b.addEntity(kindTopic, tc.Name, qc)
	if err != nil {
		return err
	}
	for _, sc := range tc.Subscriptions {
		sqc := sc.queueConfig(topic.cfg.MaxMessageSize)
		if err := sqc.validateAs("subscription"); err != nil {
			return fmt.Errorf("topic %q: %w", tc.Name, err)
		}
		path := SubscriptionPath(tc.Name, sc.Name)
		rules, err := compileRules(path, sc.Rules)
		if err != nil {
			return err
		}
		sub, err := b.addEntity(kindSubscription, path, sqc)
		if err != nil {
			return err
		}
		sub.rules = rules
		sub.topic = topic
		topic.subs = append(topic.subs, sub)
		forwards[sub] = forwardConfig{sc.ForwardTo, sc.ForwardDeadLetteredMessagesTo}
	}
	return nil
}

// fanOut hands a message that became available in topic q to every
// subscription whose rules select it, and forgets it in the topic. Copies
// keep the topic's enqueue time and expire no later than the topic's copy
// would have. b.mu must be held.
func (q *Queue) fanOut(e *entry, now time.Time) {
	q.removeEntry(e)
	if len(q.subs) == 0 {
		return
	}
	msg := e.message()
	for _, sub := range q.subs {
		for _, m := range copiesFor(sub.rules, msg, e.size) {
			sub.enqueueLocked(m, e.size, e.enqueuedAt, e.expiresAt, now)
		}
	}
}

// enqueueLocked stores a message moved here from another entity (a topic's
// fan-out or auto-forwarding): it gets a sequence number of this entity and
// becomes available (or forwarded, or fanned out) at once. Duplicate
// detection applies on a queue or topic that has it. expiryCap, when set,
// is the latest the message may expire. m is owned by the callee. b.mu must
// be held.
func (q *Queue) enqueueLocked(m *amqp.Message, size int, enqueuedAt, expiryCap, now time.Time) {
	id := messageID(m)
	if _, dup := q.dedup.lookup(id, now); dup {
		return
	}
	e := mustEncodeEntry(m, size)
	e.seq = q.nextSeq()
	e.expiryCap = expiryCap
	q.storeEntry(e)
	q.journalEntry(e.seq, e)
	q.rememberID(id, e.seq, now)
	q.activate(e, enqueuedAt, now)
	// The caller arms its own entity only; the new deadline (this copy's
	// expiry or lock) belongs to q.
	q.armTimer(now)
}

// IsTopic reports whether q is a topic: it can be sent and scheduled to,
// never received from.
func (q *Queue) IsTopic() bool { return q.kind == kindTopic }

// IsSubscription reports whether q is a topic subscription (or the
// dead-letter queue of one): it can be received from, never sent to.
func (q *Queue) IsSubscription() bool { return q.kind == kindSubscription }

// MaxMessageSize is the largest encoded message q accepts, in bytes, with
// the default applied.
func (q *Queue) MaxMessageSize() int {
	q.b.mu.Lock() // an update (manage.go) may change it
	defer q.b.unlock()
	return q.cfg.MaxMessageSize
}

// Subscriptions returns the paths of a topic's subscriptions in
// configuration order; nil for other entities.
func (q *Queue) Subscriptions() []string {
	q.b.mu.Lock() // subscriptions come and go (manage.go)
	defer q.b.unlock()
	var out []string
	for _, s := range q.subs {
		out = append(out, s.name)
	}
	return out
}

// isSubscriptionPath reports whether a configured path names a
// subscription, for error messages.
func isSubscriptionPath(path string) bool {
	_, _, ok := entitypath.Split(path)
	return ok
}
