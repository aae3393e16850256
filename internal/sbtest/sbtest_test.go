package sbtest

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, IgnoreSDKLeak())
}

// TestSendSplitsBatchesAndTheConsumerDrainsThem sends more than one batch can hold, and checks that
// every message arrives once and that the harness's consumer reports each completion.
func TestSendSplitsBatchesAndTheConsumerDrainsThem(t *testing.T) {
	h := New(t)
	ids := []string{"a", "b", "c", "d"}
	msgs := make([]*azservicebus.Message, len(ids))
	for i, id := range ids {
		msgs[i] = Message(id)
		msgs[i].Body = bytes.Repeat([]byte{'x'}, 100<<10) // two fit in a 256 KiB batch, not three
	}
	// Not all of them fit in one batch, so Send must split them.
	s, err := h.Client.NewSender(Queue, nil)
	require.NoError(t, err)
	defer func() { _ = s.Close(Context(t)) }()
	batch, err := s.NewMessageBatch(Context(t), nil)
	require.NoError(t, err)
	fit := 0
	for _, m := range msgs {
		if batch.AddMessage(m, nil) != nil {
			break
		}
		fit++
	}
	require.Less(t, fit, len(msgs))

	h.Send(t, msgs...)
	require.Equal(t, len(ids), h.Stats(t).Active)

	c := h.StartConsumer(t, func(context.Context, *azservicebus.ReceivedMessage) error { return nil }, retry.Options{MaxConcurrency: 2})
	c.Out.WaitFor(t, "every message completed", func(ps []retry.ProcessedParams) bool {
		return CountOutcome(ps, retry.OutcomeCompleted) == len(ids)
	})
	c.Stop()
	c.Stop() // a second Stop (and the test's cleanup) does nothing
	ps := c.Out.Snapshot()
	for _, id := range ids {
		_, ok := Result(ps, id, retry.OutcomeCompleted)
		assert.True(t, ok, "%s completed", id)
	}
	assert.Len(t, ps, len(ids), "each message handled once")
	assert.Zero(t, h.Stats(t).Active)
}

// TestResultIsTheLastOfItsOutcome checks the lookups over recorded results.
func TestResultIsTheLastOfItsOutcome(t *testing.T) {
	o := NewOutcomes()
	rec := func(id string, attempt int, outcome retry.Outcome) {
		o.Hook(retry.ProcessedParams{Envelope: envelope.Envelope{OriginalMessageID: id}, Result: retry.Result{Attempt: attempt, Outcome: outcome}})
	}
	rec("m", 1, retry.OutcomeRetryScheduled)
	rec("m", 2, retry.OutcomeRetryScheduled)
	rec("other", 1, retry.OutcomeCompleted)
	rec("m", 3, retry.OutcomeDeadLettered)

	r, ok := Result(o.Snapshot(), "m", retry.OutcomeRetryScheduled)
	require.True(t, ok)
	assert.Equal(t, 2, r.Attempt)
	_, ok = Result(o.Snapshot(), "m", retry.OutcomeCompleted)
	assert.False(t, ok)
	assert.Equal(t, 2, CountOutcome(o.Snapshot(), retry.OutcomeRetryScheduled))
	assert.Equal(t, 1, CountOutcome(o.Snapshot(), retry.OutcomeCompleted))
}

// TestWaitForWakesOnEachResult waits for results recorded by another goroutine once WaitFor has looked
// and found none, so WaitFor must be woken by the hook.
func TestWaitForWakesOnEachResult(t *testing.T) {
	o := NewOutcomes()
	done := make(chan struct{})
	var start sync.Once
	o.WaitFor(t, "three results", func(ps []retry.ProcessedParams) bool {
		start.Do(func() {
			go func() {
				defer close(done)
				for range 3 {
					o.Hook(retry.ProcessedParams{Result: retry.Result{Outcome: retry.OutcomeCompleted}})
				}
			}()
		})
		return len(ps) == 3
	})
	<-done
}
