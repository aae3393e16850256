package retry_test

import (
	"context"
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
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/outage"
	"github.com/sbretry/retry/retrytest"
)

// countingReceiver counts the receive calls and the messages they returned.
type countingReceiver struct {
	retry.Receiver
	calls, msgs *atomic.Int64
}

func (r countingReceiver) ReceiveMessages(ctx context.Context, n int, o *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	r.calls.Add(1)
	msgs, err := r.Receiver.ReceiveMessages(ctx, n, o)
	r.msgs.Add(int64(len(msgs)))
	return msgs, err
}

const debugOutage = false

// outageRig is a consumer over a retrytest broker whose handler fails while down is set, recording
// every attempt's number per message.
type outageRig struct {
	b              *retrytest.Broker
	c              *retry.Consumer
	down           atomic.Bool
	calls, msgs    atomic.Int64
	mu             sync.Mutex
	attempts       map[string][]int
	succeeded      map[string]bool
	transitions    []string
	handlerRunning atomic.Int64
}

func newOutageRig(t *testing.T, opts *retry.Options, fail func(r *outageRig) error) *outageRig {
	t.Helper()
	r := &outageRig{attempts: map[string][]int{}, succeeded: map[string]bool{}}
	r.b = newBroker(t, nil, &retrytest.BrokerOptions{DuplicateDetection: true, WrapReceiver: func(rc retry.Receiver) retry.Receiver {
		return countingReceiver{Receiver: rc, calls: &r.calls, msgs: &r.msgs}
	}})
	opts.Logger = discardLogger()
	opts.Hooks.OnOutage = func(p outage.Change) {
		r.mu.Lock()
		r.transitions = append(r.transitions, p.From.String()+"->"+p.To.String())
		if debugOutage {
			fmt.Println(time.Now().Format("15:04:05"), p.From, "->", p.To, p.NextProbe.Format("15:04:05"), p.Reason)
		}
		r.mu.Unlock()
	}
	c, err := retry.NewConsumer(r.b.Connector(), func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		env, _ := envelope.FromContext(ctx)
		id := env.OriginalMessageID
		r.mu.Lock()
		r.attempts[id] = append(r.attempts[id], env.Attempt)
		r.mu.Unlock()
		if err := fail(r); err != nil {
			return err
		}
		r.mu.Lock()
		r.succeeded[id] = true
		r.mu.Unlock()
		return nil
	}, opts)
	require.NoError(t, err)
	r.c = c
	return r
}

func (r *outageRig) successes() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.succeeded)
}

// A downstream down for two minutes under a steady flow: the breaker trips, nothing is dead-lettered,
// no message spends more than its one failed attempt, almost nothing is received while open, and
// everything succeeds soon after the downstream is back.
func TestOutageSpendsNoAttemptsAndDeadLettersNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newOutageRig(t, &retry.Options{MaxConcurrency: 4, MaxAttempts: 3,
			Outage: &outage.Options{ConsecutiveFailures: 5, OpenFor: 20 * time.Second, MaxOpenFor: 40 * time.Second}},
			func(r *outageRig) error {
				if r.down.Load() {
					return errBoom
				}
				return nil
			})
		r.down.Store(true)
		stop := runConsumer(t, r.c)

		// A steady flow: 5 messages a second for the whole outage.
		const perSecond, seconds = 5, 120
		sent := 0
		for range seconds {
			for range perSecond {
				r.b.Send(&azservicebus.Message{MessageID: strPtr(fmt.Sprintf("m-%d", sent)), Body: []byte("x")})
				sent++
			}
			time.Sleep(time.Second)
			if sent == 10*perSecond {
				require.Equal(t, outage.Open, r.c.Health().Outage.State, "tripped within the first seconds")
				r.calls.Store(0)
				r.msgs.Store(0)
			}
		}
		receivedWhileOpen := r.msgs.Load()
		// Probes every 20 s, then 40 s: a handful of messages in 110 s, against 550 sent meanwhile.
		assert.LessOrEqual(t, receivedWhileOpen, int64(12), "the consumer receives almost nothing while open")

		r.down.Store(false)
		recovered := time.Now()
		if debugOutage {
			fmt.Println("recovered", recovered.Format("15:04:05"))
			defer func() { fmt.Println("all done", time.Now().Format("15:04:05")) }()
		}
		require.NoError(t, r.b.WaitUntil(t.Context(), func() bool { return r.successes() == sent }))
		// One probe interval (at most MaxOpenFor) plus the first backoff (10 s) plus handling.
		assert.Less(t, time.Since(recovered), 40*time.Second+10*time.Second+5*time.Second)
		require.NoError(t, stop())

		h := r.c.Health()
		assert.Zero(t, h.DeadLettered, "nothing dead-lettered because of the outage")
		assert.Empty(t, r.b.DeadLettered())
		assert.Equal(t, sent, r.b.Stats().Succeeded, "the test broker counts each chain's success once, held copies included")
		assert.Positive(t, h.Held)
		assert.GreaterOrEqual(t, h.Outage.Trips, uint64(1))
		assert.Equal(t, outage.Closed, h.Outage.State)
		r.mu.Lock()
		defer r.mu.Unlock()
		for id, at := range r.attempts {
			assert.LessOrEqual(t, at[len(at)-1], 2, "%s: at most the failed attempt before the trip, then the one that succeeded", id)
		}
		assert.Equal(t, "closed->open", r.transitions[0])
		assert.Equal(t, "half-open->closed", r.transitions[len(r.transitions)-1])
	})
}

// A storm of permanent failures is bad messages, not an outage: it never trips the breaker.
func TestPermanentFailuresDoNotTrip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newOutageRig(t, &retry.Options{MaxConcurrency: 4, Outage: &outage.Options{ConsecutiveFailures: 3, MinAttempts: 5}},
			func(*outageRig) error { return retry.Permanent(errBoom) })
		sendN(r.b, 50)
		stop := runConsumer(t, r.c)
		require.NoError(t, r.b.WaitUntil(t.Context(), func() bool { return len(r.b.DeadLettered()) == 50 }))
		require.NoError(t, stop())
		h := r.c.Health()
		assert.Equal(t, outage.Closed, h.Outage.State)
		assert.Zero(t, h.Outage.Trips)
		assert.Zero(t, h.Held)
	})
}

// Failures a policy marks NotOutage, or that Outage.Counts refuses, do not trip it either.
func TestOutageFilters(t *testing.T) {
	for name, opts := range map[string]*retry.Options{
		"NotOutage policy": {Policies: []retry.Rule{{Match: retry.ErrorIs(errBoom), Policy: retry.Policy{NotOutage: true}}},
			Outage: &outage.Options{ConsecutiveFailures: 3}},
		"Counts": {Outage: &outage.Options{ConsecutiveFailures: 3, Counts: func(error) bool { return false }}},
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				opts.MaxConcurrency = 2
				r := newOutageRig(t, opts, func(*outageRig) error { return errBoom })
				sendN(r.b, 20)
				stop := runConsumer(t, r.c)
				synctest.Wait() // every first attempt failed; the retries are due in 10 s
				require.Equal(t, uint64(20), r.c.Health().RetriesScheduled)
				require.NoError(t, stop())
				assert.Zero(t, r.c.Health().Outage.Trips)
			})
		})
	}
}

// Messages received ahead, waiting for a handler slot when the breaker trips, are held without
// running their handler: their attempt is not spent, and the copy says so.
func TestOutageHoldsMessagesInHand(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		r := newOutageRig(t, &retry.Options{MaxConcurrency: 1, Prefetch: 6, Outage: &outage.Options{ConsecutiveFailures: 1, OpenFor: time.Minute}},
			func(r *outageRig) error {
				<-release
				return errBoom
			})
		sendN(r.b, 7)
		stop := runConsumer(t, r.c)
		synctest.Wait() // one handler blocked, six messages received ahead
		require.Equal(t, int64(7), r.msgs.Load())
		close(release)
		synctest.Wait() // all seven settled; the breaker waits a minute for its probe
		require.NoError(t, stop())
		h := r.c.Health()
		assert.Equal(t, uint64(7), h.Held, "the failure that tripped it and the six waiting are held")
		assert.Zero(t, h.RetriesScheduled)
		r.mu.Lock()
		assert.Len(t, r.attempts, 1, "the six received ahead never ran")
		r.mu.Unlock()
		sched := r.b.Scheduled()
		require.Len(t, sched, 7)
		for _, s := range sched {
			assert.Contains(t, s.Message.ApplicationProperties, envelope.PropHeld)
			assert.Equal(t, 1, s.Attempt, "held at the same attempt")
			assert.Regexp(t, `^sbretry-[0-9a-f]{40}-1-h[0-9a-f]{16}$`, s.MessageID)
			assert.Equal(t, h.Outage.NextProbe, s.At, "due at the probe")
		}
	})
}

// Pause is a kill switch: nothing is received until Resume, with or without outage mode.
func TestPauseAndResume(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newOutageRig(t, &retry.Options{MaxConcurrency: 2}, func(*outageRig) error { return nil })
		r.c.Pause("billing migration")
		sendN(r.b, 10)
		stop := runConsumer(t, r.c)
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		assert.Zero(t, r.msgs.Load(), "paused: nothing received")
		h := r.c.Health()
		assert.True(t, h.Ready(), "a paused consumer is connected and well")
		assert.Equal(t, outage.Open, h.Outage.State)
		assert.True(t, h.Outage.Manual)
		assert.Equal(t, "billing migration", h.Outage.Reason)
		r.c.Resume()
		require.NoError(t, r.b.WaitUntil(t.Context(), func() bool { return r.successes() == 10 }))
		require.NoError(t, stop())
		assert.Equal(t, []string{"closed->open", "open->closed"}, r.transitions)
	})
}

// While paused, the connection is still probed: an outage of Service Bus itself is noticed.
func TestPausedConsumerStillProbesTheConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		var broken atomic.Bool
		connect := func(ctx context.Context) (*retry.Connection, error) {
			conn, err := b.Connector()(ctx)
			if err != nil {
				return nil, err
			}
			conn.Ping = func(context.Context) error {
				if broken.Load() {
					return errBoom
				}
				return nil
			}
			return conn, nil
		}
		running, reconnecting := make(chan struct{}), make(chan struct{})
		var once1, once2 sync.Once
		c, err := retry.NewConsumer(connect, okHandler, &retry.Options{Logger: discardLogger(), Hooks: retry.Hooks{
			OnStateChange: func(p retry.StateChangeParams) {
				switch p.To {
				case retry.StateRunning:
					once1.Do(func() { close(running) })
				case retry.StateReconnecting:
					once2.Do(func() { close(reconnecting) })
				}
			},
		}})
		require.NoError(t, err)
		c.Pause("")
		stop := runConsumer(t, c)
		<-running
		start := time.Now()
		broken.Store(true)
		<-reconnecting
		assert.LessOrEqual(t, time.Since(start), 10*time.Second, "noticed on the idle probe schedule")
		assert.Contains(t, c.Health().LastError, errBoom.Error())
		require.NoError(t, stop())
	})
}

// The messages whose last attempt fails in the moments before the trip are held, not dead-lettered:
// the outage dead-letters nothing, even when it begins while retries at their last attempt come due.
func TestOutageBeginningAtLastAttemptsDeadLettersNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newOutageRig(t, &retry.Options{MaxConcurrency: 1, MaxAttempts: 2,
			Outage: &outage.Options{ConsecutiveFailures: 10, FailureRate: -1}},
			func(*outageRig) error { return errBoom }) // down from the start
		sendN(r.b, 5)
		stop := runConsumer(t, r.c)
		time.Sleep(time.Minute)
		synctest.Wait()
		require.NoError(t, stop())
		h := r.c.Health()
		assert.Zero(t, h.DeadLettered)
		assert.Empty(t, r.b.DeadLettered())
		assert.Positive(t, h.Held)
	})
}

// A message failing alone at its last attempt (a bad message, not an outage) is held at most once,
// then dead-lettered as usual.
func TestALoneLastAttemptIsHeldOnceAtMost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newOutageRig(t, &retry.Options{MaxAttempts: 2, Outage: &outage.Options{ConsecutiveFailures: 10, FailureRate: -1, OpenFor: time.Minute}},
			func(*outageRig) error { return errBoom })
		sendN(r.b, 1)
		stop := runConsumer(t, r.c)
		require.NoError(t, r.b.WaitUntil(t.Context(), func() bool { return len(r.b.DeadLettered()) == 1 }))
		require.NoError(t, stop())
		h := r.c.Health()
		assert.LessOrEqual(t, h.Held, uint64(1))
		assert.Zero(t, h.Outage.Trips)
	})
}

// While the breaker is open no immediate retry calls the dependency: the failure is held at once.
func TestOpenBreakerSkipsImmediateRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newOutageRig(t, &retry.Options{ImmediateRetries: 3, Outage: &outage.Options{ConsecutiveFailures: 1, OpenFor: time.Minute}},
			func(*outageRig) error { return errBoom })
		sendN(r.b, 1)
		stop := runConsumer(t, r.c)
		synctest.Wait()
		require.NoError(t, stop())
		r.mu.Lock()
		assert.Equal(t, []int{1}, r.attempts["m-0"], "one call: the failure tripped the breaker")
		r.mu.Unlock()
		assert.Equal(t, uint64(1), r.c.Health().Held)
	})
}

// A receive loop that was waiting for a handler slot when the breaker opened receives nothing once the
// slot frees.
func TestNoReceiveAfterAPauseThatCameWhileWaitingForASlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		r := newOutageRig(t, &retry.Options{MaxConcurrency: 1, Prefetch: -1}, func(*outageRig) error {
			<-release
			return nil
		})
		sendN(r.b, 3)
		stop := runConsumer(t, r.c)
		synctest.Wait() // the first handler runs; the loop waits for its slot
		require.Equal(t, int64(1), r.msgs.Load())
		r.c.Pause("")
		close(release)
		synctest.Wait()
		assert.Equal(t, int64(1), r.msgs.Load(), "nothing received after the pause")
		assert.Zero(t, r.c.Health().Held)
		require.NoError(t, stop())
	})
}
