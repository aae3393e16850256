package retrytest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry"
)

// maxReceive is the SDK's limit on maxMessages per ReceiveMessages call.
const maxReceive = 5000

// Default settings of a [Broker].
const (
	DefaultLockDuration     = time.Minute
	DefaultMaxDeliveryCount = 10
)

// BrokerOptions configures a [Broker]. The zero value of each field means its default.
type BrokerOptions struct {
	// LockDuration is how long a peek-lock lasts. Zero means [DefaultLockDuration].
	LockDuration time.Duration
	// MaxDeliveryCount dead-letters a message (reason MaxDeliveryCountExceeded) once a lock on it has
	// expired this many times. Zero means [DefaultMaxDeliveryCount].
	MaxDeliveryCount int
	// DuplicateDetection drops a sent or scheduled message whose MessageID was seen before, like a queue
	// with duplicate detection on (with an unbounded window). The send still reports success.
	DuplicateDetection bool
}

// Broker is an in-memory queue. The zero value is not usable; call [NewBroker]. It is safe for
// concurrent use.
type Broker struct {
	clock retry.Clock
	opts  BrokerOptions

	mu        sync.Mutex
	changed   chan struct{} // closed and replaced on every state change
	nextSeq   int64
	nextToken uint64
	active    []*entry
	pending   []*entry // scheduled, not yet due
	locked    map[[16]byte]*entry
	seenIDs   map[string]bool

	scheduled    []ScheduledMessage
	successors   map[chainStep]bool // retry copies scheduled, by chain and attempt
	succeeded    int
	retried      int
	completed    []*azservicebus.ReceivedMessage
	deadLettered []DeadLetteredMessage
	duplicates   int
	connects     int
	faults       map[Op]*fault
}

// entry is a stored message and its broker-side state.
type entry struct {
	msg           *azservicebus.Message
	seq           int64
	enqueued      time.Time
	at            time.Time // scheduled enqueue time; zero if sent directly
	deliveryCount uint32
	token         [16]byte
	lockedUntil   time.Time
}

// ScheduledMessage records one message scheduled through the Sender.
type ScheduledMessage struct {
	// At is the scheduled enqueue time.
	At time.Time
	// MessageID is the message's MessageID.
	MessageID string
	// Attempt is the retry attempt the copy carries (its retry.PropAttempt), or 0 if it has none.
	Attempt int
	// SequenceNumber is the number returned by ScheduleMessages.
	SequenceNumber int64
	// Duplicate is true when duplicate detection dropped it.
	Duplicate bool
	// Message is a copy of what was scheduled.
	Message *azservicebus.Message
}

// DeadLetteredMessage records one dead-lettered message.
type DeadLetteredMessage struct {
	Message     *azservicebus.ReceivedMessage
	Reason      string
	Description string
}

// NewBroker returns an empty broker on clk (nil means the real clock, which also works inside
// testing/synctest). nil opts means defaults.
func NewBroker(clk retry.Clock, opts *BrokerOptions) *Broker {
	if clk == nil {
		clk = realClock{}
	}
	var o BrokerOptions
	if opts != nil {
		o = *opts
	}
	if o.LockDuration <= 0 {
		o.LockDuration = DefaultLockDuration
	}
	if o.MaxDeliveryCount <= 0 {
		o.MaxDeliveryCount = DefaultMaxDeliveryCount
	}
	return &Broker{
		clock:      clk,
		opts:       o,
		changed:    make(chan struct{}),
		locked:     make(map[[16]byte]*entry),
		seenIDs:    make(map[string]bool),
		faults:     make(map[Op]*fault),
		successors: make(map[chainStep]bool),
	}
}

// chainStep names one attempt of a retry chain by the chain's first sequence number, as the retry
// envelope records it, so the broker can tell an original completed after its retry was scheduled from
// one whose handler succeeded.
type chainStep struct {
	firstSeq int64
	attempt  int
}

// stepOf returns the chain step of a message with application properties props and sequence number
// seq: a first delivery (or a copy without a chain) starts its chain at its own sequence number.
func stepOf(props map[string]any, seq int64) chainStep {
	st := chainStep{firstSeq: seq, attempt: 1}
	if v, ok := props[retry.PropFirstSequenceNumber].(int64); ok && v >= 0 {
		st.firstSeq = v
	}
	if v, ok := props[retry.PropAttempt].(int64); ok {
		st.attempt = int(v)
	}
	return st
}

// realClock reads the time package directly, so that a broker created inside a testing/synctest
// bubble runs on the bubble's fake time.
type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Send enqueues msg now, as a producer would. A message with ScheduledEnqueueTime in the future waits
// until then. It returns the sequence number.
func (b *Broker) Send(msg *azservicebus.Message) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var at time.Time
	if msg.ScheduledEnqueueTime != nil {
		at = *msg.ScheduledEnqueueTime
	}
	seq, _ := b.enqueueLocked(msg, at)
	return seq
}

// enqueueLocked stores a copy of msg, due at at (zero = now).
func (b *Broker) enqueueLocked(msg *azservicebus.Message, at time.Time) (int64, bool) {
	if b.opts.DuplicateDetection && msg.MessageID != nil {
		if b.seenIDs[*msg.MessageID] {
			b.duplicates++
			b.notifyLocked()
			return 0, true
		}
		b.seenIDs[*msg.MessageID] = true
	}
	b.nextSeq++
	e := &entry{msg: cloneMessage(msg), seq: b.nextSeq, at: at}
	now := b.clock.Now()
	if !at.IsZero() && at.After(now) {
		b.pending = append(b.pending, e)
	} else {
		e.enqueued = now
		b.active = append(b.active, e)
	}
	b.notifyLocked()
	return e.seq, false
}

// tickLocked activates due scheduled messages and returns expired locks to the queue.
func (b *Broker) tickLocked() {
	now := b.clock.Now()
	kept := b.pending[:0]
	for _, e := range b.pending {
		if !e.at.After(now) {
			e.enqueued = e.at
			b.active = append(b.active, e)
			b.notifyLocked()
		} else {
			kept = append(kept, e)
		}
	}
	b.pending = kept
	for token, e := range b.locked {
		if now.Before(e.lockedUntil) {
			continue
		}
		delete(b.locked, token)
		// Like Service Bus, a message whose lock expired MaxDeliveryCount times goes to the dead-letter
		// queue with the broker's own reason, which the retry package never uses.
		if int(e.deliveryCount) >= b.opts.MaxDeliveryCount {
			b.deadLettered = append(b.deadLettered, DeadLetteredMessage{
				Message: b.receivedLocked(e, false), Reason: "MaxDeliveryCountExceeded",
				Description: "Message could not be consumed after the maximum delivery attempts.",
			})
		} else {
			b.active = append(b.active, e)
		}
		b.notifyLocked()
	}
	sortBySeq(b.active)
}

// nextEventLocked returns the earliest time at which tickLocked would change something.
func (b *Broker) nextEventLocked() (time.Time, bool) {
	var next time.Time
	for _, e := range b.pending {
		if next.IsZero() || e.at.Before(next) {
			next = e.at
		}
	}
	for _, e := range b.locked {
		if next.IsZero() || e.lockedUntil.Before(next) {
			next = e.lockedUntil
		}
	}
	return next, !next.IsZero()
}

// receive blocks until at least one message is available, then locks up to max of them.
func (b *Broker) receive(ctx context.Context, conn *connection, max int) ([]*azservicebus.ReceivedMessage, error) {
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
		b.tickLocked()
		if len(b.active) > 0 {
			n := min(max, len(b.active))
			out := make([]*azservicebus.ReceivedMessage, 0, n)
			now := b.clock.Now()
			for _, e := range b.active[:n] {
				e.deliveryCount++
				b.nextToken++
				e.token = tokenFor(b.nextToken)
				e.lockedUntil = now.Add(b.opts.LockDuration)
				b.locked[e.token] = e
				out = append(out, b.receivedLocked(e, true))
			}
			b.active = append(b.active[:0], b.active[n:]...)
			b.notifyLocked()
			b.mu.Unlock()
			return out, nil
		}
		// Nothing available: sleep until the broker changes (a send, a fault, a settle), the next
		// scheduled message or lock expiry is due on the clock, the connection closes, or ctx ends. The
		// timer is taken before the lock is released, so a mock clock advanced right after cannot
		// slip past it.
		var timer <-chan time.Time
		if next, ok := b.nextEventLocked(); ok {
			timer = b.clock.After(max1ns(next.Sub(b.clock.Now())))
		}
		changed := b.changed
		closed := conn.closed
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
		case <-timer:
		case <-closed:
		}
	}
}

// max1ns keeps a timer positive: a due event whose wait rounds to zero must still wake the receiver
// (benbjohnson's mock never fires a timer that is registered at or before its current time until the
// next Add).
func max1ns(d time.Duration) time.Duration {
	if d <= 0 {
		return time.Nanosecond
	}
	return d
}

// settle finds the locked entry of msg, or reports a lost lock.
func (b *Broker) settleLocked(op Op, conn *connection, msg *azservicebus.ReceivedMessage) (*entry, error) {
	if msg == nil {
		return nil, errors.New("retrytest: nil message")
	}
	if err := conn.checkLocked(); err != nil {
		return nil, err
	}
	if err := b.takeFaultLocked(op); err != nil {
		return nil, err
	}
	b.tickLocked()
	e, ok := b.locked[msg.LockToken]
	if !ok {
		return nil, lockLostError()
	}
	return e, nil
}

// complete settles msg as done, like a CompleteMessage that reached the broker. A failure leaves the
// lock in place, as a real failed call does, so the test can see the message come back when it expires.
func (b *Broker) complete(conn *connection, msg *azservicebus.ReceivedMessage) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, err := b.settleLocked(OpComplete, conn, msg)
	if err != nil {
		return err
	}
	delete(b.locked, e.token)
	b.completed = append(b.completed, b.receivedLocked(e, false))
	st := stepOf(e.msg.ApplicationProperties, e.seq)
	if b.successors[chainStep{firstSeq: st.firstSeq, attempt: st.attempt + 1}] {
		b.retried++
	} else {
		b.succeeded++
	}
	b.notifyLocked()
	return nil
}

// deadLetter moves msg to the dead-letter list with the reason and description from opts.
func (b *Broker) deadLetter(conn *connection, msg *azservicebus.ReceivedMessage, opts *azservicebus.DeadLetterOptions) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, err := b.settleLocked(OpDeadLetter, conn, msg)
	if err != nil {
		return err
	}
	delete(b.locked, e.token)
	if opts != nil && len(opts.PropertiesToModify) > 0 {
		// Service Bus applies the properties a dead-letter call asks for to the dead-lettered message.
		if e.msg.ApplicationProperties == nil {
			e.msg.ApplicationProperties = make(map[string]any, len(opts.PropertiesToModify))
		}
		for k, v := range opts.PropertiesToModify {
			e.msg.ApplicationProperties[k] = v
		}
	}
	d := DeadLetteredMessage{Message: b.receivedLocked(e, false)}
	if opts != nil && opts.Reason != nil {
		d.Reason = *opts.Reason
	}
	if opts != nil && opts.ErrorDescription != nil {
		d.Description = *opts.ErrorDescription
	}
	b.deadLettered = append(b.deadLettered, d)
	b.notifyLocked()
	return nil
}

// renew extends the lock by a full lock duration from now and, like the SDK, writes the new expiry into
// msg.LockedUntil, which the processor reads to plan its next renewal.
func (b *Broker) renew(conn *connection, msg *azservicebus.ReceivedMessage) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, err := b.settleLocked(OpRenew, conn, msg)
	if err != nil {
		return err
	}
	e.lockedUntil = b.clock.Now().Add(b.opts.LockDuration)
	until := e.lockedUntil
	msg.LockedUntil = &until
	b.notifyLocked()
	return nil
}

// schedule stores copies of msgs due at at and records each call for [Broker.Scheduled]. A duplicate
// (with DuplicateDetection on) is recorded with Duplicate set and reported as a success, as Service
// Bus does, which is what makes the processor's deterministic MessageIDs safe.
func (b *Broker) schedule(ctx context.Context, conn *connection, msgs []*azservicebus.Message, at time.Time) ([]int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := conn.checkLocked(); err != nil {
		return nil, err
	}
	if err := b.takeFaultLocked(OpSchedule); err != nil {
		return nil, err
	}
	seqs := make([]int64, 0, len(msgs))
	for _, m := range msgs {
		if m == nil {
			return nil, errors.New("retrytest: nil message")
		}
		seq, dup := b.enqueueLocked(m, at)
		rec := ScheduledMessage{At: at, SequenceNumber: seq, Duplicate: dup, Message: cloneMessage(m), Attempt: attemptOf(m)}
		if m.MessageID != nil {
			rec.MessageID = *m.MessageID
		}
		b.scheduled = append(b.scheduled, rec)
		if _, ok := m.ApplicationProperties[retry.PropAttempt]; ok {
			b.successors[stepOf(m.ApplicationProperties, -1)] = true
		}
		seqs = append(seqs, seq)
	}
	b.notifyLocked()
	return seqs, nil
}

// receivedLocked converts e into what a receiver sees.
func (b *Broker) receivedLocked(e *entry, withLock bool) *azservicebus.ReceivedMessage {
	m := cloneMessage(e.msg)
	seq := e.seq
	enq := e.enqueued
	rm := &azservicebus.ReceivedMessage{
		ApplicationProperties: m.ApplicationProperties,
		Body:                  m.Body,
		ContentType:           m.ContentType,
		CorrelationID:         m.CorrelationID,
		DeliveryCount:         e.deliveryCount,
		EnqueuedTime:          &enq,
		PartitionKey:          m.PartitionKey,
		ReplyTo:               m.ReplyTo,
		ReplyToSessionID:      m.ReplyToSessionID,
		SequenceNumber:        &seq,
		SessionID:             m.SessionID,
		Subject:               m.Subject,
		TimeToLive:            m.TimeToLive,
		To:                    m.To,
	}
	if m.MessageID != nil {
		rm.MessageID = *m.MessageID
	}
	if !e.at.IsZero() {
		at := e.at
		rm.ScheduledEnqueueTime = &at
	}
	if withLock {
		rm.LockToken = e.token
		until := e.lockedUntil
		rm.LockedUntil = &until
	}
	return rm
}

// notifyLocked wakes everyone waiting on the current change channel (blocked receivers, WaitUntil)
// by closing it and installing a fresh one. b.mu must be held.
func (b *Broker) notifyLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// WaitUntil blocks until cond returns true (checked after every change of the broker) or ctx ends.
// cond runs without the broker's lock held and may call its inspection methods.
func (b *Broker) WaitUntil(ctx context.Context, cond func() bool) error {
	for {
		b.mu.Lock()
		changed := b.changed
		b.mu.Unlock()
		if cond() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("retrytest: condition not met: %w", ctx.Err())
		case <-changed:
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
// copy was scheduled; Stats.Succeeded counts only the successes.
func (b *Broker) Completed() []*azservicebus.ReceivedMessage {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*azservicebus.ReceivedMessage(nil), b.completed...)
}

// DeadLettered returns every dead-lettered message with its reason, in order.
func (b *Broker) DeadLettered() []DeadLetteredMessage {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]DeadLetteredMessage(nil), b.deadLettered...)
}

// Stats counts the messages in each state. The counters are named for what a handler author waits for:
// a failed attempt completes its original too (after scheduling the copy), so "completed" alone would
// count failures; Succeeded does not.
type Stats struct {
	// Active are receivable now, Pending scheduled for later, Locked received and not yet settled.
	Active, Pending, Locked int
	// Succeeded counts completions with no retry copy scheduled for them: the handler succeeded.
	Succeeded int
	// Retried counts originals completed after their retry copy was scheduled: the attempt failed.
	Retried int
	// DeadLettered counts messages in the dead-letter list, with our reasons or the broker's.
	DeadLettered int
	// Scheduled counts ScheduleMessages copies, including those duplicate detection dropped (Duplicates).
	Scheduled, Duplicates int
	// Connects counts the connections the Connector built.
	Connects int
}

// Stats returns the current counts, after activating due scheduled messages and expiring locks.
func (b *Broker) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tickLocked()
	return Stats{
		Active: len(b.active), Pending: len(b.pending), Locked: len(b.locked),
		Succeeded: b.succeeded, Retried: b.retried, DeadLettered: len(b.deadLettered), Scheduled: len(b.scheduled),
		Duplicates: b.duplicates, Connects: b.connects,
	}
}

// AdvanceToNextScheduled moves clk (a mock clock such as benbjohnson/clock's *Mock) to the due time of
// the earliest scheduled message, so that it becomes receivable, and returns that time. It reports false,
// leaving the clock alone, when nothing is scheduled.
func (b *Broker) AdvanceToNextScheduled(clk interface {
	Now() time.Time
	Add(time.Duration)
}) (time.Time, bool) {
	b.mu.Lock()
	var next time.Time
	for _, e := range b.pending {
		if next.IsZero() || e.at.Before(next) {
			next = e.at
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
	b.tickLocked()
	b.mu.Unlock()
	return next, true
}

// ExpireLocks makes every current lock expire now, as if the lock duration had passed: settling those
// messages then fails with azservicebus.CodeLockLost and they become receivable again.
func (b *Broker) ExpireLocks() {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock.Now()
	for _, e := range b.locked {
		e.lockedUntil = now
	}
	b.tickLocked()
	b.notifyLocked()
}

// tokenFor derives a unique, never-zero lock token from a counter, so that tokens are deterministic
// across test runs.
func tokenFor(n uint64) [16]byte {
	var t [16]byte
	for i := 0; i < 8; i++ {
		t[15-i] = byte(n >> (8 * i))
	}
	t[0] = 0x5b // never the zero token
	return t
}

// lockLostError is the SDK error a settle on an expired or unknown lock returns; the processor
// classifies it by its Code, as it does with the real SDK.
func lockLostError() error {
	return &azservicebus.Error{Code: azservicebus.CodeLockLost}
}

// attemptOf reads the retry attempt a scheduled copy carries, for [ScheduledMessage.Attempt].
func attemptOf(m *azservicebus.Message) int {
	if v, ok := m.ApplicationProperties[retry.PropAttempt].(int64); ok {
		return int(v)
	}
	return 0
}
