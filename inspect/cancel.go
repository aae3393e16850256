package inspect

import (
	"context"
	"fmt"
)

// PendingRetry returns the pending retry r names, checked exactly as [Inspector.Cancel] checks it, but
// changes nothing: it is the preview of a cancel (a dry run shows what the cancel would remove). It
// costs one peek of one message. Errors are those of Cancel.
func (in *Inspector) PendingRetry(ctx context.Context, r Ref) (*Pending, error) {
	_, p, err := in.pendingAt(ctx, r)
	return p, err
}

// Cancel cancels the pending retry r names, so it will never run, and returns what it was.
//
// r names the queue holding the copy (one of [Inspector.RetryEntities]; a Ref without an entity is
// accepted when there is only one) and the copy's sequence number there. Cancel first peeks that one
// message and refuses, with an error wrapping [ErrNotPending], unless it is a scheduled retry copy: a
// sequence number mistyped by one could otherwise name a live message or another producer's scheduled
// message. A number not in that queue returns [ErrNotFound]; a Ref that names no retry entity,
// [ErrUnknownEntity]; one without an entity where two qualify, [ErrAmbiguousRef].
//
// The copy is cancelled with CancelScheduledMessages on the queue that holds it. A copy that activates
// between the peek and the cancel cannot be cancelled any more; Service Bus then reports an error,
// returned wrapped, and the copy runs.
func (in *Inspector) Cancel(ctx context.Context, r Ref) (*Pending, error) {
	s, p, err := in.pendingAt(ctx, r)
	if err != nil {
		return nil, err
	}
	c, err := in.links.canceller(s)
	if err != nil {
		return nil, fmt.Errorf("inspect: opening a sender on %s: %w", p.Entity, err)
	}
	defer closeQuietly(ctx, c)
	err = in.observe(ctx, Call{Operation: OpCancelScheduled, Entity: p.Entity, MessageID: p.MessageID}, func(ctx context.Context) (int, error) {
		return 0, c.CancelScheduledMessages(ctx, []int64{p.SequenceNumber}, nil)
	})
	if err != nil {
		return nil, fmt.Errorf("inspect: cancelling %s: %w", p.Ref(), err)
	}
	return p, nil
}

// pendingAt resolves r among the retry entities and returns the pending retry there, refusing
// anything that is not a scheduled retry copy.
func (in *Inspector) pendingAt(ctx context.Context, r Ref) (source, *Pending, error) {
	s, rr, err := in.resolve(r, in.cancelSources(), "pending retry")
	if err != nil {
		return 0, nil, err
	}
	d, err := in.peekAt(ctx, s, rr)
	if err != nil {
		return 0, nil, err
	}
	switch {
	case !d.isScheduled():
		return 0, nil, fmt.Errorf("%w: %s is receivable or being processed, not scheduled", ErrNotPending, rr)
	case !d.isRetryCopy() || d.isProbe():
		return 0, nil, fmt.Errorf("%w: %s is a scheduled message without a retry envelope", ErrNotPending, rr)
	}
	p := d.pending(rr.Entity)
	return s, &p, nil
}
