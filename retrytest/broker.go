package retrytest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/sbemu/broker"
)

// maxReceive is the SDK's limit on maxMessages per ReceiveMessages call.
const maxReceive = 5000

// Broker is one Service Bus entity in memory: a queue, or a topic with subscriptions. The zero value
// is not usable; call [New]. It is safe for concurrent use.
//
// Every message semantic (sequence numbers, locks, delivery counts, scheduling, time-to-live, duplicate
// detection, size limits, rules, dead-lettering) is the emulator's broker model, package
// sbemu/broker, reached in process instead of over AMQP. Broker adds what a test needs around it:
// connections that can be closed, fault switches, and records of what was scheduled and completed.
type Broker struct {
	clock retry.Clock
	opts  BrokerOptions

	// model holds the entities. name is the queue or topic; target is where sends go (the queue or
	// the topic) and scheduleTarget where a Sender schedules (the target, or the retry queue);
	// consumed is what Receiver and Connector read (the queue, or the consumed subscription);
	// retryQueue is the subscription's retry queue, nil without one; sources are every entity
	// receivers can read, for inspection (the queue, or the subscriptions in order and then the retry
	// queue). None of them change after construction.
	model          *broker.Broker
	name           string
	target         *broker.Queue
	scheduleTarget *broker.Queue
	consumed       *broker.Queue
	retryQueue     *broker.Queue
	sources        []*broker.Queue

	// mu guards everything below. It is taken before the model's own lock, never after.
	mu       sync.Mutex
	changed  chan struct{} // closed and replaced on every change made through this broker
	nextConn uint64

	scheduled  []ScheduledMessage
	successors map[chainStep][]successor // the retry copies scheduled, by chain and the attempt they follow
	succeeded  int
	retried    int
	completed  []completion
	duplicates int
	connects   int
	faults     map[Op]*fault
}

// completion is one completed message, converted for [Broker.Completed] only when asked for: most
// tests never look, and the conversion is the costly part of a completion.
type completion struct {
	msg *amqp.Message
	rm  *azservicebus.ReceivedMessage // nil until converted
}

// ScheduledMessage records one message scheduled through the Sender.
type ScheduledMessage struct {
	// At is the scheduled enqueue time.
	At time.Time
	// MessageID is the message's MessageID.
	MessageID string
	// Attempt is the retry attempt the copy carries (its envelope.PropAttempt), or 0 if it has none.
	Attempt int
	// SequenceNumber is the number returned by ScheduleMessages. As on Service Bus, the message gets a
	// new sequence number when it becomes receivable.
	SequenceNumber int64
	// Duplicate is true when duplicate detection dropped it.
	Duplicate bool
	// Message is a copy of what was scheduled.
	Message *azservicebus.Message
}

// DeadLetteredMessage is one message in a dead-letter queue.
type DeadLetteredMessage struct {
	// Entity is the path of the entity whose dead-letter queue holds the message: the queue, a
	// subscription ("topic/Subscriptions/name") or the retry queue, where Service Bus would put it.
	Entity string
	// Message is the dead-lettered message as a receiver of the dead-letter queue would see it, with
	// DeadLetterReason, DeadLetterErrorDescription, DeadLetterSource and EnqueuedSequenceNumber (its
	// number before it was dead-lettered) set; SequenceNumber is its number in the dead-letter queue
	// and DeliveryCount the deliveries it had.
	Message *azservicebus.ReceivedMessage
	// Reason and Description are the DeadLetterReason and DeadLetterErrorDescription: the handler's
	// or the retry package's, or the broker's own (MaxDeliveryCountExceeded, TTLExpiredException).
	Reason      string
	Description string
}

// New returns a broker on clk (nil means [retry.SystemClock], which also works inside
// testing/synctest) configured by opts (nil means defaults). Invalid options are an error wrapping
// broker.ErrInvalidConfig that names the problem. A test with fixed options typically wraps New in a
// helper that fails the test on the error.
func New(clk retry.Clock, opts *BrokerOptions) (*Broker, error) {
	b := &Broker{
		clock:      clk,
		changed:    make(chan struct{}),
		faults:     make(map[Op]*fault),
		successors: make(map[chainStep][]successor),
	}
	if opts != nil {
		b.opts = *opts
	}
	if b.clock == nil {
		b.clock = retry.SystemClock()
	}
	l, err := b.opts.layout()
	if err == nil {
		b.model, err = broker.NewInProcess(broker.Options{Clock: b.clock, Topics: l.topics}, l.queues...)
	}
	if err != nil {
		return nil, fmt.Errorf("retrytest: %w", err)
	}
	b.name = l.name
	b.target, _ = b.model.Queue(l.name)
	b.scheduleTarget, b.consumed = b.target, b.target
	if len(l.topics) == 0 {
		b.sources = []*broker.Queue{b.target}
		return b, nil
	}
	for _, sc := range l.topics[0].Subscriptions {
		sub, _ := b.model.Subscription(l.name, sc.Name)
		b.sources = append(b.sources, sub)
	}
	b.consumed, _ = b.model.Subscription(l.name, l.consumed)
	if l.retryQueue != "" {
		b.retryQueue, _ = b.model.Queue(l.retryQueue)
		b.scheduleTarget = b.retryQueue
		b.sources = append(b.sources, b.retryQueue)
	}
	return b, nil
}

// chainStep names one attempt of a retry chain by the chain's first sequence number, as the retry
// envelope records it, so the broker can tell an original completed after its retry was scheduled from
// one whose handler succeeded. Sequence numbers are counted per entity, so a step is also told apart
// by the entity its chain started on (see [Broker.hasSuccessorLocked]).
type chainStep struct {
	firstSeq int64
	attempt  int
}

// stepOf returns the chain step of a message with application properties props and sequence number
// seq: a first delivery (or a copy without a chain) starts its chain at its own sequence number.
func stepOf(props map[string]any, seq int64) chainStep {
	st := chainStep{firstSeq: seq, attempt: 1}
	if v, ok := props[envelope.PropFirstSequenceNumber].(int64); ok && v >= 0 {
		st.firstSeq = v
	}
	if v, ok := props[envelope.PropAttempt].(int64); ok {
		st.attempt = int(v)
	}
	return st
}

// chainSource is the entity on which the chain of a message with application properties props
// started: the envelope's source for a copy, src for a first delivery, and "" (not known) for a copy
// that names none. Entity paths are compared ignoring case, as Service Bus names them.
func chainSource(props map[string]any, src *broker.Queue) string {
	if s, ok := props[envelope.PropSource].(string); ok {
		return s
	}
	if _, copied := props[envelope.PropAttempt]; copied {
		return ""
	}
	return src.Name()
}

// successor is a retry copy scheduled for a chain: the entity its chain started on, and, for a copy
// that holds its delivery for the outage breaker (envelope.PropHeld), its MessageID.
type successor struct {
	source string
	heldID string
}

// recordSuccessorLocked notes that a retry copy with application properties props and MessageID id was
// scheduled, for the completion of its original. b.mu must be held.
func (b *Broker) recordSuccessorLocked(props map[string]any, id string) {
	if _, ok := props[envelope.PropAttempt]; !ok {
		return
	}
	st := stepOf(props, -1)
	sc := successor{}
	if _, held := props[envelope.PropHeld]; held {
		st.attempt++ // a held copy repeats its attempt: it is the successor all the same
		sc.heldID = id
	}
	sc.source, _ = props[envelope.PropSource].(string)
	b.successors[st] = append(b.successors[st], sc)
}

// hasSuccessorLocked reports whether a retry copy was scheduled for the attempt after step of the chain
// that started on source: the original of a failed attempt is completed too, and must not count as a
// success. Sequence numbers are counted per entity, so on a topic the first delivery on one subscription
// and another on a second subscription can share one; a copy whose source names one of this broker's
// entities belongs only to chains of that entity. A copy that names none of them, or none at all (a
// processor with no EntityPath, or one that names the entity otherwise), is matched by the sequence
// number alone, as is a message whose own source is not known. A held copy (messageID names the
// completed delivery) repeats its attempt, so the held copies scheduled before it, its own included,
// are not its successors: only those after it are. b.mu must be held.
func (b *Broker) hasSuccessorLocked(step chainStep, source, messageID string) bool {
	list := b.successors[chainStep{firstSeq: step.firstSeq, attempt: step.attempt + 1}]
	for i := len(list) - 1; i >= 0; i-- {
		if list[i].heldID != "" && list[i].heldID == messageID {
			list = list[i+1:] // this delivery is that held copy: only later ones follow it
			break
		}
	}
	for _, sc := range list {
		if s := sc.source; s == "" || source == "" || strings.EqualFold(s, source) || !b.isSourceLocked(s) {
			return true
		}
	}
	return false
}

// isSourceLocked reports whether path names one of the entities receivers read.
func (b *Broker) isSourceLocked(path string) bool {
	return slices.ContainsFunc(b.sources, func(q *broker.Queue) bool { return strings.EqualFold(q.Name(), path) })
}

// Send enqueues msg now, as a producer would, and returns its sequence number. A message with
// ScheduledEnqueueTime in the future waits until then (and gets a new sequence number then). A
// duplicate (with duplicate detection on) is dropped and reported as a success with the original's
// number, as Service Bus does. A nil msg, a message larger than MaxMessageSize (wrapping
// azservicebus.ErrMessageTooLarge), application properties over the Service Bus limits, or values
// AMQP cannot encode are errors, and nothing is stored.
func (b *Broker) Send(msg *azservicebus.Message) (int64, error) {
	m, size, err := encode(msg)
	if err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	seq, dup, err := b.target.Send(m, size)
	if err != nil {
		return 0, sdkError(err)
	}
	if dup {
		b.duplicates++
	}
	b.notifyLocked()
	return seq, nil
}

// encode converts msg to the broker's form and measures it, as the SDK does before sending.
func encode(msg *azservicebus.Message) (*amqp.Message, int, error) {
	m, err := toAMQPMessage(msg)
	if err != nil {
		return nil, 0, err
	}
	size, err := encodedSize(m)
	if err != nil {
		return nil, 0, err
	}
	return m, size, nil
}

// receive blocks until at least one message is available in src, then locks up to max of them.
func (b *Broker) receive(ctx context.Context, conn *connection, src *broker.Queue, max int) ([]*azservicebus.ReceivedMessage, error) {
	// The same bounds as the SDK's ReceiveMessages, so a consumer that asks for too much fails here too.
	if max < 1 || max > maxReceive {
		return nil, fmt.Errorf("retrytest: maxMessages must be in [1, %d], got %d", maxReceive, max)
	}
	for {
		b.mu.Lock()
		if err := conn.checkLocked(); err != nil {
			b.mu.Unlock()
			return nil, err
		}
		if err := b.takeFaultLocked(OpReceive); err != nil {
			b.mu.Unlock()
			return nil, err
		}
		// Advance first: a topic's scheduled message reaches its subscriptions only through it.
		next := b.model.Advance()
		var out []*azservicebus.ReceivedMessage
		for len(out) < max {
			d, ok := src.TryReceive(broker.PeekLock, conn.id)
			if !ok {
				break
			}
			rm := receivedMessage(d.Message, headerDeliveryCount(d.Message)+1, d.LockToken)
			out = append(out, rm)
		}
		if len(out) > 0 {
			b.notifyLocked()
			b.mu.Unlock()
			return out, nil
		}
		// Nothing available: sleep until the broker changes (a send, a fault, a settle), the model's
		// next deadline (a scheduled message, a lock or a message expiring) comes on the clock, the
		// connection closes, or ctx ends. The timer is taken before the lock is released, so a mock
		// clock advanced right after cannot slip past it.
		timer, passed := b.timerLocked(next)
		changed := b.changed
		closed := conn.closed
		b.mu.Unlock()
		if passed {
			continue // the clock moved past the deadline meanwhile: look again at once
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
		case <-timer:
		case <-closed:
		}
	}
}

// timerLocked returns a channel that fires when the clock reaches next; nil (never) for a zero next.
// passed reports that the clock had reached next by the time the timer was taken: a test may advance a
// mock clock at any moment (without b.mu), between the model's reading of the clock and this one, and
// a timer taken after that would wait for the next advance. The caller then looks again at once.
func (b *Broker) timerLocked(next time.Time) (timer <-chan time.Time, passed bool) {
	if next.IsZero() {
		return nil, false
	}
	timer = b.clock.After(max(next.Sub(b.clock.Now()), 0))
	return timer, !b.clock.Now().Before(next)
}

// settleLocked runs the common checks of a settlement: a message, an open connection, no injected
// fault.
func (b *Broker) settleLocked(op Op, conn *connection, msg *azservicebus.ReceivedMessage) error {
	if msg == nil {
		return errNilMessage
	}
	if err := conn.checkLocked(); err != nil {
		return err
	}
	return b.takeFaultLocked(op)
}

// complete settles msg as done, like a CompleteMessage that reached the broker. A failure leaves the
// lock in place, as a real failed call does, so the test can see the message come back when it expires.
func (b *Broker) complete(conn *connection, src *broker.Queue, msg *azservicebus.ReceivedMessage) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.settleLocked(OpComplete, conn, msg); err != nil {
		return err
	}
	d, err := src.CompleteDelivery(msg.LockToken)
	if err != nil {
		return sdkError(err)
	}
	b.completed = append(b.completed, completion{msg: d.Message})
	if b.hasSuccessorLocked(stepOf(d.Message.ApplicationProperties, d.SequenceNumber), chainSource(d.Message.ApplicationProperties, src), msg.MessageID) {
		b.retried++
	} else {
		b.succeeded++
	}
	b.notifyLocked()
	return nil
}

// deadLetter moves msg to the dead-letter queue with the reason, description and properties of opts.
func (b *Broker) deadLetter(conn *connection, src *broker.Queue, msg *azservicebus.ReceivedMessage, opts *azservicebus.DeadLetterOptions) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.settleLocked(OpDeadLetter, conn, msg); err != nil {
		return err
	}
	var reason, description string
	var props map[string]any
	if opts != nil {
		if opts.Reason != nil {
			reason = *opts.Reason
		}
		if opts.ErrorDescription != nil {
			description = *opts.ErrorDescription
		}
		props = opts.PropertiesToModify
	}
	if err := src.DeadLetter(msg.LockToken, reason, description, props); err != nil {
		return sdkError(err)
	}
	b.notifyLocked()
	return nil
}

// renew extends the lock by a full lock duration from now and, like the SDK, writes the new expiry into
// msg.LockedUntil, which the processor reads to plan its next renewal.
func (b *Broker) renew(conn *connection, src *broker.Queue, msg *azservicebus.ReceivedMessage) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.settleLocked(OpRenew, conn, msg); err != nil {
		return err
	}
	until, err := src.RenewLock(msg.LockToken)
	if err != nil {
		return sdkError(err)
	}
	msg.LockedUntil = &until[0]
	b.notifyLocked()
	return nil
}

// schedule stores copies of msgs due at at in target and records each for [Broker.Scheduled], and the
// retry copies among them for the completion of their originals. Like the SDK, it converts and encodes
// every message before sending any, so a nil or unencodable message stores nothing; like the emulator,
// it then stores them in order and stops at the first the broker refuses (too large). A duplicate (with
// duplicate detection on) is recorded with Duplicate set and reported as a success, as Service Bus does,
// which is what makes the processor's deterministic MessageIDs safe.
func (b *Broker) schedule(ctx context.Context, conn *connection, target *broker.Queue, msgs []*azservicebus.Message, at time.Time) ([]int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	enc := make([]encodedMessage, len(msgs))
	for i, msg := range msgs {
		if msg == nil {
			return nil, errNilMessage
		}
		withTime := *msg
		withTime.ScheduledEnqueueTime = nil
		if !at.IsZero() {
			withTime.ScheduledEnqueueTime = &at
		}
		m, size, err := encode(&withTime)
		if err != nil {
			return nil, err
		}
		enc[i] = encodedMessage{m, size}
	}
	seqs, err := b.scheduleEncoded(conn, target, msgs, enc, at)
	if err != nil {
		return nil, err // what ScheduleMessages returns on a refusal, though earlier messages were stored
	}
	return seqs, nil
}

// encodedMessage is a message converted and measured for the broker model.
type encodedMessage struct {
	m    *amqp.Message
	size int
}

// scheduleEncoded stores the encoded msgs in target in order, stopping at the first the broker
// refuses, and returns the sequence numbers of those it stored, also with the refusal's error.
func (b *Broker) scheduleEncoded(conn *connection, target *broker.Queue, msgs []*azservicebus.Message, enc []encodedMessage, at time.Time) ([]int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := conn.checkLocked(); err != nil {
		return nil, err
	}
	if err := b.takeFaultLocked(OpSchedule); err != nil {
		return nil, err
	}
	defer b.notifyLocked()
	seqs := make([]int64, 0, len(msgs))
	for i, e := range enc {
		seq, dup, err := target.Send(e.m, e.size)
		if err != nil {
			return seqs, sdkError(err)
		}
		m := msgs[i]
		rec := ScheduledMessage{At: at, SequenceNumber: seq, Duplicate: dup, Message: cloneMessage(m), Attempt: attemptOf(m)}
		if m.MessageID != nil {
			rec.MessageID = *m.MessageID
		}
		b.scheduled = append(b.scheduled, rec)
		if dup {
			b.duplicates++
		}
		b.recordSuccessorLocked(m.ApplicationProperties, rec.MessageID)
		seqs = append(seqs, seq)
	}
	return seqs, nil
}

// notifyLocked wakes everyone waiting on the current change channel (blocked receivers, WaitUntil)
// by closing it and installing a fresh one. b.mu must be held.
func (b *Broker) notifyLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// sdkError turns a broker model error into the error the SDK returns for the same answer from Service
// Bus, keeping the model's error in the chain for errors.Is: a lost lock is an *azservicebus.Error with
// CodeLockLost, which the processor classifies by its Code as it does with the real SDK; a message over
// the size limit wraps azservicebus.ErrMessageTooLarge.
func sdkError(err error) error {
	switch {
	case errors.Is(err, broker.ErrLockLost):
		return &azservicebus.Error{Code: azservicebus.CodeLockLost}
	case errors.Is(err, broker.ErrClosed):
		return &azservicebus.Error{Code: azservicebus.CodeClosed}
	case errors.Is(err, broker.ErrMessageTooLarge):
		return fmt.Errorf("retrytest: %w: %w", azservicebus.ErrMessageTooLarge, err)
	}
	return fmt.Errorf("retrytest: %w", err)
}

// attemptOf reads the retry attempt a scheduled copy carries, for [ScheduledMessage.Attempt].
func attemptOf(m *azservicebus.Message) int {
	if v, ok := m.ApplicationProperties[envelope.PropAttempt].(int64); ok {
		return int(v)
	}
	return 0
}
