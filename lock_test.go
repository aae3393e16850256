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
