package broker

import (
	"container/heap"
	"fmt"
	"time"

	"github.com/Azure/go-amqp"
)

// Queue is one Service Bus queue or dead-letter sub-queue. Obtain it from
// [Broker.Queue]; it is safe for concurrent use and shares its broker's lock.
//
// Messages are delivered in sequence-number order. Sequence numbers start at
// 1 and increase per queue (a dead-letter queue numbers its own messages and
// keeps the original number in the x-opt-enqueue-sequence-number annotation).
type Queue struct {
	b      *Broker
	name   string
	cfg    QueueConfig
	dlq    *Queue // the dead-letter sub-queue; nil on a dead-letter queue
	parent *Queue // the main queue; nil on a main queue
	topic  *Queue // a subscription's topic; nil otherwise

	// Set in New and read-only afterwards: what the entity is and the
	// auto-forwarding targets (nil: none). A topic's subscriptions, a
	// subscription's rules and cfg change only under b.mu (manage.go).
	kind                 entityKind
	subs                 []*Queue
	rules                []rule
	forwardTo            *Queue
	forwardDeadLettersTo *Queue

	// State below is guarded by b.mu. An entry is in exactly one of
	// available (stateAvailable), locks (stateLocked) or neither
	// (stateScheduled), and in timeline whenever it has a deadline.
	lastSeq   int64
	order     entryOrder          // every stored message by current sequence number, in order (order.go)
	locks     map[[16]byte]*entry // peek-locked messages by lock token
	available availableHeap
	timeline  timelineHeap
	dedup     duplicateDetector
	// deferredCount counts entries in stateDeferred (defer.go).
	deferredCount int
	// sessions holds, on a session-aware entity, each session's receivable
	// messages (instead of available), lock and state (session.go).
	sessions map[string]*sessionState
	// ready holds the sessions AcceptNextSession may take
	// (readysessions.go).
	ready readySessions
	// sessionDeadline is no later than the earliest session lock expiry
	// (zero: none), so receivers parked in a session wake when it passes.
	sessionDeadline time.Time

	// waiters counts blocked receivers; notify is closed (and replaced) when a
	// message becomes available while any are waiting.
	waiters int
	notify  chan struct{}

	// removed is set when the entity is deleted (manage.go): sends and
	// receives through a *Queue obtained earlier then fail.
	removed bool
	// accessedAt is when a client last sent to the entity or received from
	// it or its dead-letter queue (Runtime.AccessedAt); zero means never.
	accessedAt time.Time
}

func newQueue(b *Broker, name string, cfg QueueConfig) *Queue {
	return &Queue{
		b:      b,
		name:   name,
		cfg:    cfg,
		locks:  make(map[[16]byte]*entry),
		dedup:  newDuplicateDetector(cfg.DuplicateDetectionWindow),
		notify: make(chan struct{}),
	}
}

// Name returns the queue's entity path as configured; for a dead-letter queue
// it is "<queue>/$DeadLetterQueue".
func (q *Queue) Name() string { return q.name }

// Send stores m (a copy of it) and returns its sequence number. size is the
// encoded size the server received; larger than MaxMessageSize gives
// [ErrMessageTooLarge].
//
// With duplicate detection on, a MessageId (of any type) already accepted
// within the window yields (original sequence number, true, nil) and nothing
// is stored, which is what Service Bus does: the sender sees success.
//
// A message annotated with x-opt-scheduled-enqueue-time (a time.Time) in the
// future is scheduled: invisible to receivers until then, when it gets a new
// sequence number. Its time-to-live (header TTL, else the queue's DefaultTTL)
// counts from the enqueue time, scheduled or not.
func (q *Queue) Send(m *amqp.Message, size int) (seq int64, duplicate bool, err error) {
	var at time.Time
	if t, ok := scheduledEnqueueTime(m); ok {
		at = t
	}
	return q.accept(m, size, at, false, false)
}

// SendOwned is [Queue.Send] for a message the caller hands over: the
// broker stores m itself instead of a copy, so the caller must neither
// change nor read m afterwards, whatever the outcome. The AMQP server
// decodes a new message for every transfer and drops it after the send,
// so a copy would only cost time and memory: about 220 bytes more per
// stored 1 KiB message, the copy's twin left as garbage in the same size
// classes (BenchmarkScaleBytesPerMessage, memory against owned).
func (q *Queue) SendOwned(m *amqp.Message, size int) (seq int64, duplicate bool, err error) {
	var at time.Time
	if t, ok := scheduledEnqueueTime(m); ok {
		at = t
	}
	return q.accept(m, size, at, false, true)
}

// accept is the common path of [Queue.Send] and [Queue.Schedule]. A zero at
// means "now"; stamp records at in the message's annotations; owned says
// the caller handed m over (SendOwned), so it is stored as it is.
func (q *Queue) accept(m *amqp.Message, size int, at time.Time, stamp, owned bool) (int64, bool, error) {
	if m == nil {
		return 0, false, fmt.Errorf("broker: nil message")
	}
	b := q.b
	b.mu.Lock()
	defer b.unlock()
	if b.closed {
		return 0, false, ErrClosed
	}
	if q.removed {
		return 0, false, q.removedError()
	}
	if q.parent != nil || q.kind == kindSubscription {
		return 0, false, fmt.Errorf("%w: send to %s", ErrNotSupported, q.name)
	}
	if err := q.sendAllowed(); err != nil {
		return 0, false, err
	}
	if size > q.cfg.MaxMessageSize {
		return 0, false, fmt.Errorf("%w: %d bytes exceeds %d", ErrMessageTooLarge, size, q.cfg.MaxMessageSize)
	}
	if err := checkProperties(m.ApplicationProperties); err != nil {
		return 0, false, err
	}
	if err := q.checkSessionOnSend(groupID(m)); err != nil {
		return 0, false, err
	}
	now := b.clock.Now()
	q.advance(now)
	defer q.armTimer(now)
	q.accessedAt = now

	id := messageID(m)
	if seq, dup := q.dedup.lookup(id, now); dup {
		return seq, true, nil
	}
	stored := m
	if !owned {
		stored = CopyMessage(m)
	}
	if stamp {
		setAnnotation(stored, AnnotationScheduledEnqueueTime, at)
	}
	assignMessageID(stored)
	e, err := encodeEntry(stored, size)
	if err != nil {
		return 0, false, err
	}
	e.seq = q.nextSeq()
	e.enqueuedAt = now
	q.storeEntry(e)
	q.journalEntry(e.seq, e)
	q.rememberID(id, e.seq, now)
	if at.After(now) {
		e.state = stateScheduled
		q.timeline.setDeadline(e, at) // the deadline is its scheduledAt
	} else {
		q.activate(e, now, now)
	}
	return e.seq, false, nil
}

// nextSeq hands out the next sequence number; b.mu must be held.
func (q *Queue) nextSeq() int64 {
	q.journalSeq()
	q.lastSeq++
	return q.lastSeq
}

// activate makes a freshly accepted or newly due message receivable, starting
// its time-to-live at enqueuedAt. Dead-letter queues do not observe TTL. On
// a topic the message is fanned out to the subscriptions instead, and on an
// entity with ForwardTo it moves on to the target.
func (q *Queue) activate(e *entry, enqueuedAt, now time.Time) {
	e.enqueuedAt = enqueuedAt
	e.expiresAt = time.Time{}
	if q.parent == nil {
		ttl := storedTTL(e.data)
		// A message's own TTL cannot exceed the entity's default; Service Bus
		// silently shortens it (ServiceBusMessage.TimeToLive in the .NET SDK
		// reference: "cannot be longer than the entity's DefaultTimeToLive
		// setting and it is silently adjusted if it does"), and receivers see
		// the shortened value.
		if def := q.cfg.DefaultTTL; def > 0 && (ttl <= 0 || ttl > def) {
			if ttl > def {
				// Only a duration changes, which always encodes.
				_ = e.rewrite(func(m *amqp.Message) { m.Header.TTL = def })
			}
			ttl = def
		}
		if ttl > 0 {
			e.expiresAt = enqueuedAt.Add(ttl)
		}
		if c := e.expiryCap; !c.IsZero() && (e.expiresAt.IsZero() || c.Before(e.expiresAt)) {
			e.expiresAt = c
		}
	}
	switch {
	case q.expired(e, now):
		q.expire(e, now)
	case q.kind == kindTopic && q.parent == nil:
		q.fanOut(e, now)
	case q.forwardTo != nil:
		q.forward(e, now)
	default:
		q.makeAvailable(e)
	}
}

// expired reports whether e's time-to-live has passed; the expiry
// instant itself counts as expired.
func (q *Queue) expired(e *entry, now time.Time) bool {
	return !e.expiresAt.IsZero() && !now.Before(e.expiresAt)
}

// makeAvailable puts e among the receivable messages and wakes receivers.
func (q *Queue) makeAvailable(e *entry) {
	q.journalEntry(e.seq, e)
	e.state = stateAvailable
	e.lock = nil
	q.pushAvailable(e)
	q.timeline.setDeadline(e, e.expiresAt)
	q.wakeWaiters()
}

// removeEntry forgets e entirely (settled, expired, cancelled or moved).
func (q *Queue) removeEntry(e *entry) {
	q.journalEntry(e.seq, e)
	q.forgetEntry(e)
	if e.availIndex >= 0 {
		q.popAvailable(e)
		if q.sessionful() {
			q.pruneSession(q.session(e.session), q.b.clock.Now())
		}
	}
	q.timeline.setDeadline(e, time.Time{})
	switch e.state {
	case stateLocked:
		q.dropLock(e)
	case stateDeferred:
		q.deferredCount--
	}
	e.state = 0
}

// returnLocked ends e's lock without settlement. counted says whether the
// delivery counts (abandon, lock expiry, dropped connection) or not (AMQP
// released: the client never processed it). A message that used up
// MaxDeliveryCount deliveries is dead-lettered; an expired one expires.
func (q *Queue) returnLocked(e *entry, counted bool, now time.Time) {
	q.journalEntry(e.seq, e)
	q.dropLock(e)
	q.timeline.setDeadline(e, time.Time{})
	// Receive counted the delivery up front; a release undoes that.
	if !counted && q.countsDeliveries() && e.deliveryCount > 0 {
		e.deliveryCount--
	}
	switch {
	case counted && q.parent == nil && int(e.deliveryCount) >= q.cfg.MaxDeliveryCount:
		q.deadLetter(e, ReasonMaxDeliveryCountExceeded,
			fmt.Sprintf("Message could not be consumed after %d delivery attempts.", q.cfg.MaxDeliveryCount), nil, now)
	case e.deferred:
		// Back among the deferred messages; expiry waits for the next
		// receive by sequence number (defer.go).
		q.setDeferred(e)
	case q.expired(e, now):
		q.expire(e, now)
	default:
		q.makeAvailable(e)
	}
}

// expire handles a message whose time-to-live has passed: dropped, or moved
// to the dead-letter queue when DeadLetterOnExpiration is set.
func (q *Queue) expire(e *entry, now time.Time) {
	if q.cfg.DeadLetterOnExpiration && q.dlq != nil {
		q.deadLetter(e, ReasonTTLExpired, "The message expired and was dead lettered.", nil, now)
		return
	}
	q.removeEntry(e)
}

// countsDeliveries reports whether deliveries from q count towards the
// message's DeliveryCount: everywhere but in a dead-letter queue (see take).
func (q *Queue) countsDeliveries() bool { return q.parent == nil }

// deadLetter moves e to the dead-letter queue. props are merged into the
// application properties first, then non-empty reason and description are
// set, so they always win. The dead-letter copy gets a new sequence number
// in the dead-letter queue, keeps its delivery count, and records its source
// and original sequence number in annotations.
//
// The delivery count kept is that of the failed deliveries, which is what
// Service Bus's header delivery-count holds ("incremented when a message
// lock expires, or the message is explicitly abandoned", the
// ServiceBusReceivedMessage.DeliveryCount docs). A receiver's own
// dead-letter settles the current delivery rather than failing it, so
// [Queue.DeadLetter] takes back the count receive added up front: a
// message abandoned once and then dead-lettered reads DeliveryCount 2 from
// the dead-letter queue, as on Service Bus (the Go SDK's live test
// TestMessageSettlementUsingReceiver), not 3.
func (q *Queue) deadLetter(e *entry, reason, description string, props map[string]any, now time.Time) {
	q.removeEntry(e)
	m := e.message()
	if m.ApplicationProperties == nil {
		m.ApplicationProperties = make(map[string]any)
	}
	for k, v := range props {
		m.ApplicationProperties[k] = copyValue(v)
	}
	if reason != "" {
		m.ApplicationProperties[PropertyDeadLetterReason] = reason
	}
	if description != "" {
		m.ApplicationProperties[PropertyDeadLetterErrorDescription] = description
	}
	setAnnotation(m, AnnotationDeadLetterSource, q.name)
	setAnnotation(m, AnnotationEnqueuedSequenceNumber, e.seq)

	if t := q.forwardDeadLettersTo; t != nil {
		t.enqueueLocked(m, e.size, now, time.Time{}, now)
		return
	}
	d := q.dlq
	de := mustEncodeEntry(m, e.size)
	de.seq = d.nextSeq()
	de.deliveryCount = e.deliveryCount
	d.storeEntry(de)
	d.journalEntry(de.seq, de)
	d.activate(de, now, now)
}

// lockedEntries returns the locked entries in sequence order.
func (q *Queue) lockedEntries() []*entry {
	es := make([]*entry, 0, len(q.locks))
	for _, e := range q.locks {
		es = append(es, e)
	}
	sortBySeq(es)
	return es
}

// advance applies every transition due at or before now: scheduled messages
// activate (in schedule order, getting new sequence numbers), expired
// messages expire, expired locks return their message. It also forgets
// duplicate-detection records older than the window. A queue and its
// dead-letter queue always advance together, because expiry and delivery
// limits in one feed the other. b.mu must be held.
func (q *Queue) advance(now time.Time) {
	if q.parent != nil {
		q.parent.advance(now)
		return
	}
	q.advanceOwn(now)
	q.dlq.advanceOwn(now)
}

// advanceOwn is [Queue.advance] for q alone.
func (q *Queue) advanceOwn(now time.Time) {
	q.dedup.prune(now)
	if !q.sessionDeadline.IsZero() && !now.Before(q.sessionDeadline) {
		q.sessionLocksDue(now)
	}
	for len(q.timeline) > 0 && !now.Before(q.timeline[0].deadline) {
		e := heap.Pop(&q.timeline).(*entry)
		switch e.state {
		case stateScheduled:
			q.journalEntry(e.seq, e)
			q.forgetEntry(e)
			e.seq = q.nextSeq()
			q.storeEntry(e)
			q.journalEntry(e.seq, e)
			q.activate(e, e.scheduledAt(), now)
		case stateAvailable:
			q.expire(e, now)
		case stateLocked:
			q.returnLocked(e, true, now)
		}
	}
}

// armTimer makes sure the broker wakes up by the earliest pending deadline
// of q and of its dead-letter queue, so blocked receivers wake even when no
// call arrives. b.mu must be held.
func (q *Queue) armTimer(now time.Time) {
	if q.parent != nil {
		q.parent.armTimer(now)
		return
	}
	q.b.armAt(q.timeline.earliest(), now)
	q.b.armAt(q.dlq.timeline.earliest(), now)
	q.b.armAt(q.sessionDeadline, now)
}
