package retrytest_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/retrytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func str(s string) *string { return &s }

// newBroker is [retrytest.New] for a test's fixed options: an error fails the test.
func newBroker(t testing.TB, clk retry.Clock, opts *retrytest.BrokerOptions) *retrytest.Broker {
	t.Helper()
	b, err := retrytest.New(clk, opts)
	require.NoError(t, err)
	return b
}

func TestPeekLockLifecycle(t *testing.T) {
	mock := clock.NewMock()
	b := newBroker(t, mock, &retrytest.BrokerOptions{LockDuration: 30 * time.Second, MaxDeliveryCount: 2})
	r := b.Receiver()
	ctx := t.Context()
	b.Send(&azservicebus.Message{MessageID: str("a"), Body: []byte("1")})
	b.Send(&azservicebus.Message{MessageID: str("b"), Body: []byte("2")})

	msgs, err := r.ReceiveMessages(ctx, 5, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 2, "FIFO, up to max")
	assert.Equal(t, "a", msgs[0].MessageID)
	assert.Equal(t, uint32(1), msgs[0].DeliveryCount)
	assert.NotEqual(t, msgs[0].LockToken, msgs[1].LockToken)
	require.NoError(t, r.CompleteMessage(ctx, msgs[0], nil))
	assert.Equal(t, 1, b.Stats().Locked)

	// The lock on b expires: settling fails with CodeLockLost and b comes back with a higher count.
	mock.Add(30 * time.Second)
	err = r.CompleteMessage(ctx, msgs[1], nil)
	var sbErr *azservicebus.Error
	require.ErrorAs(t, err, &sbErr)
	assert.Equal(t, azservicebus.CodeLockLost, sbErr.Code)
	again, err := r.ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	assert.Equal(t, uint32(2), again[0].DeliveryCount)

	// Renewal moves the lock forward.
	mock.Add(20 * time.Second)
	require.NoError(t, r.RenewMessageLock(ctx, again[0], nil))
	assert.Equal(t, mock.Now().Add(30*time.Second), *again[0].LockedUntil)
	mock.Add(20 * time.Second)
	require.NoError(t, r.DeadLetterMessage(ctx, again[0], &azservicebus.DeadLetterOptions{Reason: str("why"), ErrorDescription: str("because")}))
	dl := b.DeadLettered()
	require.Len(t, dl, 1)
	assert.Equal(t, "why", dl[0].Reason)
	assert.Equal(t, "because", dl[0].Description)
	assert.Equal(t, "b", dl[0].Message.MessageID)
}

func TestMaxDeliveryCountDeadLetters(t *testing.T) {
	mock := clock.NewMock()
	b := newBroker(t, mock, &retrytest.BrokerOptions{MaxDeliveryCount: 2})
	r := b.Receiver()
	b.Send(&azservicebus.Message{MessageID: str("x")})
	for range 2 {
		_, err := r.ReceiveMessages(t.Context(), 1, nil)
		require.NoError(t, err)
		mock.Add(retrytest.DefaultLockDuration)
	}
	st := b.Stats()
	assert.Equal(t, 0, st.Active)
	dl := b.DeadLettered()
	require.Len(t, dl, 1)
	assert.Equal(t, "MaxDeliveryCountExceeded", dl[0].Reason)
}

func TestScheduledReleasedAsClockAdvances(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		s := b.Sender()
		start := time.Now()
		seqs, err := s.ScheduleMessages(t.Context(), []*azservicebus.Message{{MessageID: str("later"), ApplicationProperties: map[string]any{envelope.PropAttempt: int64(3)}}}, start.Add(time.Minute), nil)
		require.NoError(t, err)
		require.Len(t, seqs, 1)
		msgs, err := b.Receiver().ReceiveMessages(t.Context(), 1, nil) // blocks until due
		require.NoError(t, err)
		assert.Equal(t, time.Minute, time.Since(start))
		assert.Equal(t, "later", msgs[0].MessageID)
		assert.Equal(t, start.Add(time.Minute), *msgs[0].ScheduledEnqueueTime)
		sched := b.Scheduled()
		require.Len(t, sched, 1)
		assert.Equal(t, 3, sched[0].Attempt)
		assert.Equal(t, seqs[0], sched[0].SequenceNumber)
	})
}

func TestDuplicateDetection(t *testing.T) {
	b := newBroker(t, clock.NewMock(), &retrytest.BrokerOptions{DuplicateDetection: true})
	s := b.Sender()
	for range 2 {
		_, err := s.ScheduleMessages(t.Context(), []*azservicebus.Message{{MessageID: str("same")}}, time.Time{}, nil)
		require.NoError(t, err, "a duplicate still reports success")
	}
	st := b.Stats()
	assert.Equal(t, 1, st.Active)
	assert.Equal(t, 1, st.Duplicates)
	assert.True(t, b.Scheduled()[1].Duplicate)
}

func TestFaultSwitches(t *testing.T) {
	b := newBroker(t, clock.NewMock(), nil)
	ctx := t.Context()
	custom := errors.New("boom")
	b.Fail(retrytest.OpConnect, 2, custom)
	connect := b.Connector()
	for range 2 {
		_, err := connect(ctx)
		assert.ErrorIs(t, err, custom)
	}
	conn, err := connect(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, b.Connects())

	b.Fail(retrytest.OpSchedule, 1, nil)
	_, err = conn.Sender.ScheduleMessages(ctx, []*azservicebus.Message{{}}, time.Time{}, nil)
	assert.ErrorIs(t, err, retrytest.ErrInjected)
	_, err = conn.Sender.ScheduleMessages(ctx, []*azservicebus.Message{{}}, time.Time{}, nil)
	assert.NoError(t, err)

	msgs, err := conn.Receiver.ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	b.Fail(retrytest.OpComplete, 1, nil)
	assert.ErrorIs(t, conn.Receiver.CompleteMessage(ctx, msgs[0], nil), retrytest.ErrInjected)
	assert.NoError(t, conn.Receiver.CompleteMessage(ctx, msgs[0], nil), "a failed settle keeps the lock")

	b.Fail(retrytest.OpRenew, 1, nil)
	assert.ErrorIs(t, conn.Receiver.RenewMessageLock(ctx, msgs[0], nil), retrytest.ErrInjected)

	// A closed connection refuses work, like a closed SDK client.
	require.NoError(t, conn.Close(ctx))
	_, err = conn.Receiver.ReceiveMessages(ctx, 1, nil)
	var sbErr *azservicebus.Error
	require.ErrorAs(t, err, &sbErr)
	assert.Equal(t, azservicebus.CodeClosed, sbErr.Code)
}

func TestReceiveUnblocksOnCancelAndClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		ctx, cancel := context.WithCancel(t.Context())
		r := b.Receiver()
		errs := make(chan error, 1)
		go func() { _, err := r.ReceiveMessages(ctx, 1, nil); errs <- err }()
		synctest.Wait()
		cancel()
		assert.ErrorIs(t, <-errs, context.Canceled)

		go func() { _, err := r.ReceiveMessages(t.Context(), 1, nil); errs <- err }()
		synctest.Wait()
		require.NoError(t, r.Close(t.Context()))
		assert.Error(t, <-errs)
	})
}

func TestMessagesAreCopies(t *testing.T) {
	b := newBroker(t, clock.NewMock(), nil)
	orig := &azservicebus.Message{MessageID: str("c"), Body: []byte("abc"), ApplicationProperties: map[string]any{"k": []byte{1}}}
	b.Send(orig)
	orig.Body[0] = 'X'
	orig.ApplicationProperties["k"].([]byte)[0] = 9
	msgs, err := b.Receiver().ReceiveMessages(t.Context(), 1, nil)
	require.NoError(t, err)
	assert.Equal(t, []byte("abc"), msgs[0].Body)
	assert.Equal(t, []byte{1}, msgs[0].ApplicationProperties["k"])
}

// Stats name what a handler author waits for: a failed attempt completes its original too, so it counts
// as Retried, not Succeeded. AdvanceToNextScheduled jumps a mock clock to the next copy.
func TestStatsSeparateSuccessesFromRetriedOriginals(t *testing.T) {
	mock := clock.NewMock()
	b := newBroker(t, mock, nil)
	fails := 1
	p, err := retry.NewProcessor(b.Sender(), func(context.Context, *azservicebus.ReceivedMessage) error {
		if fails > 0 {
			fails--
			return errors.New("boom")
		}
		return nil
	}, &retry.Options{Clock: mock, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	r := b.Receiver()
	b.Send(&azservicebus.Message{MessageID: str("m")})
	msgs, err := r.ReceiveMessages(t.Context(), 1, nil)
	require.NoError(t, err)
	require.Equal(t, retry.OutcomeRetryScheduled, p.Process(t.Context(), r, msgs[0]).Outcome)
	st := b.Stats()
	assert.Equal(t, 0, st.Succeeded, "a failure is not a success")
	assert.Equal(t, 1, st.Retried)

	due, ok := b.AdvanceToNextScheduled(mock)
	require.True(t, ok)
	assert.Equal(t, mock.Now(), due)
	assert.Equal(t, 1, b.Stats().Active, "the copy is receivable")
	msgs, err = r.ReceiveMessages(t.Context(), 1, nil)
	require.NoError(t, err)
	require.Equal(t, retry.OutcomeCompleted, p.Process(t.Context(), r, msgs[0]).Outcome)
	st = b.Stats()
	assert.Equal(t, 1, st.Succeeded)
	assert.Equal(t, 1, st.Retried)
	_, ok = b.AdvanceToNextScheduled(mock)
	assert.False(t, ok, "nothing scheduled")
}

// jumpingClock is a mock clock that a test advances at the worst moment: just before the broker takes
// the timer it waits on, after the model read the clock.
type jumpingClock struct {
	*clock.Mock
	armed atomic.Bool
	jump  time.Duration
}

func (c *jumpingClock) After(d time.Duration) <-chan time.Time {
	if c.armed.CompareAndSwap(true, false) {
		c.Mock.Add(c.jump)
	}
	return c.Mock.After(d)
}

// A receive that waits for a lock to expire wakes up even when the clock passes the expiry between the
// model's reading of it and the broker taking its timer.
func TestReceiveWakesWhenTheClockJumpsPastTheDeadline(t *testing.T) {
	clk := &jumpingClock{Mock: clock.NewMock(), jump: 2 * time.Minute}
	b := newBroker(t, clk, &retrytest.BrokerOptions{LockDuration: time.Minute})
	id := "m"
	b.Send(&azservicebus.Message{MessageID: &id, Body: []byte("x")})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	first, err := b.Receiver().ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	require.Len(t, first, 1) // locked for a minute, never settled
	clk.armed.Store(true)
	again, err := b.Receiver().ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err, "the expired lock's message comes back")
	require.Len(t, again, 1)
	assert.Equal(t, uint32(2), again[0].DeliveryCount)
}
