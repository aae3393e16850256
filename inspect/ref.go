package inspect

import (
	"fmt"
	"strconv"
	"strings"
)

// Ref addresses one message: the entity holding it and its sequence number there.
//
// Service Bus counts sequence numbers per entity, and a dead-letter queue numbers its messages on its
// own, so a sequence number alone names a message only while one entity is read. In the subscription
// layout (a subscription and the retry queue its consumer schedules copies on) the first dead letter of
// the subscription and the first dead letter of the retry queue are both number 1: an operator tool that
// acted on "number 1" would act on one of them at random. Every selection in this package is therefore
// made of Refs, and every result carries its entity.
type Ref struct {
	// Entity is the path of the entity holding the message, as the results of this package spell it:
	// a queue ("billing-retry"), a subscription ("events/Subscriptions/billing"), or a dead-letter
	// queue ("billing-retry/$DeadLetterQueue"). Service Bus names are compared ignoring case.
	//
	// Empty means "the only entity that can hold it": an [Inspector] accepts that only when exactly
	// one entity qualifies (one dead-letter queue for a dead letter, one queue holding retry copies
	// for a pending retry), and refuses it with [ErrAmbiguousRef] otherwise.
	Entity string
	// SequenceNumber is the message's sequence number in Entity.
	SequenceNumber int64
}

// String formats r as [ParseRef] reads it: "ENTITY:SEQ", or "SEQ" without an entity.
func (r Ref) String() string {
	if r.Entity == "" {
		return strconv.FormatInt(r.SequenceNumber, 10)
	}
	return r.Entity + ":" + strconv.FormatInt(r.SequenceNumber, 10)
}

// ParseRef parses "ENTITY:SEQ" ("billing-retry/$DeadLetterQueue:17") or a bare "SEQ" ("17", a Ref
// without an entity). Entity names never contain a colon, so the last colon separates the two. Errors
// wrap [ErrInvalidRef].
func ParseRef(s string) (Ref, error) {
	s = strings.TrimSpace(s)
	entity, num := "", s
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		entity, num = s[:i], s[i+1:]
		if entity == "" {
			return Ref{}, fmt.Errorf("%w: %q has an empty entity before the colon", ErrInvalidRef, s)
		}
		// "billing-retry/:6" is what a shell leaves of an unquoted "billing-retry/$DeadLetterQueue:6".
		if strings.HasSuffix(entity, "/") || strings.Contains(entity, "//") {
			return Ref{}, fmt.Errorf("%w: %q has an empty path segment (quote a $DeadLetterQueue path in the shell: '...$DeadLetterQueue:N')", ErrInvalidRef, s)
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return Ref{}, fmt.Errorf("%w: %q is not a sequence number", ErrInvalidRef, num)
	}
	return Ref{Entity: entity, SequenceNumber: n}, nil
}

// refOf is the Ref of a message found in the entity behind s.
func (in *Inspector) refOf(s source, seq int64) Ref {
	return Ref{Entity: in.sourcePath(s), SequenceNumber: seq}
}

// resolve finds the entity among candidates that r names. A Ref without an entity names the only
// candidate; with two or more it is refused, because a sequence number that is right in one entity
// names an unrelated message in the other. The returned Ref spells the entity as the inspector does.
// what says in errors what kind of message the candidates hold ("dead letter", "pending retry").
func (in *Inspector) resolve(r Ref, candidates []source, what string) (source, Ref, error) {
	paths := make([]string, len(candidates))
	for i, s := range candidates {
		paths[i] = in.sourcePath(s)
	}
	if r.SequenceNumber < 0 {
		return 0, r, fmt.Errorf("%w: sequence number %d is negative", ErrInvalidRef, r.SequenceNumber)
	}
	if len(candidates) == 0 {
		// A subscription a session consumer consumes: it holds its retries in the session.
		return 0, r, fmt.Errorf("%w: %s: %s holds no %s (its session consumer holds retries in the session)", ErrUnknownEntity, r, in.entity, what)
	}
	if r.Entity == "" {
		if len(candidates) == 1 {
			return candidates[0], in.refOf(candidates[0], r.SequenceNumber), nil
		}
		qualified := make([]string, len(paths))
		for i, p := range paths {
			qualified[i] = Ref{Entity: p, SequenceNumber: r.SequenceNumber}.String()
		}
		return 0, r, fmt.Errorf("%w: a %s numbered %d could be in any of %s, which count sequence numbers each on their own; name one: %s",
			ErrAmbiguousRef, what, r.SequenceNumber, strings.Join(paths, " and "), strings.Join(qualified, " or "))
	}
	for i, p := range paths {
		if strings.EqualFold(r.Entity, p) {
			return candidates[i], in.refOf(candidates[i], r.SequenceNumber), nil
		}
	}
	return 0, r, fmt.Errorf("%w: %s: a %s of %s is in %s", ErrUnknownEntity, r, what, in.entity, strings.Join(paths, " or "))
}

// resolveAll resolves every ref (see resolve) and drops repeats; the first error stops it.
func (in *Inspector) resolveAll(refs []Ref, candidates []source, what string) ([]Ref, error) {
	out := make([]Ref, 0, len(refs))
	seen := make(map[Ref]bool, len(refs))
	for _, r := range refs {
		_, rr, err := in.resolve(r, candidates, what)
		if err != nil {
			return nil, err
		}
		if !seen[rr] {
			seen[rr] = true
			out = append(out, rr)
		}
	}
	return out, nil
}

// DeadLetterQueues returns the paths of the dead-letter queues the inspector reads, the entities a
// dead letter's [Ref] may name: the entity's own, then the retry queue's when that is another queue.
func (in *Inspector) DeadLetterQueues() []string { return in.paths(in.deadSources()) }

// RetryEntities returns the paths of the entities that hold the pending retries the inspector can
// cancel, the entities a pending retry's [Ref] may name: the queue itself, or the retry queue (also
// the queue, when a queue has a retry queue of its own); none for an entity a session consumer
// consumes ([Options.SessionConsumer]).
func (in *Inspector) RetryEntities() []string { return in.paths(in.cancelSources()) }

func (in *Inspector) paths(ss []source) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = in.sourcePath(s)
	}
	return out
}
