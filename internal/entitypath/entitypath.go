// Package entitypath is the one implementation of the Service Bus entity paths this module reads and
// writes: a queue's is its name ("orders"), a topic subscription's is
// "topic/Subscriptions/subscription" ("events/Subscriptions/billing"), the form the SDK's
// NewReceiverForSubscription addresses, the administration API serves and the retry envelope records
// as its source.
//
// Service Bus reads the middle segment in any letter case, so [Split] and [Parse] do too; [Subscription]
// always writes it as [SubscriptionsSegment]. Subscription names never contain '/', while queue and
// topic names may: [Split] follows that rule, taking the last segment as the subscription. [Parse], for
// paths an operator or a configuration names, accepts only the one-segment and three-segment forms, since
// a path like "events/billing" is far more often a forgotten "Subscriptions" than a queue with a slash.
package entitypath

import (
	"fmt"
	"strings"
)

// SubscriptionsSegment is the path segment between a topic and one of its subscriptions, as Service Bus
// spells it.
const SubscriptionsSegment = "Subscriptions"

// Subscription returns the entity path of subscription of topic: "topic/Subscriptions/subscription".
func Subscription(topic, subscription string) string {
	return topic + "/" + SubscriptionsSegment + "/" + subscription
}

// Split splits a subscription path into its topic and subscription: the subscription is the last
// segment, the one before it is [SubscriptionsSegment] in any letter case, and the topic is everything
// before that (it may contain '/', as Service Bus topic names may). ok is false for every other path (a
// queue name, a dead-letter path such as "events/Subscriptions/billing/$DeadLetterQueue"). Split only
// reads the shape: topic or subscription may be empty or blank; [Parse] refuses those.
func Split(path string) (topic, subscription string, ok bool) {
	i := strings.LastIndexByte(path, '/')
	if i < 0 {
		return "", "", false
	}
	rest, subscription := path[:i], path[i+1:]
	j := strings.LastIndexByte(rest, '/')
	if j < 0 || !strings.EqualFold(rest[j+1:], SubscriptionsSegment) {
		return "", "", false
	}
	return rest[:j], subscription, true
}

// Entity is an entity path that messages are received from, parsed by [Parse]: a queue (Queue set) or a
// topic subscription (Topic and Subscription set). The zero value is invalid.
type Entity struct {
	// Queue is the queue's name; empty for a subscription.
	Queue string
	// Topic and Subscription name a subscription; both empty for a queue.
	Topic, Subscription string
}

// IsSubscription reports whether e names a subscription.
func (e Entity) IsSubscription() bool { return e.Topic != "" }

// Path is e's entity path: the queue name, or [Subscription](Topic, Subscription).
func (e Entity) Path() string {
	if e.IsSubscription() {
		return Subscription(e.Topic, e.Subscription)
	}
	return e.Queue
}

// Parse reads the path of a queue ("orders") or of a topic subscription ("events/Subscriptions/billing",
// the middle segment in any letter case). A path with an empty or blank segment, and any other shape, is
// an error that quotes the path; callers prefix it with their package and wrap their own sentinel.
// Parse(e.Path()) gives e back for every Entity Parse returns.
func Parse(path string) (Entity, error) {
	for s := range strings.SplitSeq(path, "/") {
		if strings.TrimSpace(s) == "" {
			return Entity{}, fmt.Errorf("entity %q has an empty name", path)
		}
	}
	if !strings.Contains(path, "/") {
		return Entity{Queue: path}, nil
	}
	if topic, sub, ok := Split(path); ok && !strings.Contains(topic, "/") {
		return Entity{Topic: topic, Subscription: sub}, nil
	}
	return Entity{}, fmt.Errorf("entity %q is neither a queue name nor %q", path, Subscription("<topic>", "<subscription>"))
}
