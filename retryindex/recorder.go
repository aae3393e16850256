package retryindex

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
)

// Defaults of [RecorderOptions].
const (
	// DefaultBuffer is how many records wait for the writer before the hook drops new ones.
	DefaultBuffer = 8192
	// DefaultBatchSize is the most records one write transaction stores.
	DefaultBatchSize = 512
	// DefaultRetention is how long a finished event is kept after its last change.
	DefaultRetention = 14 * 24 * time.Hour
	// DefaultPruneInterval is how often the writer prunes events older than the retention.
	DefaultPruneInterval = time.Hour
	// DefaultFlushInterval is how long the writer gathers records before it writes them.
	DefaultFlushInterval = 100 * time.Millisecond
	// writeTimeout bounds one write of the writer, so that a store that hangs (a database across a
	// broken network) costs a batch, not the writer.
	writeTimeout = 30 * time.Second
)

// RecorderOptions configures [NewRecorder]. A nil *RecorderOptions means every default.
type RecorderOptions struct {
	// Process names this process in the history ("which process recorded attempt 3"). Empty means
	// "host/pid".
	Process string
	// RetryEntity is the entity the consumer schedules its retry copies on (the retry queue of a
	// subscription), recorded as where a pending copy is. Empty means the entity the message was
	// received from when that is a queue, else unknown (a subscription cannot hold the copies).
	RetryEntity string
	// Buffer is how many records may wait for the writer; once it is full the hook drops records
	// rather than slow the consumer down, counts them ([Recorder.Stats]) and has the writer note the
	// loss in the store ([Store.NoteLost]), so that answers say this feed missed records until a
	// [Tailer.Rebuild]. Zero means [DefaultBuffer]; negative is invalid.
	Buffer int
	// BatchSize is the most records one write transaction stores. Zero means [DefaultBatchSize];
	// negative is invalid.
	BatchSize int
	// FlushInterval is how long the writer gathers records after the first of a batch before it
	// writes them (sooner when BatchSize are queued, or on Close): one transaction per record would
	// write every touched page of every index to the log for each (measured: a consumer that failed
	// every message ran at half speed). It bounds how stale the consumer's feed is. Zero means
	// [DefaultFlushInterval] (100 ms); negative is invalid.
	FlushInterval time.Duration
	// Retention is how long a finished event (succeeded, dead-lettered, discarded, gone) is kept after
	// its last change; the writer prunes older ones every PruneInterval. Zero means
	// [DefaultRetention] (14 days); negative is invalid.
	Retention time.Duration
	// PruneInterval is how often the writer prunes. Zero means [DefaultPruneInterval]; negative
	// disables pruning (prune with [Store.Prune] yourself).
	PruneInterval time.Duration
	// RecordFirstAttempts also records the deliveries that succeeded (or were left for redelivery
	// without an error) at their first attempt. By default they are skipped: they are no retry state,
	// they are nearly every delivery of a healthy consumer, and storing each costs the writer about as
	// much CPU as the consumer spends on the message (see BENCHMARKS.md), while a retried event is
	// recorded from its first failure on, its final success included. With it, "what happened to X?"
	// is answered for every delivery, at that cost.
	RecordFirstAttempts bool
	// Now is the clock that stamps records. Nil means time.Now.
	Now func() time.Time
}

// RecorderStats counts what a [Recorder] did with the records its hooks made.
type RecorderStats struct {
	// Stored records were written to the store; Dropped ones were not, because the buffer was full or
	// the recorder closed; Failed ones were lost with a write the store refused.
	Stored, Dropped, Failed int64
	// LastErr is the last write error, nil if none.
	LastErr error
}

// Recorder feeds a [Store] from a consumer's hooks. Create it with [NewRecorder], compose
// [Recorder.Hooks] into the consumer's options, and Close it after the consumer's Run returned. It owns
// one writer goroutine, started by NewRecorder and ended by Close. It is safe for concurrent use.
type Recorder struct {
	store Store
	opts  RecorderOptions

	mu     sync.RWMutex // guards closed against sends on queue
	closed bool
	queue  chan Record
	done   chan struct{}

	stored, dropped, failed atomic.Int64
	lastErr                 atomic.Pointer[error]
	// unnoted counts the records dropped or failed that the store was not yet told of
	// ([Store.NoteLost]): the writer tells it after its next write.
	unnoted atomic.Int64
}

// NewRecorder starts a recorder writing to store.
func NewRecorder(store Store, opts *RecorderOptions) (*Recorder, error) {
	var o RecorderOptions
	if opts != nil {
		o = *opts
	}
	switch {
	case store == nil:
		return nil, fmt.Errorf("%w: nil store", ErrInvalidOptions)
	case o.Buffer < 0:
		return nil, fmt.Errorf("%w: Buffer %d is negative", ErrInvalidOptions, o.Buffer)
	case o.BatchSize < 0:
		return nil, fmt.Errorf("%w: BatchSize %d is negative", ErrInvalidOptions, o.BatchSize)
	case o.FlushInterval < 0:
		return nil, fmt.Errorf("%w: FlushInterval %v is negative", ErrInvalidOptions, o.FlushInterval)
	case o.Retention < 0:
		return nil, fmt.Errorf("%w: Retention %v is negative", ErrInvalidOptions, o.Retention)
	}
	if o.Process == "" {
		host, _ := os.Hostname()
		o.Process = host + "/" + strconv.Itoa(os.Getpid())
	}
	if o.Buffer == 0 {
		o.Buffer = DefaultBuffer
	}
	if o.BatchSize == 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.FlushInterval == 0 {
		o.FlushInterval = DefaultFlushInterval
	}
	if o.Retention == 0 {
		o.Retention = DefaultRetention
	}
	if o.PruneInterval == 0 {
		o.PruneInterval = DefaultPruneInterval
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	r := &Recorder{store: store, opts: o, queue: make(chan Record, o.Buffer), done: make(chan struct{})}
	go r.write(o.Now())
	return r, nil
}

// Hooks returns hooks that record each delivery's outcome and then call next's hook of the same name,
// so that the index composes with the user's own hooks and with instrumentation:
//
//	opts := &retry.Options{Hooks: rec.Hooks(inst.Hooks(retry.Hooks{}))}
//
// Only OnProcessed records (once per delivery, after it is settled: the outcome is then what the
// broker holds), and by default not a first attempt's success ([RecorderOptions.RecordFirstAttempts]);
// it never blocks. The other hooks of next are passed through unchanged.
func (r *Recorder) Hooks(next retry.Hooks) retry.Hooks {
	h := next
	h.OnProcessed = func(p retry.ProcessedParams) {
		r.onProcessed(p)
		if next.OnProcessed != nil {
			next.OnProcessed(p)
		}
	}
	return h
}

// onProcessed turns one delivery's outcome into a record and queues it.
func (r *Recorder) onProcessed(p retry.ProcessedParams) {
	rec, ok := r.record(p)
	if !ok {
		return
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		r.dropped.Add(1)
		return
	}
	select {
	case r.queue <- rec:
	default:
		// A full queue means the writer has a whole buffer to store: it notes this loss after
		// that write, and the answers say so until a rebuild.
		r.dropped.Add(1)
		r.unnoted.Add(1)
	}
}

// record maps a processed delivery to a record; ok is false for what is no event (a connection
// check's probe).
func (r *Recorder) record(p retry.ProcessedParams) (Record, bool) {
	msg, env, res := p.Message, p.Envelope, p.Result
	if msg == nil || isProbe(msg) {
		return Record{}, false
	}
	if !r.opts.RecordFirstAttempts && res.Attempt <= 1 && res.HandlerErr == nil &&
		(res.Outcome == retry.OutcomeCompleted || res.Outcome == retry.OutcomeLeftForRedelivery) && !heldCopy(msg) {
		return Record{}, false // checked first: the healthy path costs the consumer nothing more
	}
	if res.Outcome == retry.OutcomeDeferred && res.HandlerErr == nil {
		// A session message set aside behind another's durable hold: no retry state of its own.
		return Record{}, false
	}
	rec := Record{
		Chain: env.ChainID(), OriginalID: env.OriginalMessageID, Key: env.Key, CorrelationID: env.CorrelationID,
		Source: env.Source, Attempt: res.Attempt, At: r.opts.Now(), Process: r.opts.Process, Feed: FeedConsumer,
		SequenceNumber: -1,
	}
	if rec.Source == "" {
		rec.Source = p.EntityPath
	}
	rec.Immediate = res.ImmediateRetries
	if res.HandlerErr != nil {
		rec.Error = res.HandlerErr.Error()
	}
	switch res.Outcome {
	case retry.OutcomeCompleted:
		rec.Kind = KindSucceeded
	case retry.OutcomeRetryScheduled:
		rec.Kind, rec.NextAttempt, rec.NextDue = KindScheduled, res.Attempt+1, res.ScheduledFor
		rec.Entity, rec.SequenceNumber = r.retryEntity(p.EntityPath), res.SequenceNumber
	case retry.OutcomeHeld:
		// The outage breaker spends no attempt: the held copy runs attempt n again.
		rec.Kind, rec.NextAttempt, rec.NextDue = KindHeld, res.Attempt, res.ScheduledFor
		rec.Entity, rec.SequenceNumber = r.retryEntity(p.EntityPath), res.SequenceNumber
	case retry.OutcomeDeferred:
		// A session's durable hold: the message is deferred in the session entity itself, and
		// resumes as the next attempt when ScheduledFor comes.
		rec.Kind, rec.NextAttempt, rec.NextDue = KindDeferred, res.Attempt+1, res.ScheduledFor
		rec.Entity = p.EntityPath
	case retry.OutcomeDeadLettered:
		rec.Kind, rec.Reason = KindDeadLettered, res.DeadLetterReason
		rec.Entity = p.EntityPath + "/$DeadLetterQueue"
	case retry.OutcomeDiscarded:
		rec.Kind = KindDiscarded
	case retry.OutcomeLeftForRedelivery:
		rec.Kind = KindLeftForRedelivery
		if rec.Error == "" && res.SettleErr != nil {
			rec.Error = res.SettleErr.Error()
		}
	default:
		return Record{}, false
	}
	return rec, true
}

// heldCopy reports a copy the outage breaker made (envelope.PropHeld): its first attempt's outcome is
// recorded even when it succeeds, since the hold that made it was.
func heldCopy(msg *azservicebus.ReceivedMessage) bool {
	_, ok := msg.ApplicationProperties[envelope.PropHeld]
	return ok
}

// retryEntity is where the consumer of entity schedules its copies, as far as the recorder knows.
func (r *Recorder) retryEntity(entity string) string {
	switch {
	case r.opts.RetryEntity != "":
		return r.opts.RetryEntity
	case strings.Contains(entity, "/"):
		return "" // a subscription: its retry queue was not named
	}
	return entity
}

func isProbe(m *azservicebus.ReceivedMessage) bool {
	v, ok := m.ApplicationProperties[retry.PropProbe].(string)
	return ok && v == retry.ProbeValue
}

// write is the writer goroutine: it stores what the hooks queued in batches until Close, and prunes
// every PruneInterval counted from lastPrune (the recorder's start).
func (r *Recorder) write(lastPrune time.Time) {
	defer close(r.done)
	batch := make([]Record, 0, r.opts.BatchSize)
	gather := time.NewTimer(r.opts.FlushInterval)
	gather.Stop()
	for rec := range r.queue {
		batch = append(batch[:0], rec)
		gather.Reset(r.opts.FlushInterval)
	fill:
		for len(batch) < r.opts.BatchSize {
			select {
			case more, ok := <-r.queue:
				if !ok {
					break fill // closed: write what there is now
				}
				batch = append(batch, more)
			case <-gather.C:
				break fill
			}
		}
		gather.Stop()
		r.flush(batch)
		if now := r.opts.Now(); r.opts.PruneInterval > 0 && now.Sub(lastPrune) >= r.opts.PruneInterval {
			lastPrune = now
			ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
			if _, err := r.store.Prune(ctx, now.Add(-r.opts.Retention)); err != nil {
				r.lastErr.Store(&err)
			}
			cancel()
		}
	}
	// Closed: a loss the last writes could not note (the store refused them) gets one more try.
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	r.noteLost(ctx)
}

// flush stores one batch. A failed write loses the batch (counted in Failed): the broker still has
// the truth, and the tailer reads it again.
func (r *Recorder) flush(batch []Record) {
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	if err := r.store.Apply(ctx, batch); err != nil {
		r.failed.Add(int64(len(batch)))
		r.unnoted.Add(int64(len(batch)))
		r.lastErr.Store(&err)
		return
	}
	r.stored.Add(int64(len(batch)))
	r.noteLost(ctx)
}

// noteLost tells the store of the records lost since it was last told, so that every answer says
// this feed missed them; when that write fails too, the next write tries again.
func (r *Recorder) noteLost(ctx context.Context) {
	n := r.unnoted.Swap(0)
	if n == 0 {
		return
	}
	if err := r.store.NoteLost(ctx, "consumer "+r.opts.Process, n); err != nil {
		r.unnoted.Add(n)
		r.lastErr.Store(&err)
	}
}

// Stats says what the recorder did so far.
func (r *Recorder) Stats() RecorderStats {
	s := RecorderStats{Stored: r.stored.Load(), Dropped: r.dropped.Load(), Failed: r.failed.Load()}
	if p := r.lastErr.Load(); p != nil {
		s.LastErr = *p
	}
	return s
}

// Close stops taking records, waits for the writer to store what is queued, and returns when it has,
// or when ctx ends (the writer then finishes in the background and the error says so). Hooks called
// after Close drop their records. It is idempotent; it does not close the store.
func (r *Recorder) Close(ctx context.Context) error {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.queue)
	}
	r.mu.Unlock()
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("retryindex: closing the recorder: %d records still queued: %w", len(r.queue), errors.Join(ErrClosed, ctx.Err()))
	}
}
