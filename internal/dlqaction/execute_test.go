package dlqaction

import (
	"context"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/sbtest"
)

func newInspector(t *testing.T, h *sbtest.Harness) *inspect.Inspector {
	t.Helper()
	in, err := inspect.New(h.Client, h.Entity, &inspect.Options{RetryQueue: h.RetryQueue})
	require.NoError(t, err)
	return in
}

// TestRedriveExecutesThePlan: select, plan, execute resubmits exactly the planned dead letters with the
// previewed MessageIDs and reports each done.
func TestRedriveExecutesThePlan(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1", "perm-2", "max-1")
	in := newInspector(t, h)
	ctx := sbtest.Context(t)
	sel, err := Select(ctx, in, inspect.DeadLetterFilter{Reason: "RetryPermanentFailure"})
	require.NoError(t, err)
	plan := NewRedrivePlan(sel, sbtest.Queue, 0)
	require.Len(t, plan.Items, 2)
	var warned []string
	done, err := Execute(ctx, h.Client, in, plan, &Options{Warn: func(m string) { warned = append(warned, m) }})
	require.NoError(t, err)
	assert.Equal(t, 2, done)
	assert.Equal(t, 2, plan.Done())
	assert.Empty(t, warned)
	assert.Equal(t, 1, h.Stats(t).DeadLettered, "max-1 was not planned")
	st := h.Stats(t)
	assert.Equal(t, 2, st.Active)
}

// TestExecuteRefusesAChangedDeadLetter: a dead letter whose MessageID is not the one previewed is
// refused, nothing is sent, and it stays.
func TestExecuteRefusesAChangedDeadLetter(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1")
	in := newInspector(t, h)
	ctx := sbtest.Context(t)
	sel, err := Select(ctx, in, inspect.DeadLetterFilter{})
	require.NoError(t, err)
	plan := NewPurgePlan(sel)
	require.Len(t, plan.Items, 1)
	plan.Items[0].DeadLetter.MessageID = "someone-else"
	done, err := Execute(ctx, h.Client, in, plan, nil)
	require.ErrorIs(t, err, ErrChanged)
	assert.Equal(t, 0, done)
	assert.False(t, plan.Items[0].Done)
	assert.Equal(t, 1, h.Stats(t).DeadLettered)
}

// TestCancelRefusesAChangedPendingRetry: the real cancel re-checks each previewed pending retry.
func TestCancelRefusesAChangedPendingRetry(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "pending-1", "pending-2")
	in := newInspector(t, h)
	ctx := sbtest.Context(t)
	page, err := in.ListPending(ctx, inspect.PageOptions{})
	require.NoError(t, err)
	require.Len(t, page.Items, 2)
	items, err := PreviewCancel(ctx, in, []inspect.Ref{page.Items[0].Ref(), page.Items[1].Ref(), page.Items[0].Ref()})
	require.NoError(t, err)
	require.Len(t, items, 2, "repeats dropped")
	items[1].MessageID = "not-it"
	done, err := Cancel(ctx, in, items)
	require.ErrorIs(t, err, ErrChanged)
	assert.Equal(t, 1, done)
	assert.ErrorContains(t, err, "cancel stopped after 1 of 2")
	left, err := in.ListPending(ctx, inspect.PageOptions{})
	require.NoError(t, err)
	assert.Len(t, left.Items, 1)
}

func TestTarget(t *testing.T) {
	t.Parallel()
	sub, err := inspect.ParseEntity("events/Subscriptions/billing")
	require.NoError(t, err)
	q, err := inspect.ParseEntity("orders")
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		e    inspect.Entity
		to   string
		want string
		err  error
	}{
		{"queue default", q, "", "orders", nil},
		{"queue elsewhere", q, "other", "other", nil},
		{"subscription needs a queue", sub, "", "", ErrRedriveToTopic},
		{"subscription topic refused", sub, "EVENTS", "", ErrRedriveToTopic},
		{"subscription to its retry queue", sub, "billing-retry", "billing-retry", nil},
		{"a path is no queue", q, "a/Subscriptions/b", "", ErrInvalidTarget},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Target(tc.e, tc.to)
			if tc.err != nil {
				assert.ErrorIs(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestExecuteValidates(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	in := newInspector(t, h)
	ctx := sbtest.Context(t)
	empty := &Selection{}
	_, err := Execute(ctx, h.Client, in, NewPurgePlan(empty), &Options{Wait: -1})
	assert.ErrorContains(t, err, "Wait")
	_, err = Execute(ctx, h.Client, in, NewRedrivePlan(empty, "", 0), nil)
	assert.ErrorContains(t, err, "without a target")
	_, err = Execute(ctx, h.Client, in, &Plan{Action: "copy"}, nil)
	assert.ErrorContains(t, err, "unknown action")
	done, err := Execute(ctx, h.Client, in, NewPurgePlan(empty), nil)
	assert.NoError(t, err)
	assert.Equal(t, 0, done)
}

// TestExecuteWarnsAboutDeadLettersThatLeft: a planned dead letter removed before the run is a warning,
// not an error, so a re-run after a partial one succeeds.
func TestExecuteWarnsAboutDeadLettersThatLeft(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1", "perm-2")
	in := newInspector(t, h)
	ctx := sbtest.Context(t)
	sel, err := Select(ctx, in, inspect.DeadLetterFilter{})
	require.NoError(t, err)
	// Someone else takes the first dead letter: one message, so no other is locked on the way.
	other, err := h.Client.NewReceiverForQueue(sbtest.Queue, &azservicebus.ReceiverOptions{
		SubQueue: azservicebus.SubQueueDeadLetter, ReceiveMode: azservicebus.ReceiveModeReceiveAndDelete})
	require.NoError(t, err)
	taken, err := other.ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	require.Len(t, taken, 1)
	require.Equal(t, sel.Items[0].SequenceNumber, *taken[0].SequenceNumber)
	require.NoError(t, other.Close(ctx))
	var warned []string
	var progress []int
	plan := NewPurgePlan(sel)
	done, err := Execute(ctx, h.Client, in, plan, &Options{Wait: 200 * time.Millisecond,
		Warn: func(m string) { warned = append(warned, m) }, Progress: func(d int) { progress = append(progress, d) }})
	require.NoError(t, err)
	assert.Equal(t, 1, done)
	require.Len(t, warned, 1)
	assert.Contains(t, warned[0], "1 selected dead letters left orders/$DeadLetterQueue meanwhile")
	assert.Equal(t, []int{1}, progress)
	assert.Equal(t, []inspect.Ref{sel.Items[0].Ref(), sel.Items[1].Ref()}, plan.Refs())
	assert.Equal(t, []string{"orders/$DeadLetterQueue"}, plan.Entities())
}

// TestExecuteRefusesDuplicateResubmitIDs: two dead letters with the same sequence number and MessageID
// in two dead-letter queues would be resubmitted with one MessageID; duplicate detection would drop
// the second send while its dead letter was completed. The plan is refused before anything is done.
func TestExecuteRefusesDuplicateResubmitIDs(t *testing.T) {
	t.Parallel()
	seq := int64(1)
	dead := func(entity string) inspect.DeadLetter {
		return inspect.DeadLetter{Entity: entity, SequenceNumber: seq, MessageID: "same",
			Message: &azservicebus.ReceivedMessage{MessageID: "same", SequenceNumber: &seq}}
	}
	sel := &Selection{Items: []inspect.DeadLetter{dead("events/Subscriptions/billing/$DeadLetterQueue"), dead("billing-retry/$DeadLetterQueue")}}
	p := NewRedrivePlan(sel, "billing-retry", 0)
	require.Equal(t, p.Items[0].ResubmitID, p.Items[1].ResubmitID)
	done, err := Execute(context.Background(), nil, nil, p, nil)
	assert.ErrorIs(t, err, ErrDuplicateResubmit)
	assert.Equal(t, 0, done)
	assert.False(t, p.Items[0].Sent || p.Items[1].Sent)
}
