package inspect

import (
	"context"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/internal/sbtest"
)

func TestCancelPendingRetry(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.Send(t, sbtest.Message("cancel-1"), sbtest.Message("keep-1"))
	c := h.StartConsumer(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom },
		retry.Options{Backoff: backoff.Constant{Interval: time.Hour}, MaxConcurrency: 4})
	c.Out.WaitFor(t, "two retries", func(ps []retry.ProcessedParams) bool {
		return sbtest.CountOutcome(ps, retry.OutcomeRetryScheduled) >= 2
	})
	c.Stop()
	h.Send(t, sbtest.Message("ready-1")) // receivable: not pending
	ps := c.Out.Snapshot()
	target, ok := sbtest.Result(ps, "cancel-1", retry.OutcomeRetryScheduled)
	require.True(t, ok)

	in := h.inspector(t, nil)
	ctx := sbtest.Context(t)
	require.Equal(t, 2, h.Stats(t).Scheduled)

	got, err := in.Cancel(ctx, Ref{SequenceNumber: target.SequenceNumber})
	require.NoError(t, err)
	assert.Equal(t, target.RetryMessageID, got.MessageID)
	assert.Equal(t, 2, got.Attempt)
	assert.Equal(t, 1, h.Stats(t).Scheduled, "only keep-1's copy is left")
	st, err := in.Status(ctx, "cancel-1")
	require.NoError(t, err)
	assert.Empty(t, st.Pending)

	_, err = in.Cancel(ctx, Ref{SequenceNumber: target.SequenceNumber})
	assert.ErrorIs(t, err, ErrNotFound, "cancelled already")

	ready, err := in.Status(ctx, "ready-1")
	require.NoError(t, err)
	require.Len(t, ready.Active, 1)
	_, err = in.Cancel(ctx, ready.Active[0].Ref())
	assert.ErrorIs(t, err, ErrNotPending, "a receivable copy is never cancelled")
	assert.Equal(t, 1, h.Stats(t).Active)
}

// TestCancelRefusesForeignScheduledMessage: a producer's own scheduled message is not a retry.
func TestCancelRefusesForeignScheduledMessage(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := sbtest.Context(t)
	s, err := h.Client.NewSender(sbtest.Queue, nil)
	require.NoError(t, err)
	defer func() { _ = s.Close(ctx) }()
	seqs, err := s.ScheduleMessages(ctx, []*azservicebus.Message{sbtest.Message("newsletter")}, time.Now().Add(time.Hour), nil)
	require.NoError(t, err)
	in := h.inspector(t, nil)
	_, err = in.Cancel(ctx, Ref{Entity: sbtest.Queue, SequenceNumber: seqs[0]})
	assert.ErrorIs(t, err, ErrNotPending)
	assert.Equal(t, 1, h.Stats(t).Scheduled)

	page, err := in.ListPending(ctx, PageOptions{})
	require.NoError(t, err)
	assert.Empty(t, page.Items, "not a retry copy")
	st, err := in.Status(ctx, "newsletter")
	require.NoError(t, err)
	assert.Len(t, st.Pending, 1, "but Status shows what is scheduled under that id")
}
