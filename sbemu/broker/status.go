package broker

import (
	"errors"
	"fmt"
	"strings"
)

// Entity status, as Service Bus has it (learn.microsoft.com/azure/
// service-bus-messaging/entity-suspend, "Suspend and reactivate messaging
// entities", and the EntityStatus enumeration of Microsoft.ServiceBus.
// Messaging):
//
//   - Active: sends and receives work.
//   - Disabled: the entity is suspended, "equivalent to setting both
//     SendDisabled and ReceiveDisabled"; its messages are kept.
//   - SendDisabled: sends (and schedules) to a queue or topic fail;
//     receives work.
//   - ReceiveDisabled: sends work; receives, and completing a message,
//     from a queue or subscription fail ("If you issue a receive or
//     complete request to a queue or subscription that has a status of
//     ReceiveDisabled, Service Bus returns a MessagingEntityDisabledException").
//
// A topic's status reaches its subscriptions only for receiving: nothing
// can be received from a subscription of a Disabled topic. A message sent
// to an active topic is still copied into a disabled subscription, scheduled
// messages of a disabled topic still fall due, and expired messages are
// still removed (the enumeration's notes). Management operations (peek,
// renewals, session state, the administration API) are not affected. The
// documentation says nothing about dead-letter queues, so the emulator
// leaves them open whatever their entity's status.

// EntityStatus is the status of a queue, topic or subscription. The zero
// value is [StatusActive].
type EntityStatus string

// The statuses a client may set, spelt as the administration API spells
// them (azservicebus admin.EntityStatus).
const (
	StatusActive          EntityStatus = "Active"
	StatusDisabled        EntityStatus = "Disabled"
	StatusSendDisabled    EntityStatus = "SendDisabled"
	StatusReceiveDisabled EntityStatus = "ReceiveDisabled"
)

// ErrEntityDisabled reports a send to an entity whose status forbids
// sending, or a receive or completion from one whose status forbids
// receiving; the error is a [*DisabledError] saying which. The AMQP server answers it with com.microsoft:entity-disabled,
// which the SDK treats as fatal (azservicebus internal/errors.go).
var ErrEntityDisabled = errors.New("broker: messaging entity disabled")

// ParseEntityStatus reads a status as the administration API writes it,
// ignoring case; empty is [StatusActive]. The statuses only the service
// sets (Creating, Deleting, Renaming, Restoring, Unknown) are refused with
// [ErrInvalidConfig].
func ParseEntityStatus(s string) (EntityStatus, error) {
	if strings.TrimSpace(s) == "" {
		return StatusActive, nil
	}
	for _, st := range []EntityStatus{StatusActive, StatusDisabled, StatusSendDisabled, StatusReceiveDisabled} {
		if strings.EqualFold(s, string(st)) {
			return st, nil
		}
	}
	return "", fmt.Errorf("%w: entity status %q: want Active, Disabled, SendDisabled or ReceiveDisabled", ErrInvalidConfig, s)
}

// orActive is s with the zero value spelt out.
func (s EntityStatus) orActive() EntityStatus {
	if s == "" {
		return StatusActive
	}
	return s
}

// valid reports whether s is the zero value or one of the four statuses,
// spelt exactly.
func (s EntityStatus) valid() bool {
	switch s {
	case "", StatusActive, StatusDisabled, StatusSendDisabled, StatusReceiveDisabled:
		return true
	}
	return false
}

// sends and receives report whether the status lets clients send to and
// receive from the entity.
func (s EntityStatus) sends() bool {
	return s != StatusDisabled && s != StatusSendDisabled
}

func (s EntityStatus) receives() bool {
	return s != StatusDisabled && s != StatusReceiveDisabled
}

// Status is the entity's status; a dead-letter queue reports its entity's.
func (q *Queue) Status() EntityStatus {
	b := q.b
	b.mu.Lock()
	defer b.unlock()
	if q.parent != nil {
		return q.parent.cfg.Status.orActive()
	}
	return q.cfg.Status.orActive()
}

// DisabledError is the [ErrEntityDisabled] of one refusal: which entity
// refused what, and for which status (of the entity, or of a
// subscription's topic).
type DisabledError struct {
	Entity  string       // the entity's path
	Sending bool         // a send or schedule was refused; false: a receive or completion
	Status  EntityStatus // the status that refused it
	Topic   string       // set when the status is that of the subscription's topic
}

// Error names the entity, the operation and the status.
func (e *DisabledError) Error() string {
	op := "receiving from"
	if e.Sending {
		op = "sending to"
	}
	if e.Topic != "" {
		return fmt.Sprintf("%v: %s %q is disabled: its topic %q is %s", ErrEntityDisabled, op, e.Entity, e.Topic, e.Status)
	}
	return fmt.Sprintf("%v: %s %q is disabled (status %s)", ErrEntityDisabled, op, e.Entity, e.Status)
}

// Unwrap makes errors.Is(err, ErrEntityDisabled) hold.
func (e *DisabledError) Unwrap() error { return ErrEntityDisabled }

// sendAllowed refuses a send or schedule to q when its status forbids it;
// b.mu must be held.
func (q *Queue) sendAllowed() error {
	if st := q.cfg.Status; !st.sends() {
		return &DisabledError{Entity: q.name, Sending: true, Status: st}
	}
	return nil
}

// receiveAllowed refuses a receive or completion from q when its status,
// or that of its topic, forbids it; b.mu must be held. Dead-letter queues
// are always open (see above).
func (q *Queue) receiveAllowed() error {
	if q.parent != nil {
		return nil
	}
	if st := q.cfg.Status; !st.receives() {
		return &DisabledError{Entity: q.name, Status: st}
	}
	if t := q.topic; t != nil && t.cfg.Status == StatusDisabled {
		return &DisabledError{Entity: q.name, Status: StatusDisabled, Topic: t.name}
	}
	return nil
}

// SendAllowed reports, as [ErrEntityDisabled], whether a send to the
// entity would be refused for its status; the AMQP server checks it when a
// sender attaches.
func (q *Queue) SendAllowed() error {
	b := q.b
	b.mu.Lock()
	defer b.unlock()
	return q.sendAllowed()
}

// ReceiveAllowed is [Queue.SendAllowed] for receiving.
func (q *Queue) ReceiveAllowed() error {
	b := q.b
	b.mu.Lock()
	defer b.unlock()
	return q.receiveAllowed()
}
