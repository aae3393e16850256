package retryindex

import (
	"context"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
)

// DefaultPeekBatchSize is how many messages one peek of a [Tailer] asks for.
const DefaultPeekBatchSize = 250

// deadLetterSuffix ends the path of a dead-letter queue.
const deadLetterSuffix = "/$DeadLetterQueue"

// TailerOptions configures [NewTailer]. A nil *TailerOptions means every default.
type TailerOptions struct {
	// RetryQueue is the queue the consumer schedules its retry copies on, when that is not the entity
	// itself; required for a subscription (a subscription cannot be sent to), as in inspect.Options.
	RetryQueue string
	// PeekBatchSize is how many messages one peek asks for. Zero means [DefaultPeekBatchSize];
	// negative is invalid.
	PeekBatchSize int
	// Process names this process in the records. Empty means "tailer".
	Process string
	// Now is the clock that stamps records the broker gives no time for. Nil means time.Now.
	Now func() time.Time
	// OnPoll, when set, is told what each successful poll of [Tailer.Run] read, on Run's goroutine
	// (sbretry index tail reports progress with it).
	OnPoll func(TailResult)
}

// peeker lists the methods of *azservicebus.Receiver a tailer calls: it only ever peeks.
type peeker interface {
	PeekMessages(ctx context.Context, maxMessageCount int, options *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	Close(ctx context.Context) error
}

var _ peeker = (*azservicebus.Receiver)(nil)

// Tailer is the broker's feed of the index: it peeks the entities that hold an event's copies and dead
// letters, in sequence-number order from the last one it read ([Store.Cursor]), and records what it
// finds, so that retries scheduled by a process without a [Recorder], and dead letters, are indexed
// too, and a lost index is rebuilt. It never receives or settles anything. A poll sees what arrived,
// not what left: when a copy falls due and is consumed by a process without a [Recorder], its event
// stays pending (overdue, as answers show) until a [Tailer.Rebuild] finds the copy gone. It is safe for concurrent
// use, but two polls of one store at once read the same messages twice (harmlessly).
type Tailer struct {
	store    Store
	open     func(path string) (peeker, error)
	entities []string // live entities first, then dead-letter queues
	opts     TailerOptions
}

// NewTailer returns a tailer of entity (a queue, or "topic/Subscriptions/subscription") through
// client: it reads the entity that holds the retry copies (the queue, or RetryQueue) and the
// dead-letter queues where the consumer dead-letters (the entity's, and the retry queue's when it is
// another queue). It does not contact Service Bus.
func NewTailer(client *azservicebus.Client, store Store, entity string, opts *TailerOptions) (*Tailer, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil client", ErrInvalidOptions)
	}
	return newTailer(store, entity, opts, func(path string) (peeker, error) {
		var ro azservicebus.ReceiverOptions
		if p, ok := strings.CutSuffix(path, deadLetterSuffix); ok {
			ro.SubQueue = azservicebus.SubQueueDeadLetter
			path = p
		}
		if topic, rest, ok := strings.Cut(path, "/Subscriptions/"); ok {
			return client.NewReceiverForSubscription(topic, rest, &ro)
		}
		return client.NewReceiverForQueue(path, &ro)
	})
}

func newTailer(store Store, entity string, opts *TailerOptions, open func(string) (peeker, error)) (*Tailer, error) {
	var o TailerOptions
	if opts != nil {
		o = *opts
	}
	isSub := strings.Contains(entity, "/Subscriptions/")
	switch {
	case store == nil:
		return nil, fmt.Errorf("%w: nil store", ErrInvalidOptions)
	case entity == "" || strings.HasSuffix(entity, deadLetterSuffix):
		return nil, fmt.Errorf("%w: entity %q must name a queue or a subscription", ErrInvalidOptions, entity)
	case isSub && o.RetryQueue == "":
		return nil, fmt.Errorf("%w: %s is a subscription: set RetryQueue to the queue its consumer schedules retries on", ErrInvalidOptions, entity)
	case strings.Contains(o.RetryQueue, "/"):
		return nil, fmt.Errorf("%w: RetryQueue %q must name a queue", ErrInvalidOptions, o.RetryQueue)
	case o.PeekBatchSize < 0:
		return nil, fmt.Errorf("%w: PeekBatchSize %d is negative", ErrInvalidOptions, o.PeekBatchSize)
	}
	if o.PeekBatchSize == 0 {
		o.PeekBatchSize = DefaultPeekBatchSize
	}
	if o.Process == "" {
		o.Process = "tailer"
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	live := entity
	dead := []string{entity + deadLetterSuffix}
	if o.RetryQueue != "" && !strings.EqualFold(o.RetryQueue, entity) {
		live = o.RetryQueue
		dead = append(dead, o.RetryQueue+deadLetterSuffix)
	}
	return &Tailer{store: store, open: open, entities: append([]string{live}, dead...), opts: o}, nil
}

// Entities lists the paths the tailer reads: the entity holding the copies, then the dead-letter
// queues.
func (t *Tailer) Entities() []string { return append([]string(nil), t.entities...) }

// Run polls every interval until ctx ends, and returns ctx's error. A failed poll is reported to
// onError (when not nil) and retried at the next interval: the broker being unreachable for a while
// leaves the index as stale as its feeds say, no worse. It owns no goroutine beyond the caller's.
func (t *Tailer) Run(ctx context.Context, interval time.Duration, onError func(error)) error {
	if interval <= 0 {
		return fmt.Errorf("%w: interval %v must be positive", ErrInvalidOptions, interval)
	}
	timer := time.NewTimer(0) // the first poll at once
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
		res, err := t.Poll(ctx)
		switch {
		case err != nil && ctx.Err() == nil && onError != nil:
			onError(err)
		case err == nil && t.opts.OnPoll != nil:
			t.opts.OnPoll(res)
		}
		timer.Reset(interval)
	}
}

// TailResult says what one [Tailer.Poll] or [Tailer.Rebuild] read.
type TailResult struct {
	// Peeked counts the messages read per entity path; Recorded the records written.
	Peeked   map[string]int
	Recorded int
	// Gone counts the events a rebuild marked gone (their copy was not in the entity).
	Gone int64
}

// Poll reads every entity from the sequence number after the last one read up to its end, and records
// what it finds: a scheduled retry copy (pending, with its due time), a copy receivable now (active), a
// dead letter. Each batch is stored with the cursor in one transaction, so a crash repeats no more than
// a batch. A message first seen by the tailer is as fresh as the poll; the answer's feeds say when that
// was.
func (t *Tailer) Poll(ctx context.Context) (TailResult, error) {
	res := TailResult{Peeked: map[string]int{}}
	for _, e := range t.entities {
		from, err := t.store.Cursor(ctx, e)
		if err != nil {
			return res, err
		}
		if err := t.read(ctx, e, from, &res, nil); err != nil {
			return res, err
		}
	}
	return res, nil
}

// Rebuild reads every entity from its first message, as [Tailer.Poll] does from sequence number 0, and
// then marks gone the pending and active events of the live entity whose copy it did not see and that
// no feed changed since the rebuild started: their copy was consumed by a process that does not
// record, or cancelled; last it clears the losses feeds noted before it started ([Store.ClearLost]),
// which the answers stop reporting. It is how a lost or stale index is rebuilt from the broker; its cost is a peek
// of the whole backlog (see BENCHMARKS.md).
func (t *Tailer) Rebuild(ctx context.Context) (TailResult, error) {
	res := TailResult{Peeked: map[string]int{}}
	start := t.opts.Now()
	seen := map[[20]byte]struct{}{}
	for i, e := range t.entities {
		var mark map[[20]byte]struct{}
		if i == 0 {
			mark = seen
		}
		if err := t.read(ctx, e, 0, &res, mark); err != nil {
			return res, err
		}
	}
	var err error
	res.Gone, err = t.store.MarkGone(ctx, t.entities[0], start, func(chain string) bool {
		var k [20]byte
		_, _ = hex.Decode(k[:], []byte(chain))
		_, ok := seen[k]
		return ok
	})
	if err != nil {
		return res, err
	}
	// The states are read again from the broker: records a feed lost before the rebuild started are
	// repaired as far as the broker remembers.
	return res, t.store.ClearLost(ctx, start)
}

// read peeks entity from sequence number from to its end, storing each batch with the cursor; when
// seen is set it collects the chains of the copies it read.
func (t *Tailer) read(ctx context.Context, entity string, from int64, res *TailResult, seen map[[20]byte]struct{}) error {
	p, err := t.open(entity)
	if err != nil {
		return fmt.Errorf("retryindex: opening %s: %w", entity, err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = p.Close(cctx)
	}()
	dead := strings.HasSuffix(entity, deadLetterSuffix)
	for {
		start := from
		msgs, err := p.PeekMessages(ctx, t.opts.PeekBatchSize, &azservicebus.PeekMessagesOptions{FromSequenceNumber: &start})
		if err != nil {
			return fmt.Errorf("retryindex: peeking %s from sequence number %d: %w", entity, from, err)
		}
		if len(msgs) == 0 {
			// The end: record the cursor even when nothing was read, so that the feed's time says
			// the entity was read up to now.
			return t.store.SetCursor(ctx, entity, from, nil)
		}
		var records []Record
		for _, m := range msgs {
			res.Peeked[entity]++
			if m.SequenceNumber != nil && *m.SequenceNumber >= from {
				from = *m.SequenceNumber + 1
			}
			r, ok := t.record(entity, dead, m)
			if !ok {
				continue
			}
			records = append(records, r)
			if seen != nil {
				var k [20]byte
				_, _ = hex.Decode(k[:], []byte(r.Chain))
				seen[k] = struct{}{}
			}
		}
		if from == start {
			return fmt.Errorf("retryindex: peeking %s: reply without sequence numbers beyond %d", entity, start)
		}
		if err := t.store.SetCursor(ctx, entity, from, records); err != nil {
			return err
		}
		res.Recorded += len(records)
	}
}

// record maps one peeked message to a record; ok is false for what is no retry state (a first
// delivery waiting for its first attempt, a probe).
func (t *Tailer) record(entity string, dead bool, m *azservicebus.ReceivedMessage) (Record, bool) {
	props := m.ApplicationProperties
	if v, ok := props[retry.PropProbe].(string); ok && v == retry.ProbeValue {
		return Record{}, false
	}
	env, err := envelope.Decode(m)
	if err != nil {
		// An invalid envelope is dead-lettered under the chain of its own MessageID, as the consumer
		// records it.
		env = envelope.Envelope{OriginalMessageID: m.MessageID, FirstSequenceNumber: -1}
	}
	if env.Source == "" && dead {
		env.Source = strings.TrimSuffix(entity, deadLetterSuffix)
	}
	r := Record{
		Chain: env.ChainID(), OriginalID: env.OriginalMessageID, Key: env.Key, CorrelationID: env.CorrelationID,
		Source: env.Source, Error: env.LastError, Entity: entity, SequenceNumber: -1,
		Process: t.opts.Process, Feed: FeedTailer, At: t.opts.Now(),
	}
	if r.Key == "" {
		r.Key = r.OriginalID
	}
	if r.CorrelationID == "" {
		r.CorrelationID = r.Key
	}
	if m.SequenceNumber != nil {
		r.SequenceNumber = *m.SequenceNumber
	}
	if m.EnqueuedTime != nil {
		r.At = *m.EnqueuedTime
	}
	_, isCopy := props[envelope.PropAttempt]
	_, held := props[envelope.PropHeld]
	switch {
	case dead:
		r.Kind, r.Attempt = KindDeadLettered, env.Attempt
		if n, ok := props[envelope.PropDeadLetterAttempt].(int64); ok && n > 0 && n <= 1<<31-1 {
			r.Attempt = int(n)
		}
		if m.DeadLetterReason != nil {
			r.Reason = *m.DeadLetterReason
		}
		if s, ok := props[envelope.PropDeadLetterReason].(string); ok && r.Reason == "" {
			r.Reason = s
		}
		if at, ok := props[envelope.PropDeadLetterTime].(time.Time); ok {
			r.At = at
		}
		if r.Error == "" && m.DeadLetterErrorDescription != nil {
			r.Error = *m.DeadLetterErrorDescription
		}
	case !isCopy || err != nil:
		return Record{}, false // a first delivery: no retry state yet
	case m.State == azservicebus.MessageStateScheduled && m.ScheduledEnqueueTime != nil:
		r.Kind, r.NextDue = KindScheduled, *m.ScheduledEnqueueTime
		r.Attempt, r.NextAttempt = env.Attempt-1, env.Attempt
		if held {
			r.Kind, r.Attempt = KindHeld, env.Attempt
		}
	default:
		r.Kind, r.Attempt = KindActive, env.Attempt
		r.Error = "" // the error is the previous attempt's, already in the history
	}
	return r, true
}
