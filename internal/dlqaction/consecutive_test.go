package dlqaction

import (
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/sbtest"
)

// TestConsecutiveRedrivesOfDifferentSelectionsBothAct: a redrive receives the dead letters before the
// one it selected and gives them back; a second redrive right after, of one of those, finds it
// receivable (nothing left locked by the first run's receiver) and acts. Each run leaves no lock
// behind in the dead-letter queue once Execute returned, and the one never selected is purged last.
func TestConsecutiveRedrivesOfDifferentSelectionsBothAct(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1", "perm-2", "perm-3", "perm-4")
	in := newInspector(t, h)
	ctx := sbtest.Context(t)
	dlq, ok := h.Em.Broker().Queue(sbtest.Queue + "/$DeadLetterQueue")
	require.True(t, ok)
	all, err := Select(ctx, in, inspect.DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, all.Items, 4)

	// Each selection is one dead letter behind others, which the drain receives on its way and must
	// give back: the last one, then the first, then the third.
	for i, pick := range []int{3, 0, 2} {
		ref := all.Items[pick].Ref()
		sel, err := Select(ctx, in, inspect.DeadLetterFilter{Refs: []inspect.Ref{ref}})
		require.NoError(t, err)
		require.Len(t, sel.Items, 1, "run %d: %s", i, ref)
		plan := NewRedrivePlan(sel, sbtest.Queue, 0)
		done, err := Execute(ctx, h.Client, in, plan, nil)
		require.NoError(t, err, "run %d: %s", i, ref)
		assert.Equal(t, 1, done, "run %d", i)
		assert.Zero(t, dlq.Stats().Locked, "run %d: the dead letters received on the way were given back", i)
	}
	assert.Equal(t, 3, h.Stats(t).Active)

	// The one every run received on its way and gave back is purged at once.
	sel, err := Select(ctx, in, inspect.DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, sel.Items, 1)
	assert.Equal(t, all.Items[1].Ref(), sel.Items[0].Ref())
	done, err := Execute(ctx, h.Client, in, NewPurgePlan(sel), nil)
	require.NoError(t, err)
	assert.Equal(t, 1, done)
	assert.Zero(t, h.Stats(t).DeadLettered)
}

// TestARunWhoseSelectionLeftGivesBackWhatItReceived: a purge whose selected dead letter left the
// queue meanwhile waits for it in vain, with the credit of that receive still on the link; the dead
// letter it received on the way is given back once its receiver is closed, by lock token, so none is
// left locked and the next action takes it at once.
func TestARunWhoseSelectionLeftGivesBackWhatItReceived(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1", "perm-2")
	in := newInspector(t, h)
	ctx := sbtest.Context(t)
	dlq, ok := h.Em.Broker().Queue(sbtest.Queue + "/$DeadLetterQueue")
	require.True(t, ok)
	all, err := Select(ctx, in, inspect.DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, all.Items, 2)
	gone := all.Items[1]
	sel, err := Select(ctx, in, inspect.DeadLetterFilter{Refs: []inspect.Ref{gone.Ref()}})
	require.NoError(t, err)
	require.Len(t, sel.Items, 1)

	// Someone else purges the selected one: received in sequence order, perm-1 is given back.
	other, err := h.Client.NewReceiverForQueue(sbtest.Queue, &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	require.NoError(t, err)
	var got []*azservicebus.ReceivedMessage
	for len(got) < 2 {
		msgs, err := other.ReceiveMessages(ctx, 2-len(got), nil)
		require.NoError(t, err)
		got = append(got, msgs...)
	}
	for _, m := range got {
		if *m.SequenceNumber == gone.SequenceNumber {
			require.NoError(t, other.CompleteMessage(ctx, m, nil))
		} else {
			require.NoError(t, other.AbandonMessage(ctx, m, nil))
		}
	}
	require.NoError(t, other.Close(ctx))
	require.Zero(t, dlq.Stats().Locked)

	var warned []string
	done, err := Execute(ctx, h.Client, in, NewPurgePlan(sel), &Options{Wait: 300 * time.Millisecond, Warn: func(m string) { warned = append(warned, m) }})
	require.NoError(t, err)
	assert.Zero(t, done)
	require.Len(t, warned, 1)
	assert.Contains(t, warned[0], "left orders/$DeadLetterQueue meanwhile")
	assert.Zero(t, dlq.Stats().Locked, "perm-1, received on the way, was given back")

	sel, err = Select(ctx, in, inspect.DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, sel.Items, 1)
	done, err = Execute(ctx, h.Client, in, NewPurgePlan(sel), nil)
	require.NoError(t, err)
	assert.Equal(t, 1, done)
	assert.Zero(t, h.Stats(t).DeadLettered)
}
