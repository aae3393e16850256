package broker

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Entity management for the administration API: reading an entity's
// settings and runtime counts, changing the settings that can change
// without moving messages, adding and removing subscription rules, and
// removing entities. Every change is made under b.mu, so a client never sees
// half of one, and b.queueCfgs/b.topicCfgs are kept in step with the live
// entities because [Broker.AddQueue] and [Broker.AddTopic] validate new
// entities against them.

// Errors of the management operations, compared with [errors.Is].
var (
	// ErrInUse refuses to remove an entity that cannot go without leaving
	// the broker inconsistent: another entity forwards to it, or receivers
	// hold locks on its messages (settle or close them first).
	ErrInUse = errors.New("broker: entity in use")

	// ErrRuleNotFound reports an unknown rule name on a subscription.
	ErrRuleNotFound = errors.New("broker: rule not found")

	// ErrRuleExists reports a rule name already used on the subscription.
	ErrRuleExists = errors.New("broker: rule already exists")
)

// Runtime is a snapshot of an entity's message counts and sizes, as the
// administration API reports them in CountDetails. On a topic only
// Scheduled and SizeInBytes are meaningful: messages leave a topic for its
// subscriptions as soon as they are due.
type Runtime struct {
	// Active counts receivable and locked messages, as Service Bus's
	// ActiveMessageCount does.
	Active int
	// Scheduled counts messages waiting for their enqueue time.
	Scheduled int
	// DeadLettered counts the messages in the dead-letter queue.
	DeadLettered int
	// SizeInBytes is the encoded size of every message the entity and its
	// dead-letter queue hold.
	SizeInBytes int64
	// AccessedAt is when a client last sent to the entity or received from
	// it or its dead-letter queue; zero means never, which Service Bus
	// reports as 0001-01-01 (the SDK's live tests testCreateQueue and
	// testTopicCreation expect a zero AccessedAt for an unused entity). It
	// is not kept across restarts.
	AccessedAt time.Time
}

// Total is Service Bus's MessageCount: every message the entity holds,
// dead letters included.
func (r Runtime) Total() int { return r.Active + r.Scheduled + r.DeadLettered }

// Runtime returns q's counts after applying everything due now.
func (q *Queue) Runtime() Runtime {
	b := q.b
	b.mu.Lock()
	defer b.unlock()
	q.refresh()
	r := Runtime{AccessedAt: q.accessedAt}
	for e := range q.order.entries() {
		if e.state == stateScheduled {
			r.Scheduled++
		} else {
			r.Active++
		}
		r.SizeInBytes += int64(e.size)
	}
	if q.dlq != nil {
		r.DeadLettered = q.dlq.order.len()
		for e := range q.dlq.order.entries() {
			r.SizeInBytes += int64(e.size)
		}
	}
	return r
}

// QueueConfig returns the configuration of queue name (ignoring case) as
// it was created or last updated, with the defaults applied and the
// configured spelling of the name; false if there is no such queue.
func (b *Broker) QueueConfig(name string) (QueueConfig, bool) {
	b.mu.Lock()
	defer b.unlock()
	i := b.queueIndex(name)
	if i < 0 {
		return QueueConfig{}, false
	}
	return b.queueCfgs[i].withDefaults(), true
}

// TopicConfig returns the configuration of topic name with its
// subscriptions and their rules as created or last updated (zero fields
// still mean the defaults); false if there is no such topic.
func (b *Broker) TopicConfig(name string) (TopicConfig, bool) {
	b.mu.Lock()
	defer b.unlock()
	i := b.topicIndex(name)
	if i < 0 {
		return TopicConfig{}, false
	}
	return cloneTopicConfig(b.topicCfgs[i]), true
}

// queueIndex finds a queue's configuration; b.mu must be held.
func (b *Broker) queueIndex(name string) int {
	return slices.IndexFunc(b.queueCfgs, func(c QueueConfig) bool { return strings.EqualFold(c.Name, name) })
}

// topicIndex finds a topic's configuration; b.mu must be held.
func (b *Broker) topicIndex(name string) int {
	return slices.IndexFunc(b.topicCfgs, func(c TopicConfig) bool { return strings.EqualFold(c.Name, name) })
}

// subscriptionIndex finds a subscription's configuration in topic t.
func subscriptionIndex(t TopicConfig, sub string) int {
	return slices.IndexFunc(t.Subscriptions, func(c SubscriptionConfig) bool { return strings.EqualFold(c.Name, sub) })
}

func cloneTopicConfig(t TopicConfig) TopicConfig {
	t.Subscriptions = slices.Clone(t.Subscriptions)
	for i := range t.Subscriptions {
		t.Subscriptions[i].Rules = slices.Clone(t.Subscriptions[i].Rules)
	}
	return t
}

// UpdateQueue changes the settings of an existing queue (cfg.Name, ignoring
// case) that apply to later operations only: LockDuration,
// MaxDeliveryCount, DefaultTTL, DeadLetterOnExpiration, MaxMessageSize and
// the duplicate detection window while detection stays on (Service Bus
// cannot switch it on or off after creation either), and Status, which
// receivers parked on the queue see at once (status.go). Forwarding and
// RequiresSession cannot change here; such an update wraps [ErrNotSupported]. Locks already
// granted keep their expiry.
func (b *Broker) UpdateQueue(cfg QueueConfig) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.unlock()
	if b.closed {
		return ErrClosed
	}
	i := b.queueIndex(cfg.Name)
	if i < 0 {
		return fmt.Errorf("%w: %q", ErrUnknownQueue, cfg.Name)
	}
	old := b.queueCfgs[i]
	cfg.Name = old.Name
	if !strings.EqualFold(cfg.ForwardTo, old.ForwardTo) || !strings.EqualFold(cfg.ForwardDeadLetteredMessagesTo, old.ForwardDeadLetteredMessagesTo) {
		return fmt.Errorf("%w: changing the forwarding of queue %q", ErrNotSupported, old.Name)
	}
	if cfg.RequiresSession != old.RequiresSession {
		return fmt.Errorf("%w: changing RequiresSession of queue %q", ErrNotSupported, old.Name)
	}
	if (cfg.DuplicateDetectionWindow > 0) != (old.DuplicateDetectionWindow > 0) {
		return fmt.Errorf("%w: switching duplicate detection of queue %q on or off", ErrNotSupported, old.Name)
	}
	q := b.queues[strings.ToLower(old.Name)]
	b.applySettings(q, cfg.withDefaults())
	b.queueCfgs[i] = cfg
	b.configChanged()
	return nil
}

// UpdateSubscription changes the settings of an existing subscription as
// [Broker.UpdateQueue] does for a queue: LockDuration, MaxDeliveryCount,
// DefaultTTL, DeadLetterOnExpiration and Status. Rules change through
// [Broker.AddRule] and [Broker.RemoveRule]; cfg.Rules is ignored.
func (b *Broker) UpdateSubscription(topic string, cfg SubscriptionConfig) error {
	b.mu.Lock()
	defer b.unlock()
	if b.closed {
		return ErrClosed
	}
	ti := b.topicIndex(topic)
	if ti < 0 {
		return fmt.Errorf("%w: topic %q", ErrUnknownQueue, topic)
	}
	tc := b.topicCfgs[ti]
	si := subscriptionIndex(tc, cfg.Name)
	if si < 0 {
		return fmt.Errorf("%w: subscription %q", ErrUnknownQueue, SubscriptionPath(topic, cfg.Name))
	}
	old := tc.Subscriptions[si]
	qc := cfg.queueConfig(tc.MaxMessageSize)
	qc.Name, qc.RequiresSession = old.Name, old.RequiresSession
	if err := qc.validateAs("subscription"); err != nil {
		return err
	}
	if !strings.EqualFold(cfg.ForwardTo, old.ForwardTo) || !strings.EqualFold(cfg.ForwardDeadLetteredMessagesTo, old.ForwardDeadLetteredMessagesTo) {
		return fmt.Errorf("%w: changing the forwarding of subscription %q", ErrNotSupported, SubscriptionPath(tc.Name, old.Name))
	}
	if cfg.RequiresSession != old.RequiresSession {
		return fmt.Errorf("%w: changing RequiresSession of subscription %q", ErrNotSupported, SubscriptionPath(tc.Name, old.Name))
	}
	q := b.queues[strings.ToLower(SubscriptionPath(tc.Name, old.Name))]
	b.applySettings(q, qc.withDefaults())
	cfg.Name, cfg.Rules = old.Name, old.Rules
	tc.Subscriptions = slices.Clone(tc.Subscriptions)
	tc.Subscriptions[si] = cfg
	b.topicCfgs[ti] = tc
	b.configChanged()
	return nil
}

// UpdateTopic changes a topic's DefaultTTL, MaxMessageSize, Status and
// duplicate detection window (detection cannot be switched on or off). Its
// subscriptions are unchanged.
func (b *Broker) UpdateTopic(cfg TopicConfig) error {
	qc := QueueConfig{Name: cfg.Name, DuplicateDetectionWindow: cfg.DuplicateDetectionWindow, DefaultTTL: cfg.DefaultTTL, MaxMessageSize: cfg.MaxMessageSize, Status: cfg.Status}
	if err := qc.validateAs("topic"); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.unlock()
	if b.closed {
		return ErrClosed
	}
	ti := b.topicIndex(cfg.Name)
	if ti < 0 {
		return fmt.Errorf("%w: topic %q", ErrUnknownQueue, cfg.Name)
	}
	old := b.topicCfgs[ti]
	if (cfg.DuplicateDetectionWindow > 0) != (old.DuplicateDetectionWindow > 0) {
		return fmt.Errorf("%w: switching duplicate detection of topic %q on or off", ErrNotSupported, old.Name)
	}
	q := b.queues[strings.ToLower(old.Name)]
	b.applySettings(q, qc.withDefaults())
	for _, sub := range q.subs {
		sub.cfg.MaxMessageSize = q.cfg.MaxMessageSize
		sub.dlq.cfg.MaxMessageSize = q.cfg.MaxMessageSize
	}
	cfg.Name, cfg.Subscriptions = old.Name, old.Subscriptions
	b.topicCfgs[ti] = cfg
	b.configChanged()
	return nil
}

// applySettings installs the changeable settings of cfg (defaults applied)
// on q and its dead-letter queue; b.mu must be held.
func (b *Broker) applySettings(q *Queue, cfg QueueConfig) {
	q.cfg.LockDuration = cfg.LockDuration
	q.cfg.MaxDeliveryCount = cfg.MaxDeliveryCount
	q.cfg.DefaultTTL = cfg.DefaultTTL
	q.cfg.DeadLetterOnExpiration = cfg.DeadLetterOnExpiration
	q.cfg.MaxMessageSize = cfg.MaxMessageSize
	q.cfg.DuplicateDetectionWindow = cfg.DuplicateDetectionWindow
	q.dedup.window = cfg.DuplicateDetectionWindow
	if q.cfg.Status != cfg.Status {
		q.cfg.Status = cfg.Status
		// Receivers parked on q (or on a subscription of a topic) look at
		// the status again on waking.
		q.wakeWaiters()
		for _, sub := range q.subs {
			sub.wakeWaiters()
		}
	}
	q.dlq.cfg.LockDuration = cfg.LockDuration
	q.dlq.cfg.MaxMessageSize = cfg.MaxMessageSize
}

// AddRule adds a rule to a subscription; messages published from then on
// are matched against it. A malformed filter or action wraps
// [ErrInvalidConfig]; a name in use gives [ErrRuleExists].
func (b *Broker) AddRule(topic, sub string, rc RuleConfig) error {
	return b.changeRules(topic, sub, func(rules []RuleConfig) ([]RuleConfig, error) {
		if ruleIndex(rules, ruleName(rc)) >= 0 {
			return nil, fmt.Errorf("%w: %q on %q", ErrRuleExists, ruleName(rc), SubscriptionPath(topic, sub))
		}
		return append(rules, rc), nil
	})
}

// ReplaceRule replaces the filter and action of an existing rule.
func (b *Broker) ReplaceRule(topic, sub string, rc RuleConfig) error {
	return b.changeRules(topic, sub, func(rules []RuleConfig) ([]RuleConfig, error) {
		i := ruleIndex(rules, ruleName(rc))
		if i < 0 {
			return nil, fmt.Errorf("%w: %q on %q", ErrRuleNotFound, ruleName(rc), SubscriptionPath(topic, sub))
		}
		rules[i] = rc
		return rules, nil
	})
}

// RemoveRule removes a rule by name (ignoring case). A subscription may be
// left without rules, as on Service Bus; it then receives nothing, and
// since an empty [SubscriptionConfig.Rules] means $Default, its
// configuration ([Broker.TopicConfig]) holds a single FalseFilter rule
// named "$none" instead ([Broker.Rules] reports none).
func (b *Broker) RemoveRule(topic, sub, name string) error {
	return b.changeRules(topic, sub, func(rules []RuleConfig) ([]RuleConfig, error) {
		i := ruleIndex(rules, name)
		if i < 0 {
			return nil, fmt.Errorf("%w: %q on %q", ErrRuleNotFound, name, SubscriptionPath(topic, sub))
		}
		return slices.Delete(rules, i, i+1), nil
	})
}

// noRules marks a subscription whose every rule was removed: an empty
// Rules slice would mean $Default to [compileRules].
var noRules = []RuleConfig{{Name: "$none", SQLFilter: "1=0"}}

// isNoRules reports whether rules is the noRules marker.
func isNoRules(rules []RuleConfig) bool {
	return len(rules) == 1 && rules[0].Name == noRules[0].Name && rules[0].SQLFilter == noRules[0].SQLFilter &&
		rules[0].CorrelationFilter == nil && rules[0].SQLAction == ""
}

// Rules returns a subscription's rules as configured ($Default when it
// was created without any); false if the subscription does not exist.
func (b *Broker) Rules(topic, sub string) ([]RuleConfig, bool) {
	b.mu.Lock()
	defer b.unlock()
	ti := b.topicIndex(topic)
	if ti < 0 {
		return nil, false
	}
	si := subscriptionIndex(b.topicCfgs[ti], sub)
	if si < 0 {
		return nil, false
	}
	return effectiveRules(b.topicCfgs[ti].Subscriptions[si].Rules), true
}

// effectiveRules is what compileRules makes of a configured rule list.
func effectiveRules(rules []RuleConfig) []RuleConfig {
	switch {
	case len(rules) == 0:
		return []RuleConfig{{Name: DefaultRuleName}}
	case isNoRules(rules):
		return nil
	}
	return slices.Clone(rules)
}

func ruleName(rc RuleConfig) string {
	if rc.Name == "" {
		return DefaultRuleName
	}
	return rc.Name
}

func ruleIndex(rules []RuleConfig, name string) int {
	return slices.IndexFunc(rules, func(r RuleConfig) bool { return strings.EqualFold(ruleName(r), name) })
}

// changeRules applies change to a copy of a subscription's effective rules,
// compiles the result and installs it; on error nothing changes.
func (b *Broker) changeRules(topic, sub string, change func([]RuleConfig) ([]RuleConfig, error)) error {
	b.mu.Lock()
	defer b.unlock()
	if b.closed {
		return ErrClosed
	}
	ti := b.topicIndex(topic)
	if ti < 0 {
		return fmt.Errorf("%w: topic %q", ErrUnknownQueue, topic)
	}
	tc := cloneTopicConfig(b.topicCfgs[ti])
	si := subscriptionIndex(tc, sub)
	if si < 0 {
		return fmt.Errorf("%w: subscription %q", ErrUnknownQueue, SubscriptionPath(topic, sub))
	}
	path := SubscriptionPath(tc.Name, tc.Subscriptions[si].Name)
	rules, err := change(effectiveRules(tc.Subscriptions[si].Rules))
	if err != nil {
		return err
	}
	if len(rules) == 0 {
		rules = slices.Clone(noRules)
	}
	if err := b.storable(rules); err != nil {
		return err
	}
	compiled, err := compileRules(path, rules)
	if err != nil {
		return err
	}
	b.queues[strings.ToLower(path)].rules = compiled
	tc.Subscriptions[si].Rules = rules
	b.topicCfgs[ti] = tc
	b.configChanged()
	return nil
}

// RemoveQueue deletes a queue and its dead-letter queue with every message
// in them, locked ones included: Service Bus deletes a queue whose messages
// are locked by receivers (the SDK's live test
// TestAdminClient_GetQueueRuntimeProperties deletes one holding an unsettled
// peek-locked message), and their settlements then fail. It refuses,
// wrapping [ErrInUse], while another entity forwards to the queue.
// Receivers blocked on the queue return [ErrUnknownQueue], and later sends,
// receives and settlements through a *Queue obtained earlier fail with it
// too.
func (b *Broker) RemoveQueue(name string) error {
	b.mu.Lock()
	defer b.unlock()
	if b.closed {
		return ErrClosed
	}
	q, ok := b.queues[strings.ToLower(name)]
	if !ok || q.kind != kindQueue {
		return fmt.Errorf("%w: %q", ErrUnknownQueue, name)
	}
	if err := b.checkRemovable(q, nil); err != nil {
		return err
	}
	b.dropEntities(q)
	b.queueCfgs = slices.DeleteFunc(b.queueCfgs, func(c QueueConfig) bool { return strings.EqualFold(c.Name, q.name) })
	b.configChanged()
	return nil
}

// RemoveTopic deletes a topic with its subscriptions, on the terms of
// [Broker.RemoveQueue]: refused while another entity forwards to the topic
// or to one of its subscriptions.
func (b *Broker) RemoveTopic(name string) error {
	b.mu.Lock()
	defer b.unlock()
	if b.closed {
		return ErrClosed
	}
	t, ok := b.queues[strings.ToLower(name)]
	if !ok || t.kind != kindTopic {
		return fmt.Errorf("%w: topic %q", ErrUnknownQueue, name)
	}
	gone := append([]*Queue{t}, t.subs...)
	for _, q := range gone {
		if err := b.checkRemovable(q, gone); err != nil {
			return err
		}
	}
	b.dropEntities(gone...)
	b.topicCfgs = slices.DeleteFunc(b.topicCfgs, func(c TopicConfig) bool { return strings.EqualFold(c.Name, t.name) })
	b.configChanged()
	return nil
}

// RemoveSubscription deletes one subscription of a topic, on the terms of
// [Broker.RemoveQueue].
func (b *Broker) RemoveSubscription(topic, sub string) error {
	b.mu.Lock()
	defer b.unlock()
	if b.closed {
		return ErrClosed
	}
	q, ok := b.queues[strings.ToLower(SubscriptionPath(topic, sub))]
	if !ok || q.kind != kindSubscription {
		return fmt.Errorf("%w: subscription %q", ErrUnknownQueue, SubscriptionPath(topic, sub))
	}
	if err := b.checkRemovable(q, nil); err != nil {
		return err
	}
	t := b.queues[strings.ToLower(topic)]
	t.subs = slices.DeleteFunc(slices.Clone(t.subs), func(s *Queue) bool { return s == q })
	b.dropEntities(q)
	ti := b.topicIndex(topic)
	tc := cloneTopicConfig(b.topicCfgs[ti])
	tc.Subscriptions = slices.DeleteFunc(tc.Subscriptions, func(c SubscriptionConfig) bool {
		return strings.EqualFold(SubscriptionPath(tc.Name, c.Name), q.name)
	})
	b.topicCfgs[ti] = tc
	b.configChanged()
	return nil
}

// checkRemovable refuses to remove q while an entity outside alsoGone
// forwards to it; b.mu must be held.
func (b *Broker) checkRemovable(q *Queue, alsoGone []*Queue) error {
	for _, src := range b.entities {
		if slices.Contains(alsoGone, src) || src == q {
			continue
		}
		if src.forwardTo == q || src.forwardDeadLettersTo == q {
			return fmt.Errorf("%w: %s %q forwards to %s %q; change or remove it first", ErrInUse, src.kindName(), src.name, q.kindName(), q.name)
		}
	}
	return nil
}

// dropEntities unregisters qs and wakes their blocked receivers, which then
// see them removed; b.mu must be held.
func (b *Broker) dropEntities(qs ...*Queue) {
	for _, q := range qs {
		delete(b.queues, strings.ToLower(q.name))
		b.entities = slices.DeleteFunc(b.entities, func(e *Queue) bool { return e == q })
		for _, x := range []*Queue{q, q.dlq} {
			x.removed = true
			// The locks go with the entity: a settlement finds none (and
			// reports the entity gone, see Queue.locked), and no lock expiry
			// brings a message back into a deleted queue.
			for _, e := range x.locks {
				x.timeline.setDeadline(e, time.Time{})
			}
			clear(x.locks)
			if x.waiters > 0 {
				close(x.notify)
				x.notify = make(chan struct{})
			}
		}
	}
}

// removedError is the error of an operation on a removed entity.
func (q *Queue) removedError() error {
	return fmt.Errorf("%w: %q was deleted", ErrUnknownQueue, q.name)
}

// AddSubscription adds a subscription to an existing topic while the broker
// runs, validated with every existing entity as [Broker.AddTopic] is
// (limits, rules, forwarding targets and loops); on error nothing changes.
// It receives the messages published from then on.
func (b *Broker) AddSubscription(topic string, sc SubscriptionConfig) error {
	if err := b.storable(sc); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.unlock()
	if b.closed {
		return ErrClosed
	}
	ti := b.topicIndex(topic)
	if ti < 0 {
		return fmt.Errorf("%w: topic %q", ErrUnknownQueue, topic)
	}
	tc := cloneTopicConfig(b.topicCfgs[ti])
	tc.Subscriptions = append(tc.Subscriptions, sc)
	allTopics := slices.Clone(b.topicCfgs)
	allTopics[ti] = tc
	probe, err := New(Options{Topics: allTopics}, b.queueCfgs...)
	if err != nil {
		return err
	}
	probe.Close()
	t := b.queues[strings.ToLower(tc.Name)]
	path := SubscriptionPath(tc.Name, sc.Name)
	sqc := sc.queueConfig(t.cfg.MaxMessageSize)
	rules, err := compileRules(path, sc.Rules)
	if err != nil {
		return err // unreachable: probe passed
	}
	sub, err := b.addEntity(kindSubscription, path, sqc)
	if err != nil {
		return err // unreachable: probe passed
	}
	sub.rules = rules
	sub.topic = t
	t.subs = append(slices.Clone(t.subs), sub)
	if err := b.resolveForwards(map[*Queue]forwardConfig{sub: {sc.ForwardTo, sc.ForwardDeadLetteredMessagesTo}}); err != nil {
		return fmt.Errorf("broker: forwarding after validation: %w", err) // unreachable: probe passed
	}
	b.topicCfgs[ti] = tc
	b.configChanged()
	return nil
}
