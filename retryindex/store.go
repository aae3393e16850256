package retryindex

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Errors returned by this package. Each has the "retryindex: " prefix.
var (
	// ErrInvalidOptions wraps every refusal of an options struct.
	ErrInvalidOptions = errors.New("retryindex: invalid options")
	// ErrInvalidRecord wraps a record a store refuses (no chain, an unknown kind).
	ErrInvalidRecord = errors.New("retryindex: invalid record")
	// ErrClosed is returned by calls on a closed store or recorder.
	ErrClosed = errors.New("retryindex: closed")
	// ErrInvalidCursor is returned by [Store.Pending] for a cursor it did not write.
	ErrInvalidCursor = errors.New("retryindex: invalid cursor")
)

// Store is an index of retry state. [OpenSQLite] returns the embedded one. Implementations are safe for
// concurrent use: feeds write while consoles read.
type Store interface {
	// Apply folds records into their events' state and history, in one transaction: all or none.
	Apply(ctx context.Context, records []Record) error
	// Lookup finds the events id names: a retry MessageID or a chain id (the event itself), else every
	// event whose original MessageID, idempotency key or correlation id is id (at most
	// [LookupOptions.MaxEvents], newest first), each with its history.
	Lookup(ctx context.Context, id string, opts *LookupOptions) (*Answer, error)
	// Pending returns one page of pending retries, earliest due first.
	Pending(ctx context.Context, opts *PendingOptions) (*PendingPage, error)
	// DeadLettered returns one page of dead-lettered events, the most recently dead-lettered first,
	// with the same options and page as Pending (Total counts the dead-lettered events).
	DeadLettered(ctx context.Context, opts *PendingOptions) (*PendingPage, error)
	// Counts counts the events in each state, exactly, as of the time it states: every event, or
	// those of one source entity ([CountsOptions.Source]).
	Counts(ctx context.Context, opts *CountsOptions) (*Counts, error)
	// PendingHistogram counts the pending retries by due time, exactly, in buckets of equal width
	// (see [HistogramOptions]), as of the time it states.
	PendingHistogram(ctx context.Context, opts *HistogramOptions) (*Histogram, error)
	// Prune deletes the finished events (succeeded, dead-lettered, discarded, gone) last changed before
	// before, with their history, and returns how many events it deleted.
	Prune(ctx context.Context, before time.Time) (int64, error)
	// Freshness lists the feeds and when each last wrote.
	Freshness(ctx context.Context) (*Freshness, error)
	// Cursor returns the next sequence number a [Tailer] reads in entity (0 when it never read it), and
	// SetCursor records it together with the records read up to it, in one transaction, with the
	// feed's freshness.
	Cursor(ctx context.Context, entity string) (int64, error)
	SetCursor(ctx context.Context, entity string, next int64, records []Record) error
	// MarkGone records, for each pending or active event whose copy is in entity, that no feed changed
	// since since, and that seen reports not seen by the rebuild that started then (see
	// [Tailer.Rebuild]), that the copy is gone. It returns how many events it marked.
	MarkGone(ctx context.Context, entity string, since time.Time, seen func(chain string) bool) (int64, error)
	// NoteLost adds n to the records feed lost (a [Recorder] dropped them while its queue was full,
	// or a write of them failed), and stamps when: every answer's [FeedStatus] says so until a
	// rebuild repairs it (ClearLost).
	NoteLost(ctx context.Context, feed string, n int64) error
	// ClearLost forgets the losses noted before before: a [Tailer.Rebuild] that started then read the
	// broker again, so the events' states no longer miss them (their history still does).
	ClearLost(ctx context.Context, before time.Time) error
	// Close releases the store. Calls after Close return [ErrClosed].
	Close() error
}

// State is where an event stands, as the last record that applied says.
type State int

// States of an event.
const (
	// StatePending: a retry copy is scheduled; it falls due at [Event.Due].
	StatePending State = iota + 1
	// StateActive: the copy is receivable or being processed (it fell due, or was left for
	// redelivery).
	StateActive
	// StateSucceeded: an attempt succeeded.
	StateSucceeded
	// StateDeadLettered: the message was dead-lettered.
	StateDeadLettered
	// StateDiscarded: a policy discarded the failure.
	StateDiscarded
	// StateGone: the pending copy is no longer in the broker and no feed said why.
	StateGone
)

// States lists every state, in the order counts print them.
var States = []State{StatePending, StateActive, StateSucceeded, StateDeadLettered, StateDiscarded, StateGone}

// String names the state.
func (s State) String() string {
	switch s {
	case StatePending:
		return "pending"
	case StateActive:
		return "active"
	case StateSucceeded:
		return "succeeded"
	case StateDeadLettered:
		return "dead-lettered"
	case StateDiscarded:
		return "discarded"
	case StateGone:
		return "gone"
	}
	return "unknown"
}

// stateOf is the state a record of kind k leaves its event in.
func stateOf(k Kind) State {
	switch k {
	case KindScheduled, KindHeld, KindDeferred:
		return StatePending
	case KindActive, KindLeftForRedelivery:
		return StateActive
	case KindSucceeded:
		return StateSucceeded
	case KindDeadLettered:
		return StateDeadLettered
	case KindDiscarded:
		return StateDiscarded
	case KindGone:
		return StateGone
	}
	return 0
}

// Event is the indexed state of one retry chain.
type Event struct {
	// Chain is the event's id ([envelope.Envelope.ChainID]); OriginalID, Key and CorrelationID are its
	// names; Source is the entity the chain started on.
	Chain, OriginalID, Key, CorrelationID, Source string
	// State is where the event stands, as the latest record says, and Kind what that record
	// observed: for StatePending, a retry copy scheduled (KindScheduled), a copy the outage breaker
	// held (KindHeld), or a session's durable hold (KindDeferred). Zero in an index written before
	// events kept it.
	State State
	Kind  Kind
	// Attempt is the attempt the state is about: for StatePending the attempt the copy will run as,
	// otherwise the last attempt that ran or runs.
	Attempt int
	// Due is when the pending copy falls due (StatePending only).
	Due time.Time
	// LastError is the last recorded error (redacted, bounded); Reason the dead-letter reason.
	LastError, Reason string
	// Immediate is how many immediate retries the last recorded attempt made within its delivery.
	Immediate int
	// Entity and SequenceNumber place the copy or dead letter in the broker, when a feed knew it.
	Entity         string
	SequenceNumber int64
	// Updated is when the state last changed, and Feed which feed changed it: how fresh this event is.
	Updated time.Time
	Feed    string
	// History is every recorded attempt, oldest first (bounded by [LookupOptions.MaxHistory]); empty
	// in pages.
	History []Attempt
}

// RetryMessageID is the MessageID of the pending copy ("sbretry-<chain>-<attempt>"), empty when the
// event is not pending, or is held in its session (KindDeferred: no copy, the message itself waits).
func (e Event) RetryMessageID() string {
	if e.State != StatePending || e.Attempt < 1 || e.Kind == KindDeferred {
		return ""
	}
	return retryIDPrefix + e.Chain + "-" + itoa(e.Attempt)
}

// Attempt is one entry of an event's history.
type Attempt struct {
	// Attempt is the attempt the entry is about, Kind what happened, At when.
	Attempt int
	Kind    Kind
	At      time.Time
	// Error is the attempt's error (redacted, bounded); Reason the dead-letter reason.
	Error, Reason string
	// NextDue is when the copy it scheduled falls due (KindScheduled, KindHeld, KindDeferred).
	NextDue time.Time
	// Immediate is how many immediate retries the attempt made within its delivery.
	Immediate int
	// Process is the process that recorded it; Feed the feed.
	Process, Feed string
}

// FeedStatus says when one feed last wrote.
type FeedStatus struct {
	// Name is the feed: "consumer <process>", or "tailer <entity>".
	Name string
	// Last is the time of its last write. For a tailer, Cursor is the next sequence number it reads.
	Last   time.Time
	Cursor int64
	// Lost counts the records the feed could not store since the last rebuild (see
	// [Store.NoteLost]), LostAt when the last was noted: when Lost is not zero, answers may miss
	// changes this feed saw, until a [Tailer.Rebuild] (or the tailer's next poll, for copies and dead
	// letters that arrive after its cursor) reads them from the broker.
	Lost   int64
	LostAt time.Time
}

// Freshness says how fresh an answer is: as of when it was read, and when each feed last wrote.
type Freshness struct {
	// AsOf is when the answer was read (the store's clock); Feeds when each feed last wrote.
	AsOf  time.Time
	Feeds []FeedStatus
}

// Answer is what [Store.Lookup] found.
type Answer struct {
	// ID is what was asked for.
	ID string
	// Events are the events ID names, the most recently changed first.
	Events []Event
	// Truncated says more events matched than [LookupOptions.MaxEvents].
	Truncated bool
	Freshness
}

// LookupOptions bounds a lookup. A nil *LookupOptions means every default.
type LookupOptions struct {
	// MaxEvents bounds the events returned (a correlation id may name many). Zero means 20.
	MaxEvents int
	// MaxHistory bounds the history entries per event (the newest are kept). Zero means 100.
	MaxHistory int
}

// PendingOptions selects a page of pending retries. A nil *PendingOptions means the first page of
// [DefaultPageLimit].
type PendingOptions struct {
	// Limit is the page size. Zero means [DefaultPageLimit]; negative is invalid.
	Limit int
	// Cursor continues after the page that returned it as [PendingPage.Next]; empty starts at the
	// earliest due.
	Cursor string
	// Source, when set, keeps only the events whose chain started on that entity (a queue, or
	// "topic/Subscriptions/sub"), and Total counts only those. The stores index the events by source
	// too, and keep their counts by source, so a page of one entity costs what a page of all does.
	Source string
}

// DefaultPageLimit is the page size of [Store.Pending] when [PendingOptions.Limit] is zero.
const DefaultPageLimit = 100

// Parse is the options with their defaults applied and where the page starts (see [Store.Pending]
// and [Store.DeadLettered]): the two integers of the cursor, or the start of the order, ascending or
// descending (desc). A cursor that does not parse is [ErrInvalidCursor].
func (po *PendingOptions) Parse(desc bool) (o PendingOptions, afterKey, afterID int64, err error) {
	if po != nil {
		o = *po
	}
	if o.Limit < 0 {
		return o, 0, 0, fmt.Errorf("%w: Limit %d is negative", ErrInvalidOptions, o.Limit)
	}
	if o.Limit == 0 {
		o.Limit = DefaultPageLimit
	}
	afterKey, afterID = math.MinInt64, math.MinInt64
	if desc {
		afterKey, afterID = math.MaxInt64, math.MaxInt64
	}
	if o.Cursor != "" {
		k, i, ok := strings.Cut(o.Cursor, ".")
		var err1, err2 error
		afterKey, err1 = strconv.ParseInt(k, 10, 64)
		afterID, err2 = strconv.ParseInt(i, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			return o, 0, 0, fmt.Errorf("%w: %q", ErrInvalidCursor, o.Cursor)
		}
	}
	return o, afterKey, afterID, nil
}

// PendingPage is one page of pending retries in due order.
type PendingPage struct {
	// Items are the page's pending events, earliest due first (without history).
	Items []Event
	// Next continues the listing; empty on the last page.
	Next string
	// Total counts every pending retry, as of Freshness.AsOf.
	Total int64
	Freshness
}

// CountsOptions selects what [Store.Counts] counts. A nil *CountsOptions counts every event.
type CountsOptions struct {
	// Source, when set, counts only the events whose chain started on that entity (as
	// [PendingOptions.Source]).
	Source string
}

// Counts counts events by state, exactly, as of AsOf.
type Counts struct {
	// ByState counts the events in each state; a state without events is absent.
	ByState map[State]int64
	Freshness
}

// MaxHistogramBuckets bounds the buckets of one [Store.PendingHistogram].
const MaxHistogramBuckets = 10_000

// HistogramOptions selects what [Store.PendingHistogram] counts: the pending retries of Source (every
// entity's when empty) due from From to To, both included, in buckets of Width from From (the last
// one may end after To, but counts nothing due after To).
type HistogramOptions struct {
	// Source, when set, counts only the events whose chain started on that entity (as
	// [PendingOptions.Source]).
	Source string
	// From and To bound the due times the buckets count. A zero From means no lower bound, a zero To
	// no upper bound (and either, no buckets: Width must then be zero); To must not be before From.
	From, To time.Time
	// Width is the buckets' width, whole milliseconds (the index's precision), and at most
	// [MaxHistogramBuckets] of them may cover From to To. Zero means no buckets: only the bounds
	// (First, Last) and Total are read, in a few index lookups whatever the backlog.
	Width time.Duration
}

// Buckets is the number of buckets o asks for: enough of Width to cover From to To, or 0.
func (o HistogramOptions) Buckets() int {
	if o.Width <= 0 || o.From.IsZero() || o.To.IsZero() {
		return 0
	}
	return int((o.To.UnixMilli()-o.From.UnixMilli())/o.Width.Milliseconds()) + 1
}

// Bounds is the range o counts, in Unix milliseconds (the index's unit), both included: the whole
// range of int64 where From or To is zero.
func (o HistogramOptions) Bounds() (lo, hi int64) {
	lo, hi = math.MinInt64, math.MaxInt64
	if !o.From.IsZero() {
		lo = o.From.UnixMilli()
	}
	if !o.To.IsZero() {
		hi = o.To.UnixMilli()
	}
	return lo, hi
}

// Validate says why o cannot be answered, wrapping [ErrInvalidOptions], or nil.
func (o HistogramOptions) Validate() error {
	switch {
	case o.Width < 0:
		return fmt.Errorf("%w: Width %v is negative", ErrInvalidOptions, o.Width)
	case o.Width%time.Millisecond != 0:
		return fmt.Errorf("%w: Width %v is not whole milliseconds", ErrInvalidOptions, o.Width)
	case o.Width > 0 && (o.From.IsZero() || o.To.IsZero()):
		return fmt.Errorf("%w: buckets need a From and a To", ErrInvalidOptions)
	case !o.From.IsZero() && !o.To.IsZero() && o.To.Before(o.From):
		return fmt.Errorf("%w: To %v is before From %v", ErrInvalidOptions, o.To, o.From)
	case o.Width > 0 && (o.To.UnixMilli()-o.From.UnixMilli())/o.Width.Milliseconds() >= MaxHistogramBuckets:
		return fmt.Errorf("%w: more than %d buckets of %v from %v to %v", ErrInvalidOptions, MaxHistogramBuckets, o.Width, o.From, o.To)
	}
	return nil
}

// Histogram is the pending retries counted by due time (see [HistogramOptions]), as of AsOf.
type Histogram struct {
	// From and Width are the buckets' start and width, as asked; Counts[i] counts the retries due in
	// [From + i×Width, From + (i+1)×Width), and not after To.
	From   time.Time
	Width  time.Duration
	Counts []int64
	// Before counts the retries due before From, After those due after To (both zero when Width is
	// zero: no count was made).
	Before, After int64
	// First and Last are the earliest and latest due times from From to To (zero when none is).
	First, Last time.Time
	// Total counts every pending retry of the source: with buckets, Before, the buckets and After add
	// up to it.
	Total int64
	Freshness
}
