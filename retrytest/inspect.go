package retrytest

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/sbemu/broker"
)

// WaitUntil blocks until cond returns true or ctx ends. cond is checked at once, after every change
// made through the broker, and whenever the clock reaches the broker's next deadline (a scheduled
// message falling due, a lock or a message expiring), so it also sees changes no call made. cond runs
// without the broker's lock held and may call its inspection methods.
func (b *Broker) WaitUntil(ctx context.Context, cond func() bool) error {
	for {
		b.mu.Lock()
		changed := b.changed
		timer, passed := b.timerLocked(b.model.Advance())
		b.mu.Unlock()
		if cond() {
			return nil
		}
		if passed {
			continue
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("retrytest: condition not met: %w", ctx.Err())
		case <-changed:
		case <-timer:
		}
	}
}

// Scheduled returns every message scheduled through a Sender, in order.
func (b *Broker) Scheduled() []ScheduledMessage {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]ScheduledMessage(nil), b.scheduled...)
}

// Completed returns every completed message, in order, including originals completed after their retry
// copy was scheduled; Stats.Succeeded counts only the successes. DeliveryCount is the deliveries the
// message had, the completed one included.
func (b *Broker) Completed() []*azservicebus.ReceivedMessage {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]*azservicebus.ReceivedMessage, len(b.completed))
	for i := range b.completed {
		c := &b.completed[i]
		if c.rm == nil {
			c.rm = receivedMessage(c.msg, headerDeliveryCount(c.msg), [16]byte{})
			c.msg = nil
		}
		out[i] = c.rm
	}
	return out
}

// DeadLettered returns the messages in the dead-letter queue (on a topic, of every subscription in
// subscription order, then of the retry queue), each queue in the order the messages arrived there,
// after applying what is due now: messages dead-lettered by a handler, by the retry package, and by the broker itself
// (MaxDeliveryCountExceeded, TTLExpiredException).
func (b *Broker) DeadLettered() []DeadLetteredMessage {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.model.Advance()
	var out []DeadLetteredMessage
	for _, src := range b.sources {
		dlq, _ := b.model.Queue(src.Name() + broker.DeadLetterSuffix)
		for _, d := range dlq.Peek(0, math.MaxInt) {
			rm := receivedMessage(d.Message, headerDeliveryCount(d.Message), [16]byte{})
			dl := DeadLetteredMessage{Message: rm, Entity: src.Name()}
			if rm.DeadLetterReason != nil {
				dl.Reason = *rm.DeadLetterReason
			}
			if rm.DeadLetterErrorDescription != nil {
				dl.Description = *rm.DeadLetterErrorDescription
			}
			out = append(out, dl)
		}
	}
	return out
}

// Stats counts the messages in each state. The counters are named for what a handler author waits for:
// a failed attempt completes its original too (after scheduling the copy), so "completed" alone would
// count failures; Succeeded does not.
type Stats struct {
	// Active are receivable now, Pending scheduled for later, Locked received and not yet settled. On a
	// topic they add up every subscription, the topic's scheduled messages and the retry queue.
	Active, Pending, Locked int
	// Succeeded counts completions with no retry copy scheduled for them: the handler succeeded.
	Succeeded int
	// Retried counts originals completed after their retry copy was scheduled: the attempt failed.
	Retried int
	// DeadLettered counts the messages in the dead-letter queues (a topic's subscriptions' and the
	// retry queue's), with our reasons or the broker's.
	DeadLettered int
	// Scheduled counts ScheduleMessages copies, including those duplicate detection dropped.
	Scheduled int
	// Duplicates counts the sends and schedules duplicate detection dropped.
	Duplicates int
	// Connects counts the connections the Connector built.
	Connects int
}

// Stats returns the current counts, after applying what is due now: scheduled messages activate,
// locks and messages expire.
func (b *Broker) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.model.Advance()
	st := Stats{
		Succeeded: b.succeeded, Retried: b.retried, Scheduled: len(b.scheduled),
		Duplicates: b.duplicates, Connects: b.connects,
	}
	if b.target.IsTopic() {
		st.Pending = b.target.Stats().Scheduled
	}
	for _, src := range b.sources {
		s := src.Stats()
		st.Active += s.Active
		st.Pending += s.Scheduled
		st.Locked += s.Locked
		st.DeadLettered += s.DeadLettered
	}
	return st
}

// AdvanceToNextScheduled moves clk (a mock clock such as benbjohnson/clock's *Mock) to the due time of
// the earliest scheduled message (in the queue, the topic or the retry queue), so that it becomes
// receivable, and returns that time. It reports false, leaving the clock alone, when nothing is
// scheduled.
func (b *Broker) AdvanceToNextScheduled(clk interface {
	Now() time.Time
	Add(time.Duration)
}) (time.Time, bool) {
	b.mu.Lock()
	var next time.Time
	for _, q := range []*broker.Queue{b.target, b.retryQueue} {
		if q == nil {
			continue
		}
		for _, s := range q.ScheduledMessages() {
			if next.IsZero() || s.At.Before(next) {
				next = s.At
			}
		}
	}
	b.mu.Unlock()
	if next.IsZero() {
		return time.Time{}, false
	}
	if d := next.Sub(clk.Now()); d > 0 {
		clk.Add(d)
	}
	b.mu.Lock()
	b.model.Advance()
	b.notifyLocked()
	b.mu.Unlock()
	return next, true
}

// ExpireLocks makes every current lock expire now, as if the lock duration had passed: settling those
// messages then fails with azservicebus.CodeLockLost and they become receivable again (or go to the
// dead-letter queue with MaxDeliveryCountExceeded when that was their last delivery). Session locks
// expire too: their [SessionReceiver]s fail with CodeLockLost, and the sessions can be accepted again
// with their unsettled messages first, the delivery counted.
func (b *Broker) ExpireLocks() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.model.ExpireAllLocks()
	b.notifyLocked()
}

// SessionInfo summarises one session of a session-aware entity, for [Broker.Sessions].
type SessionInfo struct {
	// Entity is the path of the queue or subscription the session belongs to.
	Entity string
	// ID is the session id.
	ID string
	// Active, Locked, Deferred and Scheduled count the session's messages: receivable now, received
	// and not settled, set aside by DeferMessage, and scheduled for later.
	Active, Locked, Deferred, Scheduled int
	// LockedUntil is when the receiver holding the session loses it; zero when none holds it.
	LockedUntil time.Time
	// State is a copy of the session state, nil when none is set.
	State []byte
}

// Sessions returns every session of the broker's session-aware entities (the queue, or the topic's
// subscriptions in order) that has a message in any state, a receiver holding it or a state, each
// entity's sorted by id, after applying what is due now (a session lock that ran out is no longer
// held). It reads the sessions without taking their locks, so a test can look at a session while its
// receiver holds it, such as the state a handler recorded. A broker without sessions has none.
func (b *Broker) Sessions() []SessionInfo {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.model.Advance()
	var out []SessionInfo
	for _, src := range b.sources {
		for _, s := range src.SessionSnapshots() {
			out = append(out, SessionInfo{
				Entity: src.Name(), ID: s.ID,
				Active: s.Active, Locked: s.Locked, Deferred: s.Deferred, Scheduled: s.Scheduled,
				LockedUntil: s.LockedUntil, State: s.State,
			})
		}
	}
	return out
}

// DeferredMessage is one deferred message, for [Broker.Deferred].
type DeferredMessage struct {
	// Entity is the path of the queue or subscription that holds the message.
	Entity string
	// Message is the message as a peek shows it: its SessionID, SequenceNumber (the number to receive
	// it by), State azservicebus.MessageStateDeferred, and DeliveryCount the deliveries it had.
	Message *azservicebus.ReceivedMessage
}

// Deferred returns the deferred messages of every entity receivers read, by entity (the queue, or the
// subscriptions in order and then the retry queue), then by session id, then in sequence order, after
// applying what is due now. A message received by sequence number and not settled yet is still listed.
func (b *Broker) Deferred() []DeferredMessage {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.model.Advance()
	var out []DeferredMessage
	for _, src := range b.sources {
		var msgs []*azservicebus.ReceivedMessage
		for _, d := range src.Peek(0, math.MaxInt) {
			if rm := receivedMessage(d.Message, headerDeliveryCount(d.Message), [16]byte{}); rm.State == azservicebus.MessageStateDeferred {
				msgs = append(msgs, rm)
			}
		}
		// Peek is in sequence order; a stable sort by session keeps it within each session.
		slices.SortStableFunc(msgs, func(x, y *azservicebus.ReceivedMessage) int { return strings.Compare(sessionOf(x), sessionOf(y)) })
		for _, m := range msgs {
			out = append(out, DeferredMessage{Entity: src.Name(), Message: m})
		}
	}
	return out
}

// sessionOf is a message's session id, "" without one.
func sessionOf(m *azservicebus.ReceivedMessage) string {
	if m.SessionID == nil {
		return ""
	}
	return *m.SessionID
}
