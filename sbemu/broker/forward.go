package broker

import (
	"fmt"
	"strings"
	"time"
)

// Auto-forwarding, as Service Bus documents it
// (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-auto-forwarding):
// a queue or subscription with ForwardTo passes every message on to the
// target queue or topic as soon as it becomes available, and one with
// ForwardDeadLetteredMessagesTo sends what it dead-letters there instead of
// to its own dead-letter queue. The target must exist when the source is
// configured, as on Service Bus. The emulator also refuses any forwarding
// loop at configuration time, which keeps every forward a bounded,
// synchronous move under the broker lock.

// forwardConfig holds the target names of one entity until every entity
// exists and they can be resolved.
type forwardConfig struct {
	to, deadLettersTo string
}

// resolveForwards binds forwarding targets and rejects unknown targets,
// subscriptions as targets, and loops.
func (b *Broker) resolveForwards(forwards map[*Queue]forwardConfig) error {
	resolve := func(src *Queue, field, name string) (*Queue, error) {
		if name == "" {
			return nil, nil
		}
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%w: %s %q: %s %s", ErrInvalidConfig, src.kindName(), src.name, field, fmt.Sprintf(format, args...))
		}
		if isSubscriptionPath(name) {
			return nil, bad("%q: a subscription cannot be a forwarding target", name)
		}
		t, ok := b.queues[strings.ToLower(name)]
		switch {
		case !ok:
			return nil, bad("%q: no such queue or topic", name)
		case t == src:
			return nil, bad("%q: an entity cannot forward to itself", name)
		}
		return t, nil
	}
	// Map iteration order is random; resolve in configuration order so the
	// first error reported is always the same.
	for _, q := range b.entities {
		fc, ok := forwards[q]
		if !ok {
			continue
		}
		var err error
		if q.forwardTo, err = resolve(q, "ForwardTo", fc.to); err != nil {
			return err
		}
		if q.forwardDeadLettersTo, err = resolve(q, "ForwardDeadLetteredMessagesTo", fc.deadLettersTo); err != nil {
			return err
		}
	}
	return b.checkForwardLoops()
}

// checkForwardLoops rejects configurations where a message could travel in
// a circle: through ForwardTo links and a topic's fan-out to its
// subscriptions. Dead-letter forwarding is not followed, because a message
// is only dead-lettered again by another failure.
func (b *Broker) checkForwardLoops() error {
	const (
		unvisited = iota
		visiting
		done
	)
	state := map[*Queue]int{}
	var visit func(q *Queue, path []string) error
	visit = func(q *Queue, path []string) error {
		switch state[q] {
		case visiting:
			return fmt.Errorf("%w: auto-forwarding loop: %s", ErrInvalidConfig, strings.Join(append(path, q.name), " -> "))
		case done:
			return nil
		}
		state[q] = visiting
		path = append(path, q.name)
		next := append([]*Queue(nil), q.subs...)
		if q.forwardTo != nil {
			next = append(next, q.forwardTo)
		}
		for _, n := range next {
			if err := visit(n, path); err != nil {
				return err
			}
		}
		state[q] = done
		return nil
	}
	for _, q := range b.entities {
		if err := visit(q, nil); err != nil {
			return err
		}
	}
	return nil
}

// forward moves an available message to the ForwardTo target. b.mu must be
// held.
func (q *Queue) forward(e *entry, now time.Time) {
	q.removeEntry(e)
	q.forwardTo.enqueueLocked(e.message(), e.size, now, e.expiresAt, now)
}

// kindName names q's kind for error messages.
func (q *Queue) kindName() string {
	switch q.kind {
	case kindTopic:
		return "topic"
	case kindSubscription:
		return "subscription"
	}
	return "queue"
}
