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
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/sbtest"
)

// TestStatusPendingAndDeadLetter drives a real retry flow through the SDK and the emulator: one message
// fails (a retry is scheduled an hour ahead), one fails permanently (dead-lettered), one succeeds. Status
// must find each by every name the brief lists.
func TestStatusPendingAndDeadLetter(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	flaky := sbtest.Message("order-1")
	flaky.CorrelationID = ptr("corr-1")
	h.Send(t, flaky, sbtest.Message("poison-1"), sbtest.Message("fine-1"))
	c := h.StartConsumer(t, func(_ context.Context, m *azservicebus.ReceivedMessage) error {
		switch m.MessageID {
		case "order-1":
			return errBoom
		case "poison-1":
			return retry.Permanent(errBoom)
		}
		return nil
	}, retry.Options{
		Backoff:        backoff.Constant{Interval: time.Hour},
		IdempotencyKey: func(m *azservicebus.ReceivedMessage) string { return "key-" + m.MessageID },
	})
	c.Out.WaitFor(t, "retry, dead letter and success", func(ps []retry.ProcessedParams) bool {
		return len(ps) >= 3
	})
	c.Stop()
	ps := c.Out.Snapshot()
	retried, ok := sbtest.Result(ps, "order-1", retry.OutcomeRetryScheduled)
	require.True(t, ok)
	_, ok = sbtest.Result(ps, "poison-1", retry.OutcomeDeadLettered)
	require.True(t, ok)

	in := h.inspector(t, nil)
	ctx := sbtest.Context(t)
	for _, id := range []string{"order-1", "key-order-1", "corr-1", retried.RetryMessageID} {
		t.Run("pending by "+id, func(t *testing.T) {
			st, err := in.Status(ctx, id)
			require.NoError(t, err)
			require.Len(t, st.Pending, 1, "%+v", st)
			assert.Empty(t, st.Active)
			assert.Empty(t, st.DeadLetters)
			p := st.Pending[0]
			assert.Equal(t, sbtest.Queue, p.Entity)
			assert.Equal(t, 2, p.Attempt)
			assert.Equal(t, errBoom.Error(), p.LastError)
			assert.Equal(t, retried.SequenceNumber, p.SequenceNumber)
			assert.Equal(t, retried.RetryMessageID, p.MessageID)
			assert.WithinDuration(t, retried.ScheduledFor, p.DueTime, time.Millisecond)
			assert.Equal(t, "key-order-1", p.Envelope.Key)
			assert.Equal(t, "corr-1", p.Envelope.CorrelationID)
			assert.False(t, st.Truncated())
		})
	}

	st, err := in.Status(ctx, "poison-1")
	require.NoError(t, err)
	assert.Empty(t, st.Pending)
	require.Len(t, st.DeadLetters, 1)
	dl := st.DeadLetters[0]
	assert.Equal(t, "RetryPermanentFailure", dl.Reason)
	assert.Equal(t, errBoom.Error(), dl.Description)
	assert.Equal(t, errBoom.Error(), dl.LastError)
	assert.Equal(t, 1, dl.Attempt)
	assert.Equal(t, sbtest.Queue+"/$DeadLetterQueue", dl.Entity)
	assert.WithinDuration(t, time.Now(), dl.DeadLetteredAt, sbtest.Timeout)
	assert.Equal(t, sbtest.Queue, dl.Source)
	require.NotNil(t, dl.Message)
	assert.JSONEq(t, `{"id":"poison-1"}`, string(dl.Message.Body))

	st, err = in.Status(ctx, "fine-1")
	require.NoError(t, err)
	assert.Empty(t, st.Pending)
	assert.Empty(t, st.Active)
	assert.Empty(t, st.DeadLetters)
	require.Len(t, st.Scans, 2)
	assert.Equal(t, Scan{Entity: sbtest.Queue, Peeked: 1, Requests: 2}, st.Scans[0], "the pending copy only: the probe was cancelled")
	assert.Equal(t, Scan{Entity: sbtest.Queue + "/$DeadLetterQueue", Peeked: 1, Requests: 2}, st.Scans[1])

	_, err = in.Status(ctx, "")
	assert.ErrorIs(t, err, ErrEmptyID)
}

// TestStatusActiveWhileProcessing shows copies being processed: the first delivery and then the retry
// copy are each held in the handler while Status looks.
func TestStatusActiveWhileProcessing(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	entered := make(chan int)
	release := make(chan struct{})
	h.Send(t, sbtest.Message("busy-1"))
	c := h.StartConsumer(t, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
		env, _ := envelope.FromContext(ctx)
		entered <- env.Attempt
		<-release
		if env.Attempt == 1 {
			return errBoom
		}
		return nil
	}, retry.Options{Backoff: backoff.Constant{Interval: 10 * time.Millisecond}})
	in := h.inspector(t, nil)
	ctx := sbtest.Context(t)
	for attempt := 1; attempt <= 2; attempt++ {
		select {
		case got := <-entered:
			require.Equal(t, attempt, got)
		case <-ctx.Done():
			t.Fatal("handler not entered")
		}
		st, err := in.Status(ctx, "busy-1")
		require.NoError(t, err)
		assert.Empty(t, st.Pending)
		require.Len(t, st.Active, 1, "attempt %d", attempt)
		a := st.Active[0]
		assert.Equal(t, attempt, a.Attempt)
		assert.Positive(t, a.DeliveryCount, "peek counts the delivery that holds the lock")
		if attempt == 2 {
			assert.Equal(t, errBoom.Error(), a.LastError)
			assert.Equal(t, a.Envelope.RetryMessageID(2), a.MessageID)
		} else {
			assert.Equal(t, "busy-1", a.MessageID)
		}
		release <- struct{}{}
	}
	c.Out.WaitFor(t, "completed", func(ps []retry.ProcessedParams) bool {
		_, ok := sbtest.Result(ps, "busy-1", retry.OutcomeCompleted)
		return ok
	})
}

func ptr[T any](v T) *T { return &v }
