package retry_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/outage"
	"github.com/sbretry/retry/retrytest"
)

// Never two handlers for one session in one consumer, even after a lost lock: when the session's lock
// runs out at the broker while its handler runs (before the worker's next renewal could notice), the
// broker lets the session be accepted again, and another worker of the same consumer takes it. That
// worker waits for the first one to let the session go before it runs anything: the session's
// messages still run one at a time, in order.
func TestSessionNeverTwoHandlersAfterALostLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 2)
		var mu sync.Mutex
		var events []string
		running := 0
		overlap := false
		release := make(chan struct{})
		first := true
		h := func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
			mu.Lock()
			events = append(events, "start "+m.MessageID)
			running++
			overlap = overlap || running > 1
			wait := first
			first = false
			mu.Unlock()
			if wait {
				<-release // ignores ctx: a handler that does not watch its context
			}
			mu.Lock()
			events = append(events, "end "+m.MessageID)
			running--
			mu.Unlock()
			return nil
		}
		sc := newSessionConsumer(t, b, h, nil, &retry.Options{}, &retry.SessionOptions{MaxConcurrentSessions: 2, SessionIdleTimeout: time.Second})
		stop := runSessionConsumer(t, sc)
		synctest.Wait()
		b.ExpireLocks() // the broker gives the session up; the first worker has not renewed yet
		// Long enough for the other worker to accept the session again, well before a renewal.
		<-time.After(2 * time.Second)
		synctest.Wait()
		close(release)
		waitFor(t, b, func() bool { return len(b.Completed()) == 2 })
		require.NoError(t, stop())
		mu.Lock()
		defer mu.Unlock()
		assert.False(t, overlap, "two handlers ran for one session at once: %v", events)
		assert.Equal(t, "start s-1", events[0])
	})
}

// A session that runs dry while every worker is busy is released at once, instead of after
// SessionIdleTimeout: with one worker and the default idle timeout (10 s), the second session starts
// within a fraction of a second of the first one's last message.
func TestSessionRunDryHandsTheWorkerOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "a", 2)
		sendSession(t, b, "b", 2)
		rec := newSessionRecorder()
		sc := newSessionConsumer(t, b, rec.handler(func(context.Context, sessionCall) error { return nil }), rec,
			&retry.Options{}, &retry.SessionOptions{MaxConcurrentSessions: 1})
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 4 })
		require.NoError(t, stop())
		rec.mu.Lock()
		calls := append([]sessionCall(nil), rec.calls...)
		rec.mu.Unlock()
		require.Len(t, calls, 4)
		assert.Equal(t, calls[0].Session, calls[1].Session, "one session at a time: its messages in a row")
		assert.NotEqual(t, calls[1].Session, calls[2].Session)
		assert.Less(t, calls[2].At-calls[1].At, time.Second, "the second session did not wait out the first one's idle timeout")
	})
}

// While a worker is free to accept, a dry session is kept for SessionIdleTimeout.
func TestSessionDryButAloneIsKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "a", 1)
		rec := newSessionRecorder()
		sc := newSessionConsumer(t, b, rec.handler(func(context.Context, sessionCall) error { return nil }), rec,
			&retry.Options{}, &retry.SessionOptions{MaxConcurrentSessions: 2})
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 1 })
		<-time.After(5 * time.Second)
		held := false
		for _, s := range b.Sessions() {
			held = held || (s.ID == "a" && !s.LockedUntil.IsZero())
		}
		assert.True(t, held, "the dry session is still held 5 s on, within its idle timeout")
		require.NoError(t, stop())
	})
}

// Pause stops the session consumer taking sessions, and releases the one in hand once its message is
// settled; Resume takes them up again, in order, with no attempt spent. Health shows the pause.
func TestSessionConsumerPauseAndResume(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "a", 3)
		rec := newSessionRecorder()
		var sc *retry.SessionConsumer
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.ID == "a-1" {
				sc.Pause("deploying billing")
			}
			return nil
		})
		sc = newSessionConsumer(t, b, h, rec, &retry.Options{}, &retry.SessionOptions{MaxConcurrentSessions: 2})
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 1 })
		<-time.After(time.Minute)
		assert.Len(t, b.Completed(), 1, "nothing more runs while paused")
		out := sc.Health().Outage
		assert.Equal(t, outage.Open, out.State)
		assert.True(t, out.Manual)
		assert.Equal(t, "deploying billing", out.Reason)
		for _, s := range b.Sessions() {
			assert.True(t, s.LockedUntil.IsZero(), "the session in hand was released")
		}
		sc.Resume()
		waitFor(t, b, func() bool { return len(b.Completed()) == 3 })
		require.NoError(t, stop())
		assert.Equal(t, ids("a", 1, 2, 3), rec.successesOf("a"), "in order")
		for _, p := range rec.processed {
			assert.Equal(t, 1, p.Result.Attempt, "no attempt spent")
		}
	})
}

// cutWatcher is a SessionReceiver that records each receive that ended with nothing, cancelled, sooner
// than the session consumer's dry slice (20 ms), before the consumer was stopped.
type cutWatcher struct {
	retry.SessionReceiver
	stopping *atomic.Bool
	cuts     *atomic.Int32
}

func (w cutWatcher) ReceiveMessages(ctx context.Context, n int, o *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	start := time.Now()
	msgs, err := w.SessionReceiver.ReceiveMessages(ctx, n, o)
	if len(msgs) == 0 && ctx.Err() != nil && time.Since(start) < 20*time.Millisecond && !w.stopping.Load() {
		w.cuts.Add(1)
	}
	return msgs, err
}

// While every worker is busy, a dry session's short receive is left to run out: another worker's
// accept (which makes the workers all busy again) does not cancel it. A cancelled receive leaves its
// credit on the link, and azservicebus releases a message that then arrives back to the broker.
func TestSessionDryReceiveNotCutByAccepts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		for _, s := range []string{"a", "b", "c", "d", "e", "f"} {
			sendSession(t, b, s, 1)
		}
		var stopping atomic.Bool
		var cuts atomic.Int32
		connect := func(ctx context.Context) (*retry.SessionConnection, error) {
			conn, err := b.SessionConnector()(ctx)
			if err != nil {
				return nil, err
			}
			accept := conn.AcceptNext
			conn.AcceptNext = func(ctx context.Context) (retry.SessionReceiver, error) {
				r, err := accept(ctx)
				if err != nil {
					return nil, err
				}
				return cutWatcher{SessionReceiver: r, stopping: &stopping, cuts: &cuts}, nil
			}
			return conn, nil
		}
		// Handlers of different lengths, so that one worker's session runs dry while the other
		// accepts its next session; none ends at once, so that both workers hold a session before
		// the first runs dry (a long first slice is cut, as it should be, when the workers become busy).
		handler := func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
			d := time.Millisecond
			if *m.SessionID == "b" || *m.SessionID == "d" {
				d = 5 * time.Millisecond
			}
			<-time.After(d)
			return nil
		}
		sc, err := retry.NewSessionConsumer(connect, handler, &retry.Options{Logger: discardLogger()}, &retry.SessionOptions{MaxConcurrentSessions: 2})
		require.NoError(t, err)
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 6 })
		<-time.After(2 * time.Second)
		stopping.Store(true)
		require.NoError(t, stop())
		assert.Zero(t, cuts.Load(), "receives of a dry session cut short by other workers' accepts")
	})
}

// A dry session waiting out a long receive while a worker is free is let go soon after every worker
// becomes busy: its receive is cut then, and the session is released after drySlice (20 ms) more
// without a message, not at the end of its one-second receive.
func TestSessionLongReceiveCutWhenWorkersBecomeBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "a", 1)
		rec := newSessionRecorder()
		sc := newSessionConsumer(t, b, rec.handler(func(context.Context, sessionCall) error { return nil }), rec,
			&retry.Options{}, &retry.SessionOptions{MaxConcurrentSessions: 2})
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 1 })
		<-time.After(100 * time.Millisecond) // a waits in a long receive: the other worker is free
		sendSession(t, b, "b", 1)            // the other worker takes b: every worker busy
		waitFor(t, b, func() bool { return len(b.Completed()) == 2 })
		<-time.After(200 * time.Millisecond)
		for _, s := range b.Sessions() {
			if s.ID == "a" {
				assert.True(t, s.LockedUntil.IsZero(), "a is released within 200 ms of b's accept, not at the end of its 1 s receive")
			}
		}
		require.NoError(t, stop())
	})
}

// A message whose handler succeeded while its session's lock ran out at the broker is not run again
// when this consumer takes the session back: its success was decided here, and the redelivery
// completes it without calling the handler (the queue consumer's record of deliveries in flight,
// flights.go). The next message runs as usual.
func TestSessionRedeliveryInheritsAnUnsettledSuccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 2)
		var mu sync.Mutex
		runs := map[string]int{}
		release := make(chan struct{})
		first := true
		h := func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
			mu.Lock()
			runs[m.MessageID]++
			wait := first
			first = false
			mu.Unlock()
			if wait {
				<-release // the session's lock runs out at the broker meanwhile
			}
			return nil
		}
		rec := newSessionRecorder()
		sc := newSessionConsumer(t, b, h, rec, &retry.Options{}, &retry.SessionOptions{MaxConcurrentSessions: 2, SessionIdleTimeout: time.Second})
		stop := runSessionConsumer(t, sc)
		synctest.Wait()
		b.ExpireLocks()
		<-time.After(2 * time.Second)
		synctest.Wait()
		close(release)
		waitFor(t, b, func() bool { return len(b.Completed()) == 2 })
		require.NoError(t, stop())
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, map[string]int{"s-1": 1, "s-2": 1}, runs, "each handler ran once")
		inherited := 0
		for _, p := range rec.processed {
			if p.Result.Inherited {
				inherited++
				assert.Equal(t, "s-1", p.Message.MessageID)
				assert.Equal(t, retry.OutcomeCompleted, p.Result.Outcome)
			}
		}
		assert.Equal(t, 1, inherited, "the redelivery of s-1 applied the decided success")
	})
}

// A dead-letter decided here whose call failed is applied to the redelivery without running the
// handler again: the permanent failure is not re-discovered.
func TestSessionRedeliveryInheritsAnUnsettledDeadLetter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 2)
		b.Fail(retrytest.OpDeadLetter, 1, &azservicebus.Error{Code: azservicebus.CodeConnectionLost})
		rec := newSessionRecorder()
		h := rec.handler(func(_ context.Context, c sessionCall) error {
			if c.ID == "s-1" {
				return retry.Permanent(errors.New("malformed order"))
			}
			return nil
		})
		sc := newSessionConsumer(t, b, h, rec, nil, &retry.SessionOptions{MaxConcurrentSessions: 1})
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.DeadLettered()) == 1 && len(b.Completed()) == 1 })
		require.NoError(t, stop())
		assert.Len(t, rec.callsOf("s"), 2, "s-1's handler once, then s-2's")
		require.Len(t, rec.processed, 3)
		assert.Equal(t, retry.OutcomeLeftForRedelivery, rec.processed[0].Result.Outcome)
		assert.True(t, rec.processed[1].Result.Inherited)
		assert.Equal(t, retry.OutcomeDeadLettered, rec.processed[1].Result.Outcome)
		assert.Equal(t, "RetryPermanentFailure", b.DeadLettered()[0].Reason)
	})
}
