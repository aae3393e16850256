package inspect

import (
	"context"
	"fmt"
)

// Cancel cancels the pending retry with sequence number seq, so it will never run, and returns what
// it was. It first peeks that one message and refuses, with an error wrapping [ErrNotPending], unless
// it is a scheduled retry copy: a sequence number mistyped by one could otherwise name a live message
// or another producer's scheduled message. An unknown number returns [ErrNotFound].
//
// The copy is cancelled with CancelScheduledMessages on the entity that holds it: the queue, or
// [Options.RetryQueue] (required for a subscription, else [ErrNoRetryQueue]). A copy that activates
// between the peek and the cancel cannot be cancelled any more; Service Bus then reports an error,
// returned wrapped, and the copy runs.
func (in *Inspector) Cancel(ctx context.Context, seq int64) (*Pending, error) {
	if in.retryQueue() == "" {
		return nil, fmt.Errorf("%w %s: set Options.RetryQueue to the queue the consumer republishes to", ErrNoRetryQueue, in.entity)
	}
	s := sourceEntity
	if in.separateRetryQueue() {
		s = sourceRetryQueue
	}
	m, err := in.peekOne(ctx, s, seq)
	if err != nil {
		return nil, err
	}
	d := decode(m)
	switch {
	case !d.isScheduled():
		return nil, fmt.Errorf("%w: sequence number %d in %s is receivable or being processed, not scheduled", ErrNotPending, seq, in.sourcePath(s))
	case !d.isRetryCopy() || d.isProbe():
		return nil, fmt.Errorf("%w: sequence number %d in %s is a scheduled message without a retry envelope", ErrNotPending, seq, in.sourcePath(s))
	}
	c, err := in.links.canceller()
	if err != nil {
		return nil, fmt.Errorf("inspect: opening a sender on %s: %w", in.retryQueue(), err)
	}
	defer closeQuietly(ctx, c)
	if err := c.CancelScheduledMessages(ctx, []int64{seq}, nil); err != nil {
		return nil, fmt.Errorf("inspect: cancelling sequence number %d in %s: %w", seq, in.retryQueue(), err)
	}
	p := d.pending(in.sourcePath(s))
	return &p, nil
}
