package inspect

import (
	"context"
	"fmt"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// Scan reports how much of one entity a call read.
type Scan struct {
	// Entity is the path read: the queue or subscription, the retry queue, or the dead-letter queue.
	Entity string
	// Peeked is the number of messages peeked from it (at most [Options.MaxPeek]).
	Peeked int
	// Requests is the number of peek requests made, the round trips the scan cost.
	Requests int
	// Truncated says the scan stopped at [Options.MaxPeek] before it saw the end of the entity, so
	// messages with higher sequence numbers were not read. An entity holding exactly MaxPeek messages
	// also reports Truncated: telling the two apart would take one more peek beyond the bound.
	Truncated bool
	// Foreign counts the messages of a retry queue (or its dead-letter queue) whose envelope names
	// another entity as the chain's source ([envelope.PropSource]): they belong to another consumer that
	// shares the queue, or [Options.RetryQueue] names the wrong queue. They are left out of every
	// answer, so that nothing acts on another entity's messages.
	Foreign int
}

// Truncated reports whether any of scans stopped at the bound.
func Truncated(scans []Scan) bool {
	for _, s := range scans {
		if s.Truncated {
			return true
		}
	}
	return false
}

// scan peeks the entity behind s in sequence-number order, from the first message, calling visit for
// each peeked message, until the entity has no more messages or MaxPeek messages were read. The
// position is passed explicitly on every request (FromSequenceNumber), so the receiver's own
// peek cursor plays no part and the scan can be repeated.
func (in *Inspector) scan(ctx context.Context, s source, visit func(decoded)) (Scan, error) {
	sc := Scan{Entity: in.sourcePath(s)}
	if s == sourceEntity && in.opts.SessionConsumer {
		// Service Bus refuses a receiver without a session on a session entity, so it cannot be
		// peeked as a whole; say so rather than answer for a place never read.
		return sc, fmt.Errorf("%w: %s can be read only session by session (ListHeldSessions; sbretry sessions list); its dead-letter queue reads as usual", ErrSessionEntity, sc.Entity)
	}
	p, err := in.links.peeker(s)
	if err != nil {
		return sc, fmt.Errorf("inspect: opening %s: %w", sc.Entity, err)
	}
	defer closeQuietly(ctx, p)
	from := int64(0)
	for {
		want := min(in.opts.PeekBatchSize, in.opts.MaxPeek-sc.Peeked)
		if want <= 0 {
			sc.Truncated = true
			return sc, nil
		}
		start := from
		var msgs []*azservicebus.ReceivedMessage
		err := in.observe(ctx, Call{Operation: OpPeek, Entity: sc.Entity}, func(ctx context.Context) (int, error) {
			var err error
			msgs, err = p.PeekMessages(ctx, want, &azservicebus.PeekMessagesOptions{FromSequenceNumber: &start})
			return len(msgs), err
		})
		sc.Requests++
		if err != nil {
			return sc, fmt.Errorf("inspect: peeking %s from sequence number %d: %w", sc.Entity, from, err)
		}
		// An empty reply is the end of the entity. A short one is not: Service Bus caps replies by size.
		if len(msgs) == 0 {
			return sc, nil
		}
		for _, m := range msgs[:min(len(msgs), want)] {
			sc.Peeked++
			if m.SequenceNumber != nil && *m.SequenceNumber >= from {
				from = *m.SequenceNumber + 1
			}
			d := decode(m)
			if in.foreign(s, d) {
				sc.Foreign++
				continue
			}
			visit(d)
		}
		if from == start {
			// No sequence number moved us forward: asking again would return the same messages.
			return sc, fmt.Errorf("inspect: peeking %s: reply without sequence numbers beyond %d", sc.Entity, start)
		}
	}
}

// foreign reports a message of a separate retry queue (or its dead-letter queue) whose chain started on
// another entity than the inspected one. Messages without a source (a resubmission, a retry copy
// without sbretry-source) are the entity's.
func (in *Inspector) foreign(s source, d decoded) bool {
	if s != sourceRetryQueue && s != sourceRetryDeadLetter {
		return false
	}
	return d.envErr == nil && d.env.Source != "" && !strings.EqualFold(d.env.Source, in.entity.Path())
}

// peekAt returns the decoded message r names in the entity behind s: an error wrapping [ErrNotFound]
// when there is none, [ErrOtherEntity] when it belongs to another entity's chain (see [Scan.Foreign]).
func (in *Inspector) peekAt(ctx context.Context, s source, r Ref) (decoded, error) {
	m, err := in.peekOne(ctx, s, r.SequenceNumber)
	if err != nil {
		return decoded{}, err
	}
	d := decode(m)
	if in.foreign(s, d) {
		return decoded{}, fmt.Errorf("%w: %s belongs to a chain of %s, not of %s (is the retry queue shared, or the wrong one?)", ErrOtherEntity, r, d.env.Source, in.entity)
	}
	return d, nil
}

// peekOne returns the message with sequence number seq in the entity behind s, or an error wrapping
// [ErrNotFound].
func (in *Inspector) peekOne(ctx context.Context, s source, seq int64) (*azservicebus.ReceivedMessage, error) {
	path := in.sourcePath(s)
	if s == sourceEntity && in.opts.SessionConsumer {
		return nil, fmt.Errorf("%w: %s can be read only session by session (ListHeldSessions; sbretry sessions list)", ErrSessionEntity, path)
	}
	p, err := in.links.peeker(s)
	if err != nil {
		return nil, fmt.Errorf("inspect: opening %s: %w", path, err)
	}
	defer closeQuietly(ctx, p)
	var msgs []*azservicebus.ReceivedMessage
	err = in.observe(ctx, Call{Operation: OpPeek, Entity: path}, func(ctx context.Context) (int, error) {
		var err error
		msgs, err = p.PeekMessages(ctx, 1, &azservicebus.PeekMessagesOptions{FromSequenceNumber: &seq})
		return len(msgs), err
	})
	if err != nil {
		return nil, fmt.Errorf("inspect: peeking %s: %w", Ref{Entity: path, SequenceNumber: seq}, err)
	}
	if len(msgs) == 0 || msgs[0].SequenceNumber == nil || *msgs[0].SequenceNumber != seq {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, Ref{Entity: path, SequenceNumber: seq})
	}
	return msgs[0], nil
}
