package retry_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
)

// chainSettler accepts every settle; renewals of the deliveries in lost report a lost lock.
type chainSettler struct{ lost map[byte]bool }

func (chainSettler) CompleteMessage(context.Context, *azservicebus.ReceivedMessage, *azservicebus.CompleteMessageOptions) error {
	return nil
}

func (chainSettler) DeadLetterMessage(context.Context, *azservicebus.ReceivedMessage, *azservicebus.DeadLetterOptions) error {
	return nil
}

func (s chainSettler) RenewMessageLock(_ context.Context, m *azservicebus.ReceivedMessage, _ *azservicebus.RenewMessageLockOptions) error {
	if s.lost[m.LockToken[0]] {
		return &azservicebus.Error{Code: azservicebus.CodeLockLost}
	}
	return nil
}

// gatedSender records the copies it schedules; the first call waits for gate.
type gatedSender struct {
	mu      sync.Mutex
	ids     []string
	gate    chan struct{}
	entered chan struct{}
	first   atomic.Bool
}

func (s *gatedSender) ScheduleMessages(_ context.Context, ms []*azservicebus.Message, _ time.Time, _ *azservicebus.ScheduleMessagesOptions) ([]int64, error) {
	if s.first.CompareAndSwap(false, true) {
		close(s.entered)
		<-s.gate
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids = append(s.ids, *ms[0].MessageID)
	return []int64{int64(len(s.ids))}, nil
}

func (s *gatedSender) Close(context.Context) error { return nil }

// delivery returns the same message (sequence number 42) delivered with lock token tok.
func delivery(tok byte) *azservicebus.ReceivedMessage {
	seq := int64(42)
	enq := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	lu := time.Now().Add(2 * time.Second)
	return &azservicebus.ReceivedMessage{MessageID: "m-1", SequenceNumber: &seq, EnqueuedTime: &enq, LockedUntil: &lu, LockToken: [16]byte{tok}, Body: []byte("x")}
}

// A redelivery that gives up waiting for the earlier delivery (its own lock died too) must not make the
// process forget that earlier delivery's decision: the next redelivery applies it instead of running the
// handler again and scheduling a second copy of the attempt.
func TestRedeliveryThatGivesUpKeepsTheChain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		snd := &gatedSender{gate: make(chan struct{}), entered: make(chan struct{})}
		var calls atomic.Int32
		p, err := retry.NewProcessor(snd, func(context.Context, *azservicebus.ReceivedMessage) error {
			calls.Add(1)
			return errors.New("boom")
		}, &retry.Options{LockDuration: 2 * time.Second, LockRenewInterval: 50 * time.Millisecond, Logger: discardLogger()})
		require.NoError(t, err)
		st := chainSettler{lost: map[byte]bool{2: true}}
		first := make(chan retry.Result, 1)
		go func() { first <- p.Process(t.Context(), st, delivery(1)) }()
		<-snd.entered // delivery 1 is scheduling its copy
		second := p.Process(t.Context(), st, delivery(2))
		assert.Equal(t, retry.OutcomeLeftForRedelivery, second.Outcome, "delivery 2 lost its lock while waiting")
		close(snd.gate)
		assert.True(t, (<-first).PossibleDuplicate, "delivery 1 scheduled the copy, its complete could not be made")
		third := p.Process(t.Context(), st, delivery(3))
		assert.True(t, third.Inherited)
		assert.Equal(t, retry.OutcomeRetryScheduled, third.Outcome)
		assert.Equal(t, int32(1), calls.Load(), "the handler ran once")
		assert.Len(t, snd.ids, 1, "one successor")
	})
}

// Waiting follows the whole chain of earlier deliveries: delivery 3 supersedes delivery 2, which was
// itself waiting for delivery 1, still in its handler; delivery 3 must wait for delivery 1 too.
func TestNoTwoHandlersAcrossAChainOfRedeliveries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		snd := &gatedSender{gate: make(chan struct{}), entered: make(chan struct{})}
		close(snd.gate)
		var running, peak, calls atomic.Int32
		release := make(chan struct{})
		p, err := retry.NewProcessor(snd, func(_ context.Context, m *azservicebus.ReceivedMessage) error {
			calls.Add(1)
			n := running.Add(1)
			defer running.Add(-1)
			if n > peak.Load() {
				peak.Store(n)
			}
			if m.LockToken[0] == 1 {
				<-release // slow to honour its cancelled context, but it finishes its work
			}
			return nil
		}, &retry.Options{LockDuration: 2 * time.Second, Logger: discardLogger()})
		require.NoError(t, err)
		st := chainSettler{}
		d1 := make(chan retry.Result, 1)
		go func() { d1 <- p.Process(t.Context(), st, delivery(1)) }()
		synctest.Wait()
		d2 := make(chan retry.Result, 1)
		go func() { d2 <- p.Process(t.Context(), st, delivery(2)) }()
		synctest.Wait()
		d3 := make(chan retry.Result, 1)
		go func() { d3 <- p.Process(t.Context(), st, delivery(3)) }()
		synctest.Wait()
		assert.Equal(t, int32(1), running.Load(), "only delivery 1's handler runs")
		close(release)
		r3 := <-d3
		<-d2
		<-d1
		assert.Equal(t, int32(1), peak.Load(), "never two handlers of one message")
		assert.Equal(t, int32(1), calls.Load(), "the redeliveries applied delivery 1's finished work")
		assert.Equal(t, retry.OutcomeCompleted, r3.Outcome)
		assert.True(t, r3.Inherited)
	})
}

// slowCompleter's CompleteMessage takes 3 s and reports success, as azservicebus does after it retried
// a complete the broker had rejected (the message is then redelivered anyway).
type slowCompleter struct{ chainSettler }

func (slowCompleter) CompleteMessage(ctx context.Context, _ *azservicebus.ReceivedMessage, _ *azservicebus.CompleteMessageOptions) error {
	select {
	case <-time.After(3 * time.Second):
	case <-ctx.Done():
	}
	return nil
}

// A complete that "succeeded" only after the SDK retried it is doubted: if the message comes back, the
// redelivery is completed without running the handler again.
func TestRedeliveryAfterASlowCompleteIsNotRunAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		p, err := retry.NewProcessor(&gatedSender{gate: make(chan struct{})}, func(context.Context, *azservicebus.ReceivedMessage) error {
			calls.Add(1)
			return nil
		}, &retry.Options{LockDuration: 30 * time.Second, Logger: discardLogger()})
		require.NoError(t, err)
		first := p.Process(t.Context(), slowCompleter{}, delivery(1))
		require.Equal(t, retry.OutcomeCompleted, first.Outcome)
		again := p.Process(t.Context(), chainSettler{}, delivery(2))
		assert.Equal(t, retry.OutcomeCompleted, again.Outcome)
		assert.True(t, again.Inherited)
		assert.Equal(t, int32(1), calls.Load(), "the handler ran once")
	})
}

// failingFirstCompletes fails the complete of every first delivery (lock token 1) and accepts the rest,
// as when each message's first lock died with a connection.
type failingFirstCompletes struct{ chainSettler }

func (failingFirstCompletes) CompleteMessage(_ context.Context, m *azservicebus.ReceivedMessage, _ *azservicebus.CompleteMessageOptions) error {
	if m.LockToken[0] == 1 {
		return &azservicebus.Error{Code: azservicebus.CodeLockLost}
	}
	return nil
}

// deliveryOf returns delivery tok of the message with sequence number seq.
func deliveryOf(seq int64, tok byte) *azservicebus.ReceivedMessage {
	enq := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	lu := time.Now().Add(time.Minute)
	return &azservicebus.ReceivedMessage{MessageID: fmt.Sprintf("m-%d", seq), SequenceNumber: &seq, EnqueuedTime: &enq, LockedUntil: &lu, LockToken: [16]byte{tok}, Body: []byte("x")}
}

// A decided outcome stays remembered while the number outstanding is far below the promised bound,
// however many other messages were redelivered and finished meanwhile: the redelivery of a message whose
// handler succeeded never runs it a second time.
func TestRememberedOutcomeOutlastsFinishedRedeliveries(t *testing.T) {
	var calls sync.Map // seq -> *atomic.Int32
	p, err := retry.NewProcessor(&gatedSender{gate: make(chan struct{})}, func(_ context.Context, m *azservicebus.ReceivedMessage) error {
		n, _ := calls.LoadOrStore(*m.SequenceNumber, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		return nil
	}, &retry.Options{LockDuration: time.Minute, DisableLockRenewal: true, Logger: discardLogger()})
	require.NoError(t, err)
	st := failingFirstCompletes{}
	live := int64(1)
	require.Equal(t, retry.OutcomeLeftForRedelivery, p.Process(t.Context(), st, deliveryOf(live, 1)).Outcome)
	// 12,000 other messages (more than the bound), each failing its first complete and finished by its
	// redelivery: at most two outcomes are outstanding at any moment.
	for seq := int64(2); seq < 12_002; seq++ {
		require.Equal(t, retry.OutcomeLeftForRedelivery, p.Process(t.Context(), st, deliveryOf(seq, 1)).Outcome)
		res := p.Process(t.Context(), st, deliveryOf(seq, 2))
		require.True(t, res.Inherited)
		require.Equal(t, retry.OutcomeCompleted, res.Outcome)
	}
	res := p.Process(t.Context(), st, deliveryOf(live, 2))
	assert.True(t, res.Inherited, "the live outcome was forgotten")
	assert.Equal(t, retry.OutcomeCompleted, res.Outcome)
	n, _ := calls.Load(live)
	assert.Equal(t, int32(1), n.(*atomic.Int32).Load(), "the successful handler ran again")
}

// At the promised bound, 10,000 outstanding outcomes (each message's complete failed), every one is
// still remembered when its redelivery comes: none of the handlers runs a second time, whatever the
// sequence numbers.
func TestTenThousandOutstandingOutcomesAreAllRemembered(t *testing.T) {
	const promised = 10_000
	var calls atomic.Int32
	p, err := retry.NewProcessor(&gatedSender{gate: make(chan struct{})}, func(context.Context, *azservicebus.ReceivedMessage) error {
		calls.Add(1)
		return nil
	}, &retry.Options{LockDuration: time.Minute, DisableLockRenewal: true, Logger: discardLogger()})
	require.NoError(t, err)
	st := failingFirstCompletes{}
	seq := func(i int) int64 { return 1_000_000 + 7*int64(i) } // a filtered subscription's stride
	for i := range promised {
		require.Equal(t, retry.OutcomeLeftForRedelivery, p.Process(t.Context(), st, deliveryOf(seq(i), 1)).Outcome)
	}
	forgotten := 0
	for i := range promised {
		if res := p.Process(t.Context(), st, deliveryOf(seq(i), 2)); !res.Inherited {
			forgotten++
		}
	}
	assert.Zero(t, forgotten, "outcomes forgotten at the promised number")
	assert.Equal(t, int32(promised), calls.Load(), "handlers that ran twice: %d", calls.Load()-promised)
}

// No message runs in two handlers of one consumer at once: a redelivery that arrives while the first
// handler still runs (its lock was lost) waits for it, then applies its outcome.
func TestNoMessageRunsInTwoHandlersAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		var running, peak, calls atomic.Int32
		expired := make(chan struct{})
		c, err := retry.NewConsumer(b.Connector(), func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
			n := running.Add(1)
			defer running.Add(-1)
			if n > peak.Load() {
				peak.Store(n)
			}
			if calls.Add(1) == 1 {
				b.ExpireLocks() // the broker loses the lock and redelivers while this handler works
				close(expired)
				<-time.After(20 * time.Second) // finishes its work, ignoring ctx
			}
			return nil
		}, &retry.Options{MaxConcurrency: 4, Logger: discardLogger()})
		require.NoError(t, err)
		sendN(b, 1)
		stop := runConsumer(t, c)
		<-expired
		synctest.Wait()
		<-time.After(30 * time.Second)
		synctest.Wait()
		assert.Equal(t, int32(1), peak.Load(), "never two handlers for one message")
		assert.Equal(t, int32(1), calls.Load(), "the redelivery inherits the finished work")
		assert.Equal(t, 1, b.Stats().Succeeded)
		require.NoError(t, stop())
	})
}
