package inspect

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/sbtest"
)

// observed is one call a recordingObserver saw: what StartCall was given and the result.
type observed struct {
	Call
	CallResult
}

type callKey struct{}

// recordingObserver records every call; the context it returns carries the operation under callKey,
// so that a call can check it runs in that context.
type recordingObserver struct {
	mu    sync.Mutex
	calls []observed
}

func (o *recordingObserver) StartCall(ctx context.Context, c Call) (context.Context, func(CallResult)) {
	return context.WithValue(ctx, callKey{}, c.Operation), func(r CallResult) {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.calls = append(o.calls, observed{Call: c, CallResult: r})
	}
}

func (o *recordingObserver) snapshot() []observed {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]observed(nil), o.calls...)
}

// Every peek request and the cancel of an Inspector reach its Observer, each with the entity it read
// and, for a peek, the number of messages it returned.
func TestObserverSeesEveryBrokerCall(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.Seed(t, "pending-1", "perm-1")
	obs := &recordingObserver{}
	in := h.inspector(t, &Options{Observer: obs})
	require.Same(t, obs, in.Observer())
	ctx := sbtest.Context(t)

	st, err := in.Status(ctx, "pending-1")
	require.NoError(t, err)
	require.Len(t, st.Pending, 1)
	peeks := obs.snapshot()
	// Each entity is read until an empty reply: the queue holds the pending copy, the dead-letter queue
	// the permanent failure.
	assert.Equal(t, []observed{
		{Call: Call{Operation: OpPeek, Entity: "orders"}, CallResult: CallResult{Messages: 1}},
		{Call: Call{Operation: OpPeek, Entity: "orders"}, CallResult: CallResult{Messages: 0}},
		{Call: Call{Operation: OpPeek, Entity: "orders/$DeadLetterQueue"}, CallResult: CallResult{Messages: 1}},
		{Call: Call{Operation: OpPeek, Entity: "orders/$DeadLetterQueue"}, CallResult: CallResult{Messages: 0}},
	}, peeks)

	p := st.Pending[0]
	_, err = in.Cancel(ctx, p.Ref())
	require.NoError(t, err)
	calls := obs.snapshot()[len(peeks):]
	require.Len(t, calls, 2, "the check's peek of one message, then the cancel")
	assert.Equal(t, observed{Call: Call{Operation: OpPeek, Entity: "orders"}, CallResult: CallResult{Messages: 1}}, calls[0])
	assert.Equal(t, observed{Call: Call{Operation: OpCancelScheduled, Entity: "orders", MessageID: p.MessageID}}, calls[1])

	// A failed call reports its error: the cancelled copy is gone, so cancelling it again fails at the
	// check's peek, which returns no message (not an error of the call itself).
	_, err = in.Cancel(ctx, p.Ref())
	require.ErrorIs(t, err, ErrNotFound)
	last := obs.snapshot()
	assert.Equal(t, OpPeek, last[len(last)-1].Operation)
	assert.NoError(t, last[len(last)-1].Err)
}

// Observe runs the call in the context StartCall returned, passes on the count and the error, and
// copes with an Observer that returns neither a context nor a function.
func TestObserve(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	obs := &recordingObserver{}
	var sawMarker bool
	err := Observe(context.Background(), obs, Call{Operation: OpSend, Entity: "orders", MessageID: "m-1"}, func(ctx context.Context) (int, error) {
		sawMarker = ctx.Value(callKey{}) == OpSend
		return 0, boom
	})
	require.ErrorIs(t, err, boom)
	assert.True(t, sawMarker, "the call runs in the Observer's context")
	assert.Equal(t, []observed{{Call: Call{Operation: OpSend, Entity: "orders", MessageID: "m-1"}, CallResult: CallResult{Err: boom}}}, obs.snapshot())

	ran := false
	require.NoError(t, Observe(context.Background(), nilObserver{}, Call{Operation: OpPeek}, func(ctx context.Context) (int, error) {
		ran = ctx != nil
		return 3, nil
	}))
	assert.True(t, ran)
	n := 0
	require.NoError(t, Observe(context.Background(), nil, Call{}, func(context.Context) (int, error) { n++; return 0, nil }))
	assert.Equal(t, 1, n, "no Observer: the call alone")
}

// nilObserver returns neither a context nor a function.
type nilObserver struct{}

func (nilObserver) StartCall(context.Context, Call) (context.Context, func(CallResult)) {
	return nil, nil
}
