package inspect

import (
	"context"
	"slices"
	"strings"
)

// Status is everything the entity says about one key, correlation id or message id.
type Status struct {
	// ID is what was asked for.
	ID string
	// Pending are scheduled retry copies, earliest due first.
	Pending []Pending
	// Active are copies receivable now or being processed, in sequence-number order.
	Active []Active
	// DeadLetters are the matching dead letters, in the order they were dead-lettered.
	DeadLetters []DeadLetter
	// Scans says what was read to answer, one per entity; see [Truncated].
	Scans []Scan
}

// Truncated reports whether a scan stopped at [Options.MaxPeek], so that matches beyond it are missing.
func (s *Status) Truncated() bool { return Truncated(s.Scans) }

// Status answers "is this message going to be retried, and when?" for id, which is matched against the
// MessageID of every message and against the retry envelope's Key, CorrelationID and
// OriginalMessageID (so the idempotency key, the producer's correlation id and the first delivery's
// MessageID all work, and a first delivery without an envelope is found by its MessageID or
// CorrelationID). A message resubmitted from the dead-letter queue is found by its original MessageID.
//
// It peeks the entity (and the retry queue, if that is another queue) and the dead-letter queue, each
// up to [Options.MaxPeek] messages. Scheduled matches are Pending, the others Active; the retry
// library's send-rights probes are skipped. Errors from Service Bus are returned wrapped; an empty id
// returns [ErrEmptyID].
func (in *Inspector) Status(ctx context.Context, id string) (*Status, error) {
	if id == "" {
		return nil, ErrEmptyID
	}
	st := &Status{ID: id}
	for _, s := range in.liveSources() {
		entity := in.sourcePath(s)
		sc, err := in.scan(ctx, s, func(d decoded) {
			if d.isProbe() || !d.matches(id) {
				return
			}
			if d.isScheduled() {
				st.Pending = append(st.Pending, d.pending(entity))
			} else {
				st.Active = append(st.Active, d.active(entity))
			}
		})
		st.Scans = append(st.Scans, sc)
		if err != nil {
			return st, err
		}
	}
	for _, src := range in.deadSources() {
		entity := in.sourcePath(src)
		sc, err := in.scan(ctx, src, func(d decoded) {
			if d.matches(id) {
				st.DeadLetters = append(st.DeadLetters, d.deadLetter(entity))
			}
		})
		st.Scans = append(st.Scans, sc)
		if err != nil {
			return st, err
		}
	}
	slices.SortStableFunc(st.Pending, comparePending)
	slices.SortStableFunc(st.DeadLetters, func(a, b DeadLetter) int { return a.DeadLetteredAt.Compare(b.DeadLetteredAt) })
	return st, nil
}

// deadSources are the dead-letter queues: the entity's, and the retry queue's when it is another
// queue. A chain whose last attempt came from the retry queue is dead-lettered there.
func (in *Inspector) deadSources() []source {
	if in.separateRetryQueue() {
		return []source{sourceDeadLetter, sourceRetryDeadLetter}
	}
	return []source{sourceDeadLetter}
}

// liveSources are the entities that hold pending and active copies: the entity, and the retry queue
// when it is another queue.
func (in *Inspector) liveSources() []source {
	if in.separateRetryQueue() {
		return []source{sourceEntity, sourceRetryQueue}
	}
	return []source{sourceEntity}
}

// cancelSources are the queues that hold retry copies a Sender can cancel: the queue, the retry queue
// when it is another queue, and for a subscription its retry queue only (a subscription cannot be sent
// to, so nothing is ever scheduled on it by the retry library), none for an entity a session consumer
// consumes (it schedules no retry copies).
func (in *Inspector) cancelSources() []source {
	switch {
	case in.opts.SessionConsumer:
		return nil
	case in.entity.IsSubscription():
		return []source{sourceRetryQueue}
	case in.separateRetryQueue():
		return []source{sourceEntity, sourceRetryQueue}
	}
	return []source{sourceEntity}
}

// comparePending orders pending retries by due time, then entity, then sequence number: a total order,
// which the paging cursor relies on.
func comparePending(a, b Pending) int {
	if c := a.DueTime.Compare(b.DueTime); c != 0 {
		return c
	}
	if c := strings.Compare(a.Entity, b.Entity); c != 0 {
		return c
	}
	switch {
	case a.SequenceNumber < b.SequenceNumber:
		return -1
	case a.SequenceNumber > b.SequenceNumber:
		return 1
	}
	return 0
}
