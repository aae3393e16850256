package inspect

import (
	"fmt"
	"strings"

	"github.com/sbretry/retry/internal/entitypath"
)

// Entity names a Service Bus entity that messages are received from: a queue, or a topic's
// subscription. The zero value is invalid; use [ParseEntity].
type Entity struct {
	// Queue is the queue name; empty for a subscription.
	Queue string
	// Topic and Subscription name a subscription; both empty for a queue.
	Topic, Subscription string
}

// ParseEntity parses a queue name ("orders") or a subscription path ("orders/Subscriptions/billing",
// the form the retry library records in [envelope.PropSource]; the middle segment is matched ignoring
// case). A dead-letter path ("orders/$DeadLetterQueue") is refused: inspect the entity itself, its
// dead-letter queue is read with it. Errors wrap [ErrInvalidEntity].
func ParseEntity(path string) (Entity, error) {
	for p := range strings.SplitSeq(path, "/") {
		if strings.HasPrefix(p, "$") {
			return Entity{}, fmt.Errorf("%w: %q: name the queue or subscription, not a sub-queue; its dead-letter queue is read with it", ErrInvalidEntity, path)
		}
	}
	e, err := entitypath.Parse(path)
	if err != nil {
		return Entity{}, fmt.Errorf("%w: %w", ErrInvalidEntity, err)
	}
	return Entity(e), nil
}

// IsSubscription reports whether e names a subscription.
func (e Entity) IsSubscription() bool { return e.Topic != "" }

// Path is the entity path: the queue name, or "topic/Subscriptions/subscription".
func (e Entity) Path() string { return entitypath.Entity(e).Path() }

// DeadLetterPath is the path of e's dead-letter queue, as Service Bus names it.
func (e Entity) DeadLetterPath() string { return e.Path() + "/$DeadLetterQueue" }

// String returns [Entity.Path].
func (e Entity) String() string { return e.Path() }
