package retryindex

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/internal/sbtest"
)

// runConsumer runs a real retry.Consumer on the harness's queue with hooks until every message in ids
// satisfy done, then stops it; sbtest.StartConsumer would replace the OnProcessed hook the recorder
// needs, so this starts its own, which calls the given OnProcessed and then collects the outcome.
func runConsumer(t *testing.T, h *sbtest.Harness, handler retry.Handler, opts retry.Options, done func([]retry.ProcessedParams) bool) []retry.ProcessedParams {
	t.Helper()
	connect, err := retry.NewNamespace(h.Em.ConnectionString(), &retry.ConnectOptions{Client: &azservicebus.ClientOptions{RetryOptions: sbtest.FastRetries}}).Queue(sbtest.Queue)
	require.NoError(t, err)
	out := sbtest.NewOutcomes()
	if rec := opts.Hooks.OnProcessed; rec != nil {
		opts.Hooks.OnProcessed = func(p retry.ProcessedParams) { rec(p); out.Hook(p) }
	} else {
		opts.Hooks.OnProcessed = out.Hook
	}
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	opts.SettleTimeout = 5 * time.Second
	c, err := retry.NewConsumer(connect, handler, &opts)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	out.WaitFor(t, "the outcomes", done)
	cancel()
	require.NoError(t, <-ran)
	return out.Snapshot()
}

// TestConsumerFeedAnswersWhenDue runs a real consumer through the SDK and the emulator, with the
// recorder composed into its hooks: one message fails (retried in an hour), one fails permanently, one
// succeeds. The index must say when the retry is due, exactly as a peek of the broker does, and tell
// the other two apart, each with its history.
func TestConsumerFeedAnswersWhenDue(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	s, _ := openTemp(t, nil)
	r, err := NewRecorder(s, &RecorderOptions{Process: "consumer-1", RecordFirstAttempts: true})
	require.NoError(t, err)
	corr := "corr-1"
	flaky := sbtest.Message("order-1")
	flaky.CorrelationID = &corr
	h.Send(t, flaky, sbtest.Message("poison-1"), sbtest.Message("fine-1"))
	ps := runConsumer(t, h, func(_ context.Context, m *azservicebus.ReceivedMessage) error {
		switch m.MessageID {
		case "order-1":
			return sbtest.ErrDownstream
		case "poison-1":
			return retry.Permanent(sbtest.ErrDownstream)
		}
		return nil
	}, retry.Options{
		Backoff:        backoff.Constant{Interval: time.Hour},
		IdempotencyKey: func(m *azservicebus.ReceivedMessage) string { return "key-" + m.MessageID },
		Hooks:          r.Hooks(retry.Hooks{}),
	}, func(ps []retry.ProcessedParams) bool { return len(ps) >= 3 })
	require.NoError(t, r.Close(sbtest.Context(t)))
	t.Logf("recorder: %+v", r.Stats())
	retried, ok := sbtest.Result(ps, "order-1", retry.OutcomeRetryScheduled)
	require.True(t, ok, sbtest.Summarize(ps))

	// The broker's answer: a peek of the queue finds the scheduled copy.
	ctx := sbtest.Context(t)
	peeker, err := h.Client.NewReceiverForQueue(sbtest.Queue, nil)
	require.NoError(t, err)
	defer func() { _ = peeker.Close(ctx) }()
	from := int64(0)
	msgs, err := peeker.PeekMessages(ctx, 10, &azservicebus.PeekMessagesOptions{FromSequenceNumber: &from})
	require.NoError(t, err)
	var copyMsg *azservicebus.ReceivedMessage
	for _, m := range msgs {
		if m.MessageID == retried.RetryMessageID {
			copyMsg = m
		}
	}
	require.NotNil(t, copyMsg, "the broker holds the retry copy")
	require.NotNil(t, copyMsg.ScheduledEnqueueTime)

	for _, id := range []string{"order-1", "key-order-1", "corr-1", retried.RetryMessageID} {
		ans, err := s.Lookup(ctx, id, nil)
		require.NoError(t, err)
		require.Len(t, ans.Events, 1, id)
		e := ans.Events[0]
		assert.Equal(t, StatePending, e.State, id)
		assert.Equal(t, 2, e.Attempt)
		assert.True(t, copyMsg.ScheduledEnqueueTime.Truncate(time.Millisecond).Equal(e.Due), "index %v, broker %v", e.Due, *copyMsg.ScheduledEnqueueTime)
		assert.Equal(t, *copyMsg.SequenceNumber, e.SequenceNumber)
		assert.Equal(t, sbtest.Queue, e.Entity)
		assert.Equal(t, retried.RetryMessageID, e.RetryMessageID())
		assert.Equal(t, sbtest.ErrDownstream.Error(), e.LastError)
		require.Len(t, e.History, 1)
		assert.Equal(t, "consumer-1", e.History[0].Process)
	}
	page, err := s.Pending(ctx, nil)
	require.NoError(t, err)
	require.Len(t, page.Items, 1)
	assert.EqualValues(t, 1, page.Total)

	ans, err := s.Lookup(ctx, "poison-1", nil)
	require.NoError(t, err)
	require.Len(t, ans.Events, 1)
	assert.Equal(t, StateDeadLettered, ans.Events[0].State)
	assert.NotEmpty(t, ans.Events[0].Reason)
	ans, err = s.Lookup(ctx, "fine-1", nil)
	require.NoError(t, err)
	require.Len(t, ans.Events, 1)
	assert.Equal(t, StateSucceeded, ans.Events[0].State)
	c, err := s.Counts(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, map[State]int64{StatePending: 1, StateDeadLettered: 1, StateSucceeded: 1}, c.ByState)
}
