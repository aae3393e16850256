//go:build !live

package e2e

// A dropped connection must not freeze the consumer or dead-letter finished work (issue 6, item 9),
// through the real SDK against the emulator, with the locks of a dropped connection released at once
// (KeepLocksOnDisconnect false: what the Service Bus documentation describes).

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// flowAfterDrop is the bound: after a drop, messages flow again within 5 s (default options).
const flowAfterDrop = 5 * time.Second

// messages returns messages with ids prefix-0 … prefix-(n-1), and the ids.
func messages(prefix string, n int) ([]*azservicebus.Message, []string) {
	var ms []*azservicebus.Message
	var ids []string
	for i := range n {
		id := fmt.Sprintf("%s-%d", prefix, i)
		ms = append(ms, sbtest.Message(id))
		ids = append(ids, id)
	}
	return ms, ids
}

// allCompleted holds when every id has been completed.
func allCompleted(ids ...string) func([]retry.ProcessedParams) bool {
	return func(ps []retry.ProcessedParams) bool {
		for _, id := range ids {
			if count(ps, id, retry.OutcomeCompleted) == 0 {
				return false
			}
		}
		return true
	}
}

// copiesWithID counts the scheduled and receivable messages whose MessageID is id.
func copiesWithID(q *broker.Queue, id string) int {
	n := 0
	for _, s := range q.ScheduledMessages() {
		if s.Message.Properties != nil && s.Message.Properties.MessageID == id {
			n++
		}
	}
	for _, m := range q.ActiveMessages() {
		if m.Properties != nil && m.Properties.MessageID == id {
			n++
		}
	}
	return n
}

// assertNoDeadLetters checks that nothing was dead-lettered, by the consumer or by the broker.
func assertNoDeadLetters(t *testing.T, e *env, out *sbtest.Outcomes) {
	t.Helper()
	assert.Zero(t, brokerQueue(t, e).Stats().DeadLettered, "nothing in the dead-letter queue")
	for _, p := range out.Snapshot() {
		assert.NotEqual(t, retry.OutcomeDeadLettered, p.Result.Outcome, "%s dead-lettered", p.Message.MessageID)
	}
}

// TestDropMidHandlerCompletesWithinSeconds (item 9a): handlers are mid-way when the connection drops,
// and their locks die with it. With default options (30 s settle timeout, the SDK's default retries),
// the consumer does not sit for a settle timeout on completes that can only fail: new messages flow at
// once, the redeliveries of the interrupted messages are completed without running the handler again
// (Result.Inherited), all within 5 s of the drop, and nothing is dead-lettered. Before the fix each
// handler slot was held by a settle stuck for the settle timeout, and the redeliveries ran the handler a
// second time.
func TestDropMidHandlerCompletesWithinSeconds(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{}) // 60 s locks, released when their connection drops
	const inFlight = 4
	dropped := make(chan struct{})
	release := sync.OnceFunc(func() { close(dropped) })
	entered := make(chan struct{}, 4*inFlight)
	var mu sync.Mutex
	runs := map[string]int{}
	out := sbtest.NewOutcomes()
	c := runConsumer(t, newConnector(t, e.connStr, e.queue, nil), func(_ context.Context, m *azservicebus.ReceivedMessage) error {
		mu.Lock()
		runs[m.MessageID]++
		mu.Unlock()
		select {
		case entered <- struct{}{}:
		default:
		}
		if strings.HasPrefix(m.MessageID, "before-") {
			<-dropped // mid-way when the connection drops; then it finishes its work
		}
		return nil
	}, &retry.Options{MaxConcurrency: inFlight, Hooks: retry.Hooks{OnProcessed: out.Hook}})
	t.Cleanup(release) // before the consumer stops, should the test fail early
	waitRunning(t, c)
	before, beforeIDs := messages("before", inFlight)
	e.send(t, before...)
	for range inFlight {
		select {
		case <-entered:
		case <-time.After(testTimeout):
			t.Fatal("the handlers did not start")
		}
	}

	drop := time.Now()
	e.em.DropConnections()
	release()
	after, afterIDs := messages("after", inFlight)
	e.send(t, after...)
	out.WaitFor(t, "new messages after the drop", allCompleted(afterIDs...))
	flowing := time.Since(drop)
	out.WaitFor(t, "every message completed", allCompleted(append(beforeIDs, afterIDs...)...))
	took := time.Since(drop)
	h := c.Health()
	t.Logf("after the drop: new messages completed in %v, all %d in %v; left for redelivery %d, receive failures %d, connects %d; %v",
		flowing.Round(time.Millisecond), 2*inFlight, took.Round(time.Millisecond), h.LeftForRedelivery, h.ReceiveFailures, h.Connects,
		sbtest.Summarize(out.Snapshot()))
	assert.LessOrEqual(t, took, flowAfterDrop, "every message completed within 5 s of the drop")

	mu.Lock()
	for _, id := range append(beforeIDs, afterIDs...) {
		assert.Equal(t, 1, runs[id], "handler runs of %s", id)
	}
	mu.Unlock()
	for _, p := range out.Snapshot() {
		if strings.HasPrefix(p.Message.MessageID, "before-") && p.Result.Outcome == retry.OutcomeCompleted {
			assert.True(t, p.Result.Inherited, "%s: the redelivery applied the decided outcome", p.Message.MessageID)
		}
	}
	require.Eventually(t, func() bool { return e.settled(t) }, testTimeout, 10*time.Millisecond)
	assertNoDeadLetters(t, e, out)
}

// TestDropAfterFailedAttemptKeepsOneSuccessor (item 9b): a handler fails as the connection drops; the
// retry copy is scheduled, and completing the original fails with the lost lock. The redelivered
// original then only completes (it inherits the decision, copy already scheduled): there is exactly one
// live successor of the attempt, with duplicate detection on, and also with it off, where nothing in the
// broker would absorb a second copy. The chain completes and nothing is dead-lettered, although the
// queue allows only two deliveries. Before the fix the redelivery ran the handler again and scheduled a
// second copy (absorbed only by duplicate detection).
func TestDropAfterFailedAttemptKeepsOneSuccessor(t *testing.T) {
	parallel(t)
	for _, dedup := range []bool{true, false} {
		t.Run(fmt.Sprintf("duplicate detection %v", dedup), func(t *testing.T) {
			parallel(t)
			e := startEmulator(t, sbemu.Config{Queues: []broker.QueueConfig{ordersQueue(dedup, 2)}}, "orders")
			// The copy must still be scheduled when the successors are counted: after a drop the SDK
			// retries the republish after 3.2-5.2 s (its default first retry delay, with jitter).
			const delay = 8 * time.Second
			dropped := make(chan struct{})
			release := sync.OnceFunc(func() { close(dropped) })
			entered := make(chan envelope.Envelope, 1)
			var mu sync.Mutex
			runs := map[int]int{} // handler runs per attempt
			out := sbtest.NewOutcomes()
			c := runConsumer(t, newConnector(t, e.connStr, e.queue, nil), func(ctx context.Context, _ *azservicebus.ReceivedMessage) error {
				env, _ := envelope.FromContext(ctx)
				mu.Lock()
				runs[env.Attempt]++
				first := runs[env.Attempt] == 1
				mu.Unlock()
				if env.Attempt > 1 {
					return nil
				}
				if first {
					entered <- env
					<-dropped
				}
				return errBoom
			}, &retry.Options{Backoff: backoff.Constant{Interval: delay}, Hooks: retry.Hooks{OnProcessed: out.Hook}})
			t.Cleanup(release)
			waitRunning(t, c)
			e.send(t, sbtest.Message("chain-1"))
			var env envelope.Envelope
			select {
			case env = <-entered:
			case <-time.After(testTimeout):
				t.Fatal("the handler did not start")
			}

			drop := time.Now()
			e.em.DropConnections()
			release()
			out.WaitFor(t, "attempt 1 settled", func(ps []retry.ProcessedParams) bool {
				for _, p := range ps {
					if p.Result.Attempt == 1 && p.Result.Outcome == retry.OutcomeRetryScheduled {
						return true
					}
				}
				return false
			})
			settled := time.Since(drop)
			successor := env.RetryMessageID(2)
			mu.Lock()
			successors := copiesWithID(brokerQueue(t, e), successor) + runs[2]
			mu.Unlock()
			assert.Equal(t, 1, successors, "live successors of attempt 1 (%s)", successor)

			out.WaitFor(t, "the chain completed", func(ps []retry.ProcessedParams) bool {
				return count(ps, "chain-1", retry.OutcomeCompleted) == 1
			})
			require.Eventually(t, func() bool { return e.settled(t) }, testTimeout, 10*time.Millisecond)
			mu.Lock()
			assert.Equal(t, 1, runs[2], "attempt 2 ran once: a second copy would have come due with the first")
			assert.LessOrEqual(t, runs[1], 2)
			attempt1 := runs[1]
			mu.Unlock()
			assertNoDeadLetters(t, e, out)
			var lostComplete, inherited bool
			for _, p := range out.Snapshot() {
				if p.Result.Attempt == 1 {
					lostComplete = lostComplete || p.Result.PossibleDuplicate
					inherited = inherited || p.Result.Inherited
				}
			}
			t.Logf("attempt 1 settled %v after the drop; handler runs of attempt 1: %d; complete lost after the schedule: %v; redelivery inherited: %v; %v",
				settled.Round(time.Millisecond), attempt1, lostComplete, inherited, sbtest.Summarize(out.Snapshot()))
			if lostComplete {
				assert.True(t, inherited, "the redelivery completed the original without running the handler")
				assert.Equal(t, 1, attempt1)
			}
		})
	}
}

// TestDropNeverRunsAMessageTwiceAtOnce (item 9c): handlers that cannot be interrupted are still running
// when the connection drops and the broker redelivers their messages to the same consumer. The
// redeliveries wait for the earlier handling instead of starting a second handler of the same message;
// the earlier handlers learn that their lock is gone (ctx cause ErrLockLost), and their finished work
// is completed by the redeliveries without running the handler again.
func TestDropNeverRunsAMessageTwiceAtOnce(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{})
	const n = 3
	finish := make(chan struct{})
	release := sync.OnceFunc(func() { close(finish) })
	entered := make(chan context.Context, 4*n)
	var (
		mu        sync.Mutex
		active    = map[string]int{}
		runs      = map[string]int{}
		maxActive int
		lockLost  atomic.Int32
	)
	out := sbtest.NewOutcomes()
	c := runConsumer(t, newConnector(t, e.connStr, e.queue, nil), func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		id := m.MessageID
		mu.Lock()
		active[id]++
		runs[id]++
		maxActive = max(maxActive, active[id])
		mu.Unlock()
		defer func() {
			mu.Lock()
			active[id]--
			mu.Unlock()
		}()
		select {
		case entered <- ctx:
		default:
		}
		<-finish // work that ignores its context
		if errors.Is(context.Cause(ctx), retry.ErrLockLost) {
			lockLost.Add(1)
		}
		return nil
	}, &retry.Options{MaxConcurrency: 2*n + 2, Hooks: retry.Hooks{OnProcessed: out.Hook}})
	t.Cleanup(release)
	waitRunning(t, c)
	msgs, ids := messages("busy", n)
	e.send(t, msgs...)
	first := make([]context.Context, 0, n)
	for range n {
		select {
		case ctx := <-entered:
			first = append(first, ctx)
		case <-time.After(testTimeout):
			t.Fatal("the handlers did not start")
		}
	}

	drop := time.Now()
	e.em.DropConnections()
	// A redelivery is counted as received before its worker finds the earlier handling and ends its
	// lock, so wait for the first handlers' contexts to end rather than for the count: releasing them
	// in between would let a handler finish before it learns that its lock is gone.
	deadline := time.NewTimer(testTimeout)
	defer deadline.Stop()
	for _, ctx := range first {
		select {
		case <-ctx.Done():
		case <-deadline.C:
			mu.Lock()
			most := maxActive
			mu.Unlock()
			t.Fatalf("a first handler's context did not end after the drop (received %d, handlers of one message at once %d)",
				c.Health().Received, most)
		}
	}
	superseded := time.Since(drop)
	assert.GreaterOrEqual(t, c.Health().Received, uint64(2*n), "the redeliveries reached the consumer while the first handlers still ran")
	release()
	out.WaitFor(t, "every message completed", allCompleted(ids...))

	mu.Lock()
	assert.Equal(t, 1, maxActive, "handlers of one message at once")
	for _, id := range ids {
		assert.Equal(t, 1, runs[id], "handler runs of %s", id)
	}
	mu.Unlock()
	assert.Equal(t, int32(n), lockLost.Load(), "each interrupted handler saw ErrLockLost as its context's cause")
	for _, p := range out.Snapshot() {
		if p.Result.Outcome == retry.OutcomeCompleted {
			assert.True(t, p.Result.Inherited, "%s completed by its redelivery", p.Message.MessageID)
		}
	}
	require.Eventually(t, func() bool { return e.settled(t) }, testTimeout, 10*time.Millisecond)
	assertNoDeadLetters(t, e, out)
	t.Logf("first handlers superseded by their redeliveries %v after the drop; %v", superseded.Round(time.Millisecond), sbtest.Summarize(out.Snapshot()))
}

// TestDropDoesNotHoldNewMessagesBehindARepublish (item 9a, with a failing message in flight): when the
// connection drops just as a handler fails, the republish of its retry copy goes through the SDK's
// recovery, whose first retry waits 3.2-5.2 s with default options. A message that has nothing to do
// with it, sent right after the drop, must not wait for that republish: new messages flow again at once
// (and within 5 s), and the unrelated message is completed before the republished original is settled.
func TestDropDoesNotHoldNewMessagesBehindARepublish(t *testing.T) {
	parallel(t)
	e := newEnv(t, queueSettings{})
	dropped := make(chan struct{})
	release := sync.OnceFunc(func() { close(dropped) })
	entered := make(chan struct{}, 1)
	out := sbtest.NewOutcomes()
	c := runConsumer(t, newConnector(t, e.connStr, e.queue, nil), func(_ context.Context, m *azservicebus.ReceivedMessage) error {
		if m.MessageID != "failing" {
			return nil
		}
		select {
		case entered <- struct{}{}:
			<-dropped
		default:
		}
		return errBoom
	}, &retry.Options{Backoff: backoff.Constant{Interval: time.Hour}, Hooks: retry.Hooks{OnProcessed: out.Hook}})
	t.Cleanup(release)
	waitRunning(t, c)
	e.send(t, sbtest.Message("failing"))
	select {
	case <-entered:
	case <-time.After(testTimeout):
		t.Fatal("the handler did not start")
	}

	drop := time.Now()
	e.em.DropConnections()
	release()
	e.send(t, sbtest.Message("bystander"))
	out.WaitFor(t, "the bystander completed", allCompleted("bystander"))
	flowing := time.Since(drop)
	out.WaitFor(t, "the failing message's retry scheduled", func(ps []retry.ProcessedParams) bool {
		return count(ps, "failing", retry.OutcomeRetryScheduled) == 1
	})
	republished := time.Since(drop)
	ps := out.Snapshot()
	t.Logf("after the drop: bystander completed in %v, the failing message's retry settled in %v; %v",
		flowing.Round(time.Millisecond), republished.Round(time.Millisecond), sbtest.Summarize(ps))
	assert.LessOrEqual(t, flowing, flowAfterDrop, "new messages flow within 5 s of the drop")
	var order []string
	for _, p := range ps {
		if p.Result.Outcome == retry.OutcomeCompleted || p.Result.Outcome == retry.OutcomeRetryScheduled {
			order = append(order, p.Envelope.Key)
		}
	}
	assert.Equal(t, []string{"bystander", "failing"}, order,
		"the bystander did not wait for the republish of an unrelated message")
	assertNoDeadLetters(t, e, out)
}
