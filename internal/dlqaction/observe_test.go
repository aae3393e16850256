package dlqaction

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/sbtest"
)

// call is one call a recorder saw.
type call struct {
	inspect.Call
	inspect.CallResult
}

// recorder is an inspect.Observer that records every call, in the order the calls ended.
type recorder struct {
	mu    sync.Mutex
	calls []call
}

func (r *recorder) StartCall(ctx context.Context, c inspect.Call) (context.Context, func(inspect.CallResult)) {
	return ctx, func(res inspect.CallResult) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.calls = append(r.calls, call{Call: c, CallResult: res})
	}
}

// ops returns the calls other than peeks (the selection's and the leftover checks').
func (r *recorder) ops() []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(r.calls), func(c call) bool { return c.Operation == inspect.OpPeek })
}

func observedInspector(t *testing.T, h *sbtest.Harness) (*inspect.Inspector, *recorder) {
	t.Helper()
	rec := &recorder{}
	in, err := inspect.New(h.Client, h.Entity, &inspect.Options{RetryQueue: h.RetryQueue, Observer: rec})
	require.NoError(t, err)
	return in, rec
}

// A redrive reports its receives and abandons on the dead-letter queue, each fresh delivery's send to
// the target (with its properties, for the trace context) before the complete of its dead letter.
func TestRedriveReportsEveryCallToTheObserver(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1", "perm-2", "max-1")
	in, rec := observedInspector(t, h)
	ctx := sbtest.Context(t)
	sel, err := Select(ctx, in, inspect.DeadLetterFilter{Reason: "RetryPermanentFailure"})
	require.NoError(t, err)
	plan := NewRedrivePlan(sel, sbtest.Queue, 0)
	require.Len(t, plan.Items, 2)
	_, err = Execute(ctx, h.Client, in, plan, nil)
	require.NoError(t, err)

	const dlq = sbtest.Queue + "/$DeadLetterQueue"
	ops := rec.ops()
	received := 0
	var sent, completed []string
	for _, c := range ops {
		assert.NoError(t, c.Err, "%s", c.Operation)
		switch c.Operation {
		case inspect.OpReceive:
			assert.Equal(t, dlq, c.Entity)
			received += c.Messages
		case inspect.OpSend:
			assert.Equal(t, sbtest.Queue, c.Entity)
			assert.Equal(t, "acme", c.Properties["tenant"], "the fresh delivery's properties, for its trace context")
			sent = append(sent, c.MessageID)
		case inspect.OpComplete:
			assert.Equal(t, dlq, c.Entity)
			assert.Len(t, completed, len(sent)-1, "each complete follows its send")
			completed = append(completed, c.MessageID)
		case inspect.OpAbandon:
			assert.Equal(t, dlq, c.Entity, "max-1, received on the way")
		default:
			t.Errorf("unexpected operation %q", c.Operation)
		}
	}
	assert.GreaterOrEqual(t, received, 2)
	var wantSent, wantCompleted []string
	for _, it := range plan.Items {
		wantSent = append(wantSent, it.ResubmitID)
		wantCompleted = append(wantCompleted, it.DeadLetter.MessageID)
	}
	assert.ElementsMatch(t, wantSent, sent)
	assert.ElementsMatch(t, wantCompleted, completed)
}

// A receive that waits its whole wait without a message (the planned dead letter was purged
// meanwhile) is reported as a receive of nothing, not as a failure.
func TestPurgeReportsAnEmptyReceiveWithoutError(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1")
	in, rec := observedInspector(t, h)
	ctx := sbtest.Context(t)
	sel, err := Select(ctx, in, inspect.DeadLetterFilter{})
	require.NoError(t, err)
	plan := NewPurgePlan(sel)
	require.Len(t, plan.Items, 1)

	// Someone else purges it first.
	other, err := h.Client.NewReceiverForQueue(sbtest.Queue, &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	require.NoError(t, err)
	msgs, err := other.ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.NoError(t, other.CompleteMessage(ctx, msgs[0], nil))
	require.NoError(t, other.Close(ctx))

	var warned []string
	done, err := Execute(ctx, h.Client, in, plan, &Options{Wait: 200 * time.Millisecond, Warn: func(m string) { warned = append(warned, m) }})
	require.NoError(t, err)
	assert.Equal(t, 0, done)
	assert.Len(t, warned, 1, "gone meanwhile")
	assert.Equal(t, []call{{Call: inspect.Call{Operation: inspect.OpReceive, Entity: sbtest.Queue + "/$DeadLetterQueue"}}}, rec.ops())
}
