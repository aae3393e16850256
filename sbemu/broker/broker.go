package broker

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// DeadLetterSuffix is appended to a queue name to address its dead-letter
// sub-queue, as the SDK does ("<queue>/$DeadLetterQueue"). Lookups ignore case.
const DeadLetterSuffix = "/$DeadLetterQueue"

// Broker holds the queues, topics and subscriptions configured at [New] and
// those added later with [Broker.AddQueue] and [Broker.AddTopic]. It is safe for concurrent use: one mutex guards every entity, so
// moves between entities (dead-lettering, forwarding, a topic's fan-out) are
// atomic and lock ownership can be released across queues in one step. The
// zero value is not usable; call [New].
type Broker struct {
	// mu guards every field below and all state of every entity; queue
	// methods take it through their b pointer.
	mu       sync.Mutex
	clock    Clock
	queues   map[string]*Queue // by lower-case path: queues, topics and subscriptions
	entities []*Queue          // the same, in configuration order
	closed   bool
	done     chan struct{} // closed by Close to wake blocked receivers

	// The configurations behind the entities, so that an entity added at
	// run time can be validated together with the existing ones.
	queueCfgs []QueueConfig
	topicCfgs []TopicConfig

	// The wake-up (see wakeup.go): wakeC fires at wakeAt, the earliest
	// deadline of any queue or earlier; rearm tells the goroutine that
	// wakeC changed; wakeupsDone is closed when the goroutine has returned.
	wakeC       <-chan time.Time
	wakeAt      time.Time
	rearm       chan struct{}
	wakeupsDone chan struct{}

	// persist journals every change to Options.DataDir (persist.go); nil
	// without one. Set before New returns and never changed.
	persist *persistence
}

// New validates the configurations and returns a broker serving the queues
// and the topics of opts.Topics with their subscriptions. Names must be
// non-empty, unique ignoring case (queues and topics share one namespace)
// and free of '/'; durations and sizes must not be negative (see
// [QueueConfig]); rules must parse; forwarding targets must exist and must
// not form a loop. Errors wrap [ErrInvalidConfig] and name the entity. Every
// queue and subscription gets a dead-letter queue automatically.
func New(opts Options, queues ...QueueConfig) (*Broker, error) {
	if opts.DataDir != "" {
		return openPersistent(opts, queues)
	}
	b := &Broker{
		clock:  opts.Clock,
		queues: make(map[string]*Queue, len(queues)),
		done:   make(chan struct{}),
		rearm:  make(chan struct{}, 1),

		wakeupsDone: make(chan struct{}),
	}
	if b.clock == nil {
		b.clock = realClock{}
	}
	forwards := map[*Queue]forwardConfig{}
	for _, cfg := range queues {
		if err := cfg.validate(); err != nil {
			return nil, err
		}
		q, err := b.addEntity(kindQueue, cfg.Name, cfg)
		if err != nil {
			return nil, err
		}
		forwards[q] = forwardConfig{cfg.ForwardTo, cfg.ForwardDeadLetteredMessagesTo}
	}
	for _, tc := range opts.Topics {
		if err := b.addTopic(tc, forwards); err != nil {
			return nil, err
		}
	}
	if err := b.resolveForwards(forwards); err != nil {
		return nil, err
	}
	b.queueCfgs = slices.Clone(queues)
	b.topicCfgs = slices.Clone(opts.Topics)
	// Started last, so a configuration error leaves nothing running.
	go b.runWakeups()
	return b, nil
}

// addEntity creates a queue, topic or subscription with its dead-letter
// queue and registers it under path; cfg must be valid.
func (b *Broker) addEntity(kind entityKind, path string, cfg QueueConfig) (*Queue, error) {
	key := strings.ToLower(path)
	if _, dup := b.queues[key]; dup {
		return nil, fmt.Errorf("%w: duplicate entity name %q", ErrInvalidConfig, path)
	}
	cfg.Name = path
	q := newQueue(b, path, cfg.withDefaults())
	q.kind = kind
	dlqCfg := QueueConfig{
		Name:         path + DeadLetterSuffix,
		LockDuration: q.cfg.LockDuration,
		// Service Bus never dead-letters out of a dead-letter queue and
		// does not observe TTL there: no delivery limit, no expiry.
		MaxDeliveryCount: 0,
		MaxMessageSize:   q.cfg.MaxMessageSize,
	}
	// The dead-letter queue is not in b.queues: it is reached only through
	// its parent, so lookups and allQueues find each exactly once.
	q.dlq = newQueue(b, dlqCfg.Name, dlqCfg)
	q.dlq.parent = q
	q.dlq.kind = kind
	b.queues[key] = q
	b.entities = append(b.entities, q)
	return q, nil
}

// Queue returns the entity with the given path, ignoring case: a queue, a
// topic (for sending and scheduling), a subscription
// ("<topic>/Subscriptions/<name>", see [SubscriptionPath]), or the
// dead-letter queue of a queue or subscription when the path ends in
// "/$DeadLetterQueue" (any case). The bool is false for unknown paths;
// callers needing an error use [ErrUnknownQueue].
func (b *Broker) Queue(name string) (*Queue, bool) {
	key := strings.ToLower(name)
	b.mu.Lock()
	defer b.unlock()
	dlqSuffix := strings.ToLower(DeadLetterSuffix)
	if base, ok := strings.CutSuffix(key, dlqSuffix); ok {
		q, found := b.queues[base]
		// A topic has no dead-letter queue a client can reach.
		if !found || q.kind == kindTopic {
			return nil, false
		}
		return q.dlq, true
	}
	q, ok := b.queues[key]
	return q, ok
}

// Subscription returns the subscription sub of topic, ignoring case; it is
// [Broker.Queue] of [SubscriptionPath](topic, sub).
func (b *Broker) Subscription(topic, sub string) (*Queue, bool) {
	q, ok := b.Queue(SubscriptionPath(topic, sub))
	if !ok || q.kind != kindSubscription {
		return nil, false
	}
	return q, true
}

// Queues returns the configured queue names (topics, subscriptions and
// dead-letter queues excluded) in configuration order, so the server can
// list entities deterministically.
func (b *Broker) Queues() []string {
	return b.namesOf(kindQueue)
}

// Topics returns the configured topic names in configuration order.
func (b *Broker) Topics() []string {
	return b.namesOf(kindTopic)
}

func (b *Broker) namesOf(kind entityKind) []string {
	b.mu.Lock()
	defer b.unlock()
	var out []string
	for _, q := range b.entities {
		if q.kind == kind {
			out = append(out, q.name)
		}
	}
	return out
}

// mainQueues returns every entity (dead-letter queues excluded) in
// configuration order; b.mu must be held (AddQueue and AddTopic append to
// it) and the slice must not be modified.
func (b *Broker) mainQueues() []*Queue {
	return b.entities
}

// allQueues returns every queue including dead-letter queues in a stable
// order; b.mu must be held.
func (b *Broker) allQueues() []*Queue {
	out := make([]*Queue, 0, 2*len(b.entities))
	for _, q := range b.entities {
		out = append(out, q, q.dlq)
	}
	return out
}

// AddQueue creates a queue while the broker runs, as creating one in the
// portal does: it is reachable by [Broker.Queue] (and so by clients) as soon
// as AddQueue returns. The configuration is validated together with every
// existing entity, as [New] would (unique names, limits, forwarding targets
// and loops); on error nothing changes.
func (b *Broker) AddQueue(cfg QueueConfig) error {
	return b.add([]QueueConfig{cfg}, nil)
}

// AddTopic creates a topic with its subscriptions while the broker runs;
// see [Broker.AddQueue].
func (b *Broker) AddTopic(cfg TopicConfig) error {
	if err := b.storable(cfg); err != nil {
		return err
	}
	return b.add(nil, []TopicConfig{cfg})
}

// add validates the existing configuration plus the new entities on a
// throwaway broker, then creates them in b. Validation cannot fail
// half-way through b that way.
func (b *Broker) add(queues []QueueConfig, topics []TopicConfig) error {
	b.mu.Lock()
	defer b.unlock()
	if b.closed {
		return ErrClosed
	}
	allQueues := append(slices.Clone(b.queueCfgs), queues...)
	allTopics := append(slices.Clone(b.topicCfgs), topics...)
	probe, err := New(Options{Topics: allTopics}, allQueues...)
	if err != nil {
		return err
	}
	probe.Close()
	forwards := map[*Queue]forwardConfig{}
	for _, cfg := range queues {
		q, err := b.addEntity(kindQueue, cfg.Name, cfg)
		if err != nil {
			return fmt.Errorf("broker: adding queue after validation: %w", err) // unreachable: probe passed
		}
		forwards[q] = forwardConfig{cfg.ForwardTo, cfg.ForwardDeadLetteredMessagesTo}
	}
	for _, tc := range topics {
		if err := b.addTopic(tc, forwards); err != nil {
			return fmt.Errorf("broker: adding topic after validation: %w", err) // unreachable: probe passed
		}
	}
	if err := b.resolveForwards(forwards); err != nil {
		return fmt.Errorf("broker: forwarding after validation: %w", err) // unreachable: probe passed
	}
	b.queueCfgs, b.topicCfgs = allQueues, allTopics
	b.configChanged()
	return nil
}

// ReleaseOwner returns every message locked by owner, in every queue, as a
// dropped connection does on Service Bus: the delivery counts (so the
// delivery count seen next time is one higher) and a message that reached
// MaxDeliveryCount is dead-lettered with reason "MaxDeliveryCountExceeded".
// The server calls it when a connection closes; owner is whatever id it
// passed to [Queue.Receive].
//
// Session locks of the connection go first (session.go), and the messages
// locked under them return to their sessions without counting the
// delivery, as a closed session's do on Service Bus.
func (b *Broker) ReleaseOwner(owner uint64) {
	b.mu.Lock()
	if !b.closed {
		now := b.clock.Now()
		for _, q := range b.allQueues() {
			q.releaseSessionsOf(owner, now)
			q.armTimer(now)
		}
	}
	b.unlock()
	b.returnLocksWhere(func(e *entry) bool { return e.lock.owner == owner })
}

// ExpireAllLocks is a fault-injection hook: every outstanding lock in every
// queue expires now, exactly as if its LockedUntil had passed. Later
// settlements of those deliveries fail with [ErrLockLost].
func (b *Broker) ExpireAllLocks() {
	b.returnLocksWhere(func(*entry) bool { return true })
	// Session locks expire too (session.go): their links are detached with
	// session-lock-lost, and renewals report the lock lost.
	b.mu.Lock()
	defer b.unlock()
	now := b.clock.Now()
	for _, q := range b.allQueues() {
		for _, s := range q.sessions {
			if s.holder != 0 {
				q.releaseSession(s, true, now)
			}
		}
	}
}

// returnLocksWhere returns every locked message that match selects to its queue, counting the
// delivery, as a lost lock does on Service Bus; it then re-arms the timers, since the next event may
// have changed.
func (b *Broker) returnLocksWhere(match func(*entry) bool) {
	b.mu.Lock()
	defer b.unlock()
	if b.closed {
		return
	}
	now := b.clock.Now()
	for _, q := range b.allQueues() {
		q.advance(now)
		for _, e := range q.lockedEntries() {
			if match(e) {
				q.returnLocked(e, true, now)
			}
		}
	}
	b.armAll(now)
}

// Close stops the broker's wake-up goroutine and makes blocked
// [Queue.Receive] calls return [ErrClosed]; later mutating calls return
// [ErrClosed] too, while inspection methods keep working on the final
// state. With [Options.DataDir] it then writes and syncs what the journal
// still buffers, closes it and releases the directory; [Broker.Sync]
// after Close reports how that went. Close is idempotent and returns once
// the goroutines have exited.
func (b *Broker) Close() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.done)
	}
	b.unlock()
	// Outside b.mu: the goroutine may be waiting for it in wake.
	<-b.wakeupsDone
	_ = b.closePersistence()
}

// armAll arms the wake-up for the earliest deadline of every entity; b.mu
// must be held.
func (b *Broker) armAll(now time.Time) {
	for _, q := range b.mainQueues() {
		q.armTimer(now)
	}
}

// sortBySeq sorts entries by sequence number for deterministic iteration.
func sortBySeq(es []*entry) {
	sort.Slice(es, func(i, j int) bool { return es[i].seq < es[j].seq })
}
