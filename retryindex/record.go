package retryindex

import (
	"encoding/hex"
	"strconv"
	"strings"
	"time"
)

// Kind says what one [Record] observed.
type Kind int

// Kinds of record. The consumer's hooks write all but KindActive and KindGone, which only the broker
// tells (a [Tailer]).
const (
	// KindScheduled: an attempt failed and a retry copy for NextAttempt is due at NextDue.
	KindScheduled Kind = iota + 1
	// KindSucceeded: the handler succeeded and the message was completed.
	KindSucceeded
	// KindDeadLettered: the message was dead-lettered, with Reason.
	KindDeadLettered
	// KindDiscarded: a retry policy discarded the failure and completed the message.
	KindDiscarded
	// KindLeftForRedelivery: the attempt ended without a settle (lock lost, shutdown); the broker
	// delivers the message again.
	KindLeftForRedelivery
	// KindHeld: the consumer's outage breaker was open, so it held the message until NextDue in a
	// copy (retry.OutcomeHeld), without spending an attempt.
	KindHeld
	// KindActive: the broker holds the copy as receivable now (it fell due) or being processed.
	KindActive
	// KindGone: a rebuild found no copy where the event's pending copy was, and no feed said why (it
	// was consumed by a process that does not record, or cancelled).
	KindGone
	// KindDeferred: a session consumer held the message durably (retry.OutcomeDeferred): deferred in
	// its session, which waits behind it, until NextDue, when it resumes as NextAttempt.
	KindDeferred
)

// String names the kind as the history shows it.
func (k Kind) String() string {
	switch k {
	case KindScheduled:
		return "retry scheduled"
	case KindSucceeded:
		return "succeeded"
	case KindDeadLettered:
		return "dead-lettered"
	case KindDiscarded:
		return "discarded"
	case KindLeftForRedelivery:
		return "left for redelivery"
	case KindHeld:
		return "held"
	case KindActive:
		return "active"
	case KindGone:
		return "copy gone"
	case KindDeferred:
		return "held in its session"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Feeds that write records, as [Record.Feed] and [Event.Feed] name them.
const (
	// FeedConsumer is a consumer's [Recorder].
	FeedConsumer = "consumer"
	// FeedTailer is a [Tailer] reading the broker.
	FeedTailer = "tailer"
)

// Record is one observation about one event (a retry chain: the first delivery and all its copies).
// Feeds write records; the store folds them into the event's current state and appends them to its
// history. Fields that do not apply are zero.
type Record struct {
	// Chain names the event: [envelope.Envelope.ChainID], 40 hex digits shared by every copy.
	Chain string
	// OriginalID, Key and CorrelationID are the names the event is looked up by (the envelope's
	// OriginalMessageID, Key and CorrelationID); Source is the entity the chain started on.
	OriginalID, Key, CorrelationID, Source string
	// Kind is what was observed.
	Kind Kind
	// Attempt is the attempt the record is about: the one that ran (failed, succeeded, was
	// dead-lettered), or for KindActive the one the receivable copy runs as.
	Attempt int
	// NextAttempt is the attempt the pending copy runs as (KindScheduled, KindDeferred: Attempt+1;
	// KindHeld: Attempt), zero otherwise.
	NextAttempt int
	// At is when it happened, as the feed saw it.
	At time.Time
	// NextDue is when the pending copy falls due (KindScheduled, KindHeld, KindDeferred).
	NextDue time.Time
	// Error is the attempt's error text; the store redacts and bounds it.
	Error string
	// Reason is the dead-letter reason (KindDeadLettered).
	Reason string
	// Immediate is how many immediate retries the attempt made within its delivery before this
	// outcome ([retry.Result.ImmediateRetries]); the broker does not tell it, so a tailer's records
	// have zero.
	Immediate int
	// Entity and SequenceNumber place the copy or dead letter in the broker when the feed knows it
	// (SequenceNumber -1 or 0 means unknown); an action verifies there before it acts.
	Entity         string
	SequenceNumber int64
	// Process names the process that wrote the record (host/pid by default).
	Process string
	// Feed is [FeedConsumer] or [FeedTailer].
	Feed string
}

// position orders the records of one event, so that a late record from one feed never overwrites a
// newer state from the other: the attempt the state is about, then pending < active < final.
func (r Record) position() int64 {
	switch r.Kind {
	case KindScheduled:
		return int64(r.NextAttempt) * 4
	case KindHeld, KindDeferred, KindActive, KindLeftForRedelivery:
		// A hold spends no attempt: the outage breaker holds a delivery of attempt n for attempt n
		// again, after its copy fell due (active) or its lock was lost. It ranks with those, and the
		// later record of the two wins, so that a hold after active shows as held, and the held copy
		// falling due afterwards as active.
		if r.Kind == KindHeld || r.Kind == KindDeferred {
			return int64(r.NextAttempt)*4 + 1
		}
		return int64(r.Attempt)*4 + 1
	case KindGone:
		return -1 // applies only to the copy it names; see the store
	}
	return int64(r.Attempt)*4 + 2
}

// retryIDPrefix starts every retry MessageID (see [envelope.Envelope.RetryMessageID]).
const retryIDPrefix = "sbretry-"

// ChainOfMessageID returns the chain a retry MessageID ("sbretry-" + 40 hex digits + "-" + attempt)
// names, so that a copy's id is looked up without any index; ok is false for any other id.
func ChainOfMessageID(id string) (chain string, ok bool) {
	rest, found := strings.CutPrefix(id, retryIDPrefix)
	if !found || len(rest) < 42 || rest[40] != '-' {
		return "", false
	}
	if _, err := strconv.Atoi(rest[41:]); err != nil {
		return "", false
	}
	if !IsChainID(rest[:40]) {
		return "", false
	}
	return rest[:40], true
}

// IsChainID reports 40 lower-case hex digits, a chain id as [envelope.Envelope.ChainID] writes it: what
// [Store.Lookup] takes as the event itself.
func IsChainID(s string) bool {
	if len(s) != 40 || strings.ToLower(s) != s {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}
