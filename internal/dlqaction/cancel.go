package dlqaction

import (
	"context"
	"fmt"
	"slices"

	"github.com/sbretry/retry/inspect"
)

// PreviewCancel checks every ref with [inspect.Inspector.PendingRetry], which refuses a message that is
// not a scheduled retry copy, and returns the distinct pending retries in the order given: the preview
// of a cancel. The first error stops it; nothing is changed either way.
func PreviewCancel(ctx context.Context, in *inspect.Inspector, refs []inspect.Ref) ([]inspect.Pending, error) {
	var out []inspect.Pending
	for _, r := range refs {
		p, err := in.PendingRetry(ctx, r)
		if err != nil {
			return nil, err
		}
		if !slices.ContainsFunc(out, func(q inspect.Pending) bool { return q.Ref() == p.Ref() }) {
			out = append(out, *p)
		}
	}
	return out, nil
}

// Cancel cancels exactly the previewed pending retries, in order, stopping at the first failure, and
// returns how many it cancelled. Each is checked again by [inspect.Inspector.Cancel] before it is
// cancelled, and one whose MessageID is no longer the previewed one is refused with [ErrChanged]
// before anything is done with it.
func Cancel(ctx context.Context, in *inspect.Inspector, items []inspect.Pending) (int, error) {
	for i, p := range items {
		now, err := in.PendingRetry(ctx, p.Ref())
		if err != nil {
			return i, fmt.Errorf("cancel stopped after %d of %d: %w", i, len(items), err)
		}
		if now.MessageID != p.MessageID {
			return i, fmt.Errorf("cancel stopped after %d of %d: %w: %s is now %q, the preview showed %q", i, len(items), ErrChanged, p.Ref(), now.MessageID, p.MessageID)
		}
		if _, err := in.Cancel(ctx, p.Ref()); err != nil {
			return i, fmt.Errorf("cancel stopped after %d of %d: %w", i, len(items), err)
		}
	}
	return len(items), nil
}
