package retry_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/retrytest"
)

func TestRepublishFailureLeavesOriginal(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
	f.broker.Send(sampleMessage())
	f.broker.Fail(retrytest.OpSchedule, 1, retrytest.ErrConnectionLost)
	var observed []retry.ProcessedParams
	f.proc = mustProcessor(t, f, &retry.Options{Hooks: retry.Hooks{OnProcessed: func(p retry.ProcessedParams) { observed = append(observed, p) }}})
	res := f.process()
	assert.Equal(t, retry.OutcomeLeftForRedelivery, res.Outcome)
	assert.ErrorIs(t, res.SettleErr, retrytest.ErrConnectionLost)
	assert.Empty(t, f.broker.Completed(), "never complete without a scheduled successor")
	assert.Equal(t, 1, f.broker.Stats().Locked, "the original stays locked, then returns")
	require.Len(t, observed, 1)
	assert.Equal(t, retry.OutcomeLeftForRedelivery, observed[0].Result.Outcome)
	logs := f.logs.String()
	assert.Contains(t, logs, `"level":"ERROR"`)
	assert.Contains(t, logs, `"correlation_id":"corr-7"`)
	assert.Contains(t, logs, "republishing the retry failed")

	// The lock expires, the broker redelivers, and this time the republish works.
	f.clock.Add(retrytest.DefaultLockDuration)
	res = f.process()
	assert.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
	assert.Len(t, f.broker.Completed(), 1)
}

func mustProcessor(t *testing.T, f *fixture, opts *retry.Options) *retry.Processor {
	t.Helper()
	opts.Clock = f.clock
	opts.Logger = slog.New(slog.NewJSONHandler(&lockedWriter{w: f.logs}, nil))
	p, err := retry.NewProcessor(f.broker.Sender(), func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, opts)
	require.NoError(t, err)
	return p
}

func TestCompleteFailureAfterRepublishIsPossibleDuplicate(t *testing.T) {
	var calls atomic.Int32
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { calls.Add(1); return errBoom }, nil)
	f.broker.Send(sampleMessage())
	f.broker.Fail(retrytest.OpComplete, 1, &azservicebus.Error{Code: azservicebus.CodeLockLost})
	res := f.process()
	assert.Equal(t, retry.OutcomeLeftForRedelivery, res.Outcome)
	assert.True(t, res.PossibleDuplicate)

	// The redelivery reaches the same processor: it knows the copy is scheduled, so it completes the
	// original without running the handler again or scheduling a second copy.
	f.clock.Add(retrytest.DefaultLockDuration)
	res = f.process()
	assert.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
	assert.True(t, res.Inherited)
	assert.Equal(t, int32(1), calls.Load(), "the handler ran once")
	sched := f.broker.Scheduled()
	require.Len(t, sched, 1, "one successor")
	assert.Equal(t, sched[0].SequenceNumber, res.SequenceNumber)
	st := f.broker.Stats()
	assert.Equal(t, 1, st.Pending+st.Active, "one copy in flight")
}

func TestCompleteFailureAbsorbedAcrossProcesses(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom }, nil)
	f.broker.Send(sampleMessage())
	f.broker.Fail(retrytest.OpComplete, 1, &azservicebus.Error{Code: azservicebus.CodeLockLost})
	require.True(t, f.process().PossibleDuplicate)

	// The redelivery reaches another process (a fresh processor): the handler fails again and the
	// republish reuses the MessageId, which duplicate detection drops.
	other, err := retry.NewProcessor(f.broker.Sender(), func(context.Context, *azservicebus.ReceivedMessage) error { return errBoom },
		&retry.Options{Clock: f.clock, EntityPath: "orders", Logger: discardLogger()})
	require.NoError(t, err)
	f.clock.Add(retrytest.DefaultLockDuration)
	res := other.Process(context.Background(), f.recv, f.receiveOne())
	assert.Equal(t, retry.OutcomeRetryScheduled, res.Outcome)
	sched := f.broker.Scheduled()
	require.Len(t, sched, 2)
	assert.Equal(t, sched[0].MessageID, sched[1].MessageID, "deterministic MessageId")
	assert.True(t, sched[1].Duplicate, "absorbed by duplicate detection")
	st := f.broker.Stats()
	assert.Equal(t, 1, st.Pending+st.Active, "one copy in flight")
}

func TestDeadLetterFailureDoesNotComplete(t *testing.T) {
	f := newFixture(t, func(context.Context, *azservicebus.ReceivedMessage) error { return retry.Permanent(errBoom) }, nil)
	f.broker.Send(sampleMessage())
	f.broker.Fail(retrytest.OpDeadLetter, 1, nil)
	res := f.process()
	assert.Equal(t, retry.OutcomeLeftForRedelivery, res.Outcome)
	assert.Equal(t, "RetryPermanentFailure", res.DeadLetterReason)
	assert.Empty(t, f.broker.Completed())
	assert.Empty(t, f.broker.DeadLettered())
	assert.Equal(t, 1, f.broker.Stats().Locked)
}

func TestSettleCallsAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hang := &hangingSettler{}
		p, err := retry.NewProcessor(nopSender{}, okHandler, &retry.Options{SettleTimeout: 20 * time.Second, Logger: discardLogger(), DisableLockRenewal: true})
		require.NoError(t, err)
		start := time.Now()
		res := p.Process(context.Background(), hang, &azservicebus.ReceivedMessage{MessageID: "m"})
		assert.Equal(t, retry.OutcomeLeftForRedelivery, res.Outcome)
		assert.ErrorIs(t, res.SettleErr, context.DeadlineExceeded)
		assert.Equal(t, 20*time.Second, time.Since(start), "bounded by the settle timeout (fake time)")
	})
}

// hangingSettler never answers, like the SDK's settle path after a connection drop; it returns only
// when its context ends.
type hangingSettler struct{}

func (hangingSettler) CompleteMessage(ctx context.Context, _ *azservicebus.ReceivedMessage, _ *azservicebus.CompleteMessageOptions) error {
	<-ctx.Done()
	return ctx.Err()
}

func (hangingSettler) DeadLetterMessage(ctx context.Context, _ *azservicebus.ReceivedMessage, _ *azservicebus.DeadLetterOptions) error {
	<-ctx.Done()
	return ctx.Err()
}

func (hangingSettler) RenewMessageLock(ctx context.Context, _ *azservicebus.ReceivedMessage, _ *azservicebus.RenewMessageLockOptions) error {
	<-ctx.Done()
	return ctx.Err()
}

// hangingCompletes makes CompleteMessage hang until its context ends for the messages named in it, as
// the SDK does when it retries the settle of a lock that died with its connection.
type hangingCompletes struct {
	retry.Receiver
	hang map[string]bool
	mu   sync.Mutex
}

func (h *hangingCompletes) CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.CompleteMessageOptions) error {
	h.mu.Lock()
	hang := h.hang[m.MessageID]
	delete(h.hang, m.MessageID)
	h.mu.Unlock()
	if hang {
		<-ctx.Done()
		return ctx.Err()
	}
	return h.Receiver.CompleteMessage(ctx, m, o)
}

// A settle stuck on a dead lock must not hold a handler slot: before, every slot waited out its settle
// (up to SettleTimeout, 30 s) and no message was received. Now the next messages are handled at once,
// and the stuck message's redelivery completes without running the handler again.
func TestStuckSettleDoesNotFreezeTheConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hc := &hangingCompletes{hang: map[string]bool{"m-0": true}}
		b := newBroker(t, nil, &retrytest.BrokerOptions{LockDuration: 10 * time.Second, WrapReceiver: func(r retry.Receiver) retry.Receiver {
			hc.Receiver = r
			return hc
		}})
		var mu sync.Mutex
		calls := map[string]int{}
		var results []retry.Result
		c, err := retry.NewConsumer(b.Connector(), func(_ context.Context, m *azservicebus.ReceivedMessage) error {
			mu.Lock()
			calls[m.MessageID]++
			mu.Unlock()
			return nil
		}, &retry.Options{Logger: discardLogger(), Hooks: retry.Hooks{OnProcessed: func(p retry.ProcessedParams) {
			mu.Lock()
			results = append(results, p.Result)
			mu.Unlock()
		}}})
		require.NoError(t, err)
		sendN(b, 3)
		start := time.Now()
		stop := runConsumer(t, c)
		synctest.Wait()
		assert.Equal(t, 2, b.Stats().Succeeded, "m-1 and m-2 were handled while m-0's settle hung")
		assert.Zero(t, time.Since(start))

		// The broker loses m-0's lock (as when it died with a connection) and redelivers it.
		b.ExpireLocks()
		synctest.Wait()
		assert.Equal(t, 3, b.Stats().Succeeded)
		mu.Lock()
		assert.Equal(t, map[string]int{"m-0": 1, "m-1": 1, "m-2": 1}, calls, "finished work is not redone")
		inherited := 0
		for _, r := range results {
			if r.Inherited {
				inherited++
			}
		}
		assert.Equal(t, 1, inherited)
		mu.Unlock()
		require.NoError(t, stop())
	})
}

// timedCompletes never answers a complete until its context ends, and records how long it waited.
type timedCompletes struct {
	retry.Receiver
	mu     sync.Mutex
	waited []time.Duration
	errs   []error
}

func (h *timedCompletes) CompleteMessage(ctx context.Context, _ *azservicebus.ReceivedMessage, _ *azservicebus.CompleteMessageOptions) error {
	start := time.Now()
	<-ctx.Done()
	h.mu.Lock()
	h.waited = append(h.waited, time.Since(start))
	h.errs = append(h.errs, ctx.Err())
	h.mu.Unlock()
	return ctx.Err()
}

// The consumer's settle calls end at the settle timeout (one timer serves all of them), several at
// once included, and the messages are left for redelivery.
func TestConsumerSettleCallsAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hang := &timedCompletes{}
		b := newBroker(t, nil, &retrytest.BrokerOptions{WrapReceiver: func(r retry.Receiver) retry.Receiver {
			hang.Receiver = r
			return hang
		}})
		sendN(b, 3)
		var left atomic.Int32
		c, err := retry.NewConsumer(b.Connector(), okHandler, &retry.Options{
			SettleTimeout: 20 * time.Second, DisableLockRenewal: true, Logger: discardLogger(),
			Hooks: retry.Hooks{OnProcessed: func(p retry.ProcessedParams) {
				if p.Result.Outcome == retry.OutcomeLeftForRedelivery {
					left.Add(1)
				}
			}},
		})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		<-time.After(25 * time.Second)
		synctest.Wait()
		hang.mu.Lock()
		require.Len(t, hang.waited, 3)
		for i, w := range hang.waited {
			assert.Equal(t, 20*time.Second, w, "call %d", i)
			assert.ErrorIs(t, hang.errs[i], context.DeadlineExceeded)
		}
		hang.mu.Unlock()
		assert.Equal(t, int32(3), left.Load())
		require.NoError(t, stop())
	})
}
