package retry_test

import (
	"context"
	"errors"
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

// slowSender delays every ScheduleMessages call by delay (on the bubble's clock) before passing it on.
type slowSender struct {
	retry.Sender
	delay time.Duration
}

func (s slowSender) ScheduleMessages(ctx context.Context, msgs []*azservicebus.Message, at time.Time, o *azservicebus.ScheduleMessagesOptions) ([]int64, error) {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Sender.ScheduleMessages(ctx, msgs, at, o)
}

// The case: a 30 s lock, a 14 s handler and a 20 s schedule. Renewal that stopped when the
// handler returned let the lock expire before the complete, so the handler ran again (and without
// duplicate detection the chain forked). The lock is now renewed until the final settle returns.
func TestLockRenewedUntilSettled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, &retrytest.BrokerOptions{LockDuration: 30 * time.Second})
		var calls atomic.Int32
		p, err := retry.NewProcessor(slowSender{Sender: b.Sender(), delay: 20 * time.Second}, func(context.Context, *azservicebus.ReceivedMessage) error {
			calls.Add(1)
			<-time.After(14 * time.Second)
			return errBoom
		}, &retry.Options{Logger: discardLogger()})
		require.NoError(t, err)
		r := b.Receiver()
		b.Send(&azservicebus.Message{MessageID: strPtr("m")})
		res := p.Process(t.Context(), r, receiveNow(t, r))
		assert.Equal(t, retry.OutcomeRetryScheduled, res.Outcome, "completed after the 34 s of work: %v", res.SettleErr)
		assert.Equal(t, int32(1), calls.Load())
		assert.Equal(t, 1, b.Stats().Retried)
		st := b.Stats()
		assert.Equal(t, 1, st.Active+st.Pending, "only the copy is left: the original was not redelivered")
		assert.Zero(t, st.Locked)
	})
}

// A custom receive loop that cancels its context while a handler finishes its work: renewal follows the
// message, not ctx, so the finished work is completed instead of being redone after the lock expires.
func TestRenewalFollowsTheMessageNotTheCallersContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, &retrytest.BrokerOptions{LockDuration: 30 * time.Second})
		var calls atomic.Int32
		p, err := retry.NewProcessor(b.Sender(), func(context.Context, *azservicebus.ReceivedMessage) error {
			calls.Add(1)
			<-time.After(2 * time.Minute) // work that does not stop for ctx
			return nil
		}, &retry.Options{Logger: discardLogger()})
		require.NoError(t, err)
		r := b.Receiver()
		b.Send(&azservicebus.Message{MessageID: strPtr("m")})
		msg := receiveNow(t, r)
		ctx, cancel := context.WithCancel(t.Context())
		go func() {
			<-time.After(time.Second)
			cancel() // the loop shuts down
		}()
		res := p.Process(ctx, r, msg)
		assert.Equal(t, retry.OutcomeCompleted, res.Outcome, "%v", res.SettleErr)
		assert.Equal(t, 1, b.Stats().Succeeded)
		assert.Equal(t, int32(1), calls.Load())
	})
}

// skewedSettler makes every message look as if the broker's clock were skew ahead of this machine's:
// the LockedUntil values it reports (at receive and after each renewal) are shifted by skew.
type skewedSettler struct {
	retry.Receiver
	skew     time.Duration
	failNext atomic.Int32 // transient renewal failures to inject
	renewals atomic.Int32
}

func (s *skewedSettler) shift(m *azservicebus.ReceivedMessage) {
	if m.LockedUntil != nil {
		t := m.LockedUntil.Add(s.skew)
		m.LockedUntil = &t
	}
}

func (s *skewedSettler) RenewMessageLock(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.RenewMessageLockOptions) error {
	s.renewals.Add(1)
	if s.failNext.Load() > 0 {
		s.failNext.Add(-1)
		return errors.New("transient: server busy")
	}
	if err := s.Receiver.RenewMessageLock(ctx, m, o); err != nil {
		return err
	}
	s.shift(m)
	return nil
}

// Renewal timing must not depend on the client's clock agreeing with the broker's LockedUntil. With
// the lock duration known (Options.LockDuration), it is counted on the local clock from each renewal.
func TestRenewalIgnoresClockSkew(t *testing.T) {
	cases := map[string]struct {
		skew      time.Duration
		transient int32
	}{
		// The client is 10 minutes behind: LockedUntil looks 10 minutes further away than it is. Timed
		// from LockedUntil, the first renewal came long after the lock expired.
		"client behind by more than the lock": {skew: 10 * time.Minute},
		// The client is 2 minutes ahead: LockedUntil already looks past. One transient renewal error was
		// then taken for a lost lock.
		"client ahead, one transient error": {skew: -2 * time.Minute, transient: 1},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t, nil, &retrytest.BrokerOptions{LockDuration: 30 * time.Second})
				p, err := retry.NewProcessor(b.Sender(), func(context.Context, *azservicebus.ReceivedMessage) error {
					<-time.After(90 * time.Second)
					return nil
				}, &retry.Options{LockDuration: 30 * time.Second, Logger: discardLogger()})
				require.NoError(t, err)
				s := &skewedSettler{Receiver: b.Receiver(), skew: tc.skew}
				s.failNext.Store(tc.transient)
				b.Send(&azservicebus.Message{MessageID: strPtr("m")})
				msg := receiveNow(t, s.Receiver)
				s.shift(msg)
				res := p.Process(t.Context(), s, msg)
				assert.Equal(t, retry.OutcomeCompleted, res.Outcome, "%v", res.SettleErr)
				assert.Equal(t, 1, b.Stats().Succeeded)
				assert.GreaterOrEqual(t, s.renewals.Load(), int32(3), "renewed every 15 s")
			})
		})
	}
}

// With renewal off, a settle after the lock's expiry can only fail: it is not attempted, and the
// outcome is remembered so the redelivery completes without running the handler again.
func TestNoSettleAfterTheLockExpired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, &retrytest.BrokerOptions{LockDuration: 10 * time.Second})
		var calls atomic.Int32
		p, err := retry.NewProcessor(b.Sender(), func(context.Context, *azservicebus.ReceivedMessage) error {
			if calls.Add(1) == 1 {
				<-time.After(15 * time.Second)
			}
			return nil
		}, &retry.Options{DisableLockRenewal: true, Logger: discardLogger()})
		require.NoError(t, err)
		r := b.Receiver()
		counting := &completeCounter{Settler: r}
		b.Send(&azservicebus.Message{MessageID: strPtr("m")})
		res := p.Process(t.Context(), counting, receiveNow(t, r))
		assert.Equal(t, retry.OutcomeLeftForRedelivery, res.Outcome)
		assert.ErrorIs(t, res.SettleErr, retry.ErrLockLost)
		assert.Zero(t, counting.completes.Load(), "no complete on a dead lock")

		res = p.Process(t.Context(), r, receiveNow(t, r))
		assert.Equal(t, retry.OutcomeCompleted, res.Outcome)
		assert.True(t, res.Inherited)
		assert.Equal(t, int32(1), calls.Load(), "finished work is not redone")
	})
}

// completeCounter counts CompleteMessage calls.
type completeCounter struct {
	retry.Settler
	completes atomic.Int32
}

func (c *completeCounter) CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.CompleteMessageOptions) error {
	c.completes.Add(1)
	return c.Settler.CompleteMessage(ctx, m, o)
}

func TestLockRenewalKeepsLongHandlerAlive(t *testing.T) {
	cases := []struct {
		name    string
		disable bool
		want    retry.Outcome
	}{
		{"renewed", false, retry.OutcomeCompleted},
		{"not renewed", true, retry.OutcomeLeftForRedelivery},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// The handler works for 5 minutes under a 1 minute lock.
				b, r, p := bubbleProcessor(t, func(context.Context, *azservicebus.ReceivedMessage) error {
					<-time.After(5 * time.Minute)
					return nil
				}, &retry.Options{DisableLockRenewal: tc.disable})
				b.Send(sampleMessage())
				res := p.Process(t.Context(), r, receiveNow(t, r))
				assert.Equal(t, tc.want, res.Outcome)
				if !tc.disable {
					assert.Len(t, b.Completed(), 1)
				}
			})
		})
	}
}

func TestLockRenewalInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var renewals []time.Duration
		start := time.Now()
		b := newBroker(t, nil, nil)
		counting := &countingSettler{Receiver: b.Receiver(), onRenew: func() { renewals = append(renewals, time.Since(start)) }}
		p, err := retry.NewProcessor(b.Sender(), func(context.Context, *azservicebus.ReceivedMessage) error {
			<-time.After(100 * time.Second)
			return nil
		}, &retry.Options{Logger: discardLogger()})
		require.NoError(t, err)
		b.Send(sampleMessage())
		p.Process(t.Context(), counting, receiveNow(t, counting))
		// Half of the remaining 60 s lock each time: 30 s, then 30 s after each renewal.
		assert.Equal(t, []time.Duration{30 * time.Second, 60 * time.Second, 90 * time.Second}, renewals)
	})
}

type countingSettler struct {
	retry.Receiver
	onRenew func()
}

func (c *countingSettler) RenewMessageLock(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.RenewMessageLockOptions) error {
	c.onRenew()
	return c.Receiver.RenewMessageLock(ctx, m, o)
}

func TestLockLostCancelsHandlerAndRepublishesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var cause error
		var b *retrytest.Broker
		b, r, p := bubbleProcessor(t, func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
			<-time.After(10 * time.Second)
			b.ExpireLocks() // the broker loses the lock while the handler runs
			<-ctx.Done()
			cause = context.Cause(ctx)
			return errBoom
		}, nil)
		b.Send(sampleMessage())
		res := p.Process(t.Context(), r, receiveNow(t, r))
		assert.ErrorIs(t, cause, retry.ErrLockLost)
		assert.Equal(t, retry.OutcomeLeftForRedelivery, res.Outcome)
		assert.ErrorIs(t, res.SettleErr, retry.ErrLockLost)
		assert.Empty(t, b.Scheduled(), "nothing republished")
		assert.Empty(t, b.Completed())
		assert.Empty(t, b.DeadLettered())
		assert.Equal(t, 1, b.Stats().Active, "the broker has it for redelivery")
	})
}

func TestHangingRenewalDoesNotDelaySettle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The handler takes 40 s; the renewal at 30 s hangs (a broker that stopped answering). When the
		// handler returns, the hanging renewal is abandoned at once and the message is completed.
		b := newBroker(t, nil, nil)
		recv := &hangingRenewal{Receiver: b.Receiver()}
		p, err := retry.NewProcessor(b.Sender(), func(context.Context, *azservicebus.ReceivedMessage) error {
			<-time.After(40 * time.Second)
			return nil
		}, &retry.Options{Logger: discardLogger(), SettleTimeout: time.Hour})
		require.NoError(t, err)
		b.Send(sampleMessage())
		start := time.Now()
		res := p.Process(t.Context(), recv, receiveNow(t, recv))
		assert.Equal(t, retry.OutcomeCompleted, res.Outcome)
		assert.Equal(t, 40*time.Second, time.Since(start))
	})
}

type hangingRenewal struct{ retry.Receiver }

func (hangingRenewal) RenewMessageLock(ctx context.Context, _ *azservicebus.ReceivedMessage, _ *azservicebus.RenewMessageLockOptions) error {
	<-ctx.Done()
	return ctx.Err()
}
