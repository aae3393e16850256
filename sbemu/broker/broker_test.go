package broker

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/Azure/go-amqp"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newTestBroker returns a broker on a mock clock, closed at test end.
func newTestBroker(t testing.TB, cfgs ...QueueConfig) (*Broker, *clock.Mock) {
	t.Helper()
	mock := clock.NewMock()
	b, err := New(Options{Clock: mock}, cfgs...)
	require.NoError(t, err)
	t.Cleanup(b.Close)
	return b, mock
}

// newTestQueue returns the single queue "q" configured by cfg (Name is set).
func newTestQueue(t testing.TB, cfg QueueConfig) (*Queue, *clock.Mock) {
	t.Helper()
	cfg.Name = "q"
	b, mock := newTestBroker(t, cfg)
	q, ok := b.Queue("q")
	require.True(t, ok)
	return q, mock
}

func newMsg(id any, body string) *amqp.Message {
	return &amqp.Message{
		Properties: &amqp.MessageProperties{MessageID: id},
		Data:       [][]byte{[]byte(body)},
	}
}

func mustSend(t testing.TB, q *Queue, m *amqp.Message) int64 {
	t.Helper()
	seq, dup, err := q.Send(m, 100)
	require.NoError(t, err)
	require.False(t, dup)
	return seq
}

func mustReceive(t testing.TB, q *Queue, mode Mode) *Delivery {
	t.Helper()
	d, ok := q.TryReceive(mode, 1)
	require.True(t, ok, "expected a message in %s", q.Name())
	return d
}

func body(d *Delivery) string { return string(d.Message.GetData()) }

type receiveResult struct {
	d   *Delivery
	err error
}

// receiveAsync starts a blocking Receive and waits until it is parked in the
// queue, so the test exercises the wake-up path rather than the fast path.
func receiveAsync(t *testing.T, ctx context.Context, q *Queue, mode Mode) <-chan receiveResult {
	t.Helper()
	ch := make(chan receiveResult, 1)
	before := waiters(q)
	go func() {
		d, err := q.Receive(ctx, mode, 1)
		ch <- receiveResult{d, err}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for waiters(q) <= before {
		require.True(t, time.Now().Before(deadline), "receiver never blocked")
		runtime.Gosched()
	}
	return ch
}

func waiters(q *Queue) int {
	q.b.mu.Lock()
	defer q.b.mu.Unlock()
	return q.waiters
}

// await waits for a result that a timer goroutine will produce.
func await(t *testing.T, ch <-chan receiveResult) receiveResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("receiver was not woken")
		return receiveResult{}
	}
}

func assertPending(t *testing.T, ch <-chan receiveResult) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("receiver returned early: %+v", r)
	default:
	}
}

func TestQueueLookup(t *testing.T) {
	b, _ := newTestBroker(t, QueueConfig{Name: "Orders"}, QueueConfig{Name: "jobs"})
	tests := []struct {
		name     string
		lookup   string
		wantName string
		wantOK   bool
	}{
		{"exact", "Orders", "Orders", true},
		{"other case", "oRDERS", "Orders", true},
		{"dead-letter canonical", "Orders/$DeadLetterQueue", "Orders/$DeadLetterQueue", true},
		{"dead-letter lower case", "orders/$deadletterqueue", "Orders/$DeadLetterQueue", true},
		{"unknown", "nope", "", false},
		{"dead-letter of unknown", "nope/$DeadLetterQueue", "", false},
		{"empty", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, ok := b.Queue(tt.lookup)
			require.Equal(t, tt.wantOK, ok)
			if ok {
				assert.Equal(t, tt.wantName, q.Name())
			}
		})
	}
	assert.Equal(t, []string{"Orders", "jobs"}, b.Queues())

	main, _ := b.Queue("orders")
	dlq, _ := b.Queue("orders/$DeadLetterQueue")
	assert.Same(t, main.dlq, dlq)
}

func TestNewDefaultsToRealClock(t *testing.T) {
	b, err := New(Options{}, QueueConfig{Name: "q"})
	require.NoError(t, err)
	defer b.Close()
	assert.NotNil(t, b.clock)
	empty, err := New(Options{})
	require.NoError(t, err)
	empty.Close()
	assert.Empty(t, empty.Queues())
}

func TestReleaseOwner(t *testing.T) {
	b, _ := newTestBroker(t, QueueConfig{Name: "a", MaxDeliveryCount: 2}, QueueConfig{Name: "b"})
	qa, _ := b.Queue("a")
	qb, _ := b.Queue("b")
	mustSend(t, qa, newMsg("a1", "a1"))
	mustSend(t, qa, newMsg("a2", "a2"))
	mustSend(t, qb, newMsg("b1", "b1"))

	const dropped, alive = 7, 8
	// a1 is delivered to the dropped owner twice, reaching MaxDeliveryCount 2.
	d, ok := qa.TryReceive(PeekLock, dropped)
	require.True(t, ok)
	require.Equal(t, "a1", body(d))
	b.ReleaseOwner(dropped)
	first, ok := qa.TryReceive(PeekLock, dropped)
	require.True(t, ok)
	require.Equal(t, "a1", body(first))
	assert.EqualValues(t, 1, first.Message.Header.DeliveryCount, "the dropped delivery counted")
	keep, ok := qa.TryReceive(PeekLock, alive)
	require.True(t, ok)
	other, ok := qb.TryReceive(PeekLock, dropped)
	require.True(t, ok)

	b.ReleaseOwner(dropped)

	assert.ErrorIs(t, qa.Complete(first.LockToken), ErrLockLost)
	assert.ErrorIs(t, qb.Complete(other.LockToken), ErrLockLost)
	require.NoError(t, qa.Complete(keep.LockToken), "locks of other owners survive")

	assert.Equal(t, Stats{DeadLettered: 1}, qa.Stats(), "a1 used up its deliveries")
	dlq, _ := b.Queue("a/$DeadLetterQueue")
	dl := mustReceive(t, dlq, PeekLock)
	assert.Equal(t, ReasonMaxDeliveryCountExceeded, dl.Message.ApplicationProperties[PropertyDeadLetterReason])

	again := mustReceive(t, qb, PeekLock)
	assert.Equal(t, "b1", body(again))
	assert.EqualValues(t, 1, again.Message.Header.DeliveryCount)
}

func TestExpireAllLocks(t *testing.T) {
	b, _ := newTestBroker(t, QueueConfig{Name: "a"}, QueueConfig{Name: "b"})
	qa, _ := b.Queue("a")
	qb, _ := b.Queue("b")
	mustSend(t, qa, newMsg("1", "a"))
	mustSend(t, qb, newMsg("2", "b"))
	da := mustReceive(t, qa, PeekLock)
	db := mustReceive(t, qb, PeekLock)

	b.ExpireAllLocks()

	assert.ErrorIs(t, qa.Complete(da.LockToken), ErrLockLost)
	_, err := qb.RenewLock(db.LockToken)
	assert.ErrorIs(t, err, ErrLockLost)
	again := mustReceive(t, qa, PeekLock)
	assert.Equal(t, da.SequenceNumber, again.SequenceNumber)
	assert.EqualValues(t, 1, again.Message.Header.DeliveryCount)
	assert.Equal(t, Stats{Active: 1}, qb.Stats())
}

func TestCloseUnblocksReceivers(t *testing.T) {
	b, _ := newTestBroker(t, QueueConfig{Name: "q"})
	q, _ := b.Queue("q")
	dlq, _ := b.Queue("q/$DeadLetterQueue")
	ctx := context.Background()
	r1 := receiveAsync(t, ctx, q, PeekLock)
	r2 := receiveAsync(t, ctx, q, ReceiveAndDelete)
	r3 := receiveAsync(t, ctx, dlq, PeekLock)

	b.Close()
	b.Close() // idempotent

	for _, ch := range []<-chan receiveResult{r1, r2, r3} {
		r := await(t, ch)
		assert.ErrorIs(t, r.err, ErrClosed)
		assert.Nil(t, r.d)
	}
}

func TestCallsAfterClose(t *testing.T) {
	b, _ := newTestBroker(t, QueueConfig{Name: "q"})
	q, _ := b.Queue("q")
	mustSend(t, q, newMsg("1", "x"))
	d := mustReceive(t, q, PeekLock)
	b.Close()

	tests := []struct {
		name string
		call func() error
	}{
		{"send", func() error { _, _, err := q.Send(newMsg("2", "y"), 1); return err }},
		{"schedule", func() error { _, err := q.Schedule(newMsg("3", "y"), 1, time.Unix(100, 0)); return err }},
		{"cancel", func() error { return q.CancelScheduled(1) }},
		{"receive", func() error { _, err := q.Receive(context.Background(), PeekLock, 1); return err }},
		{"complete", func() error { return q.Complete(d.LockToken) }},
		{"renew", func() error { _, err := q.RenewLock(d.LockToken); return err }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.ErrorIs(t, tt.call(), ErrClosed)
		})
	}
	_, ok := q.TryReceive(PeekLock, 1)
	assert.False(t, ok)
	assert.Equal(t, Stats{Locked: 1}, q.Stats(), "inspection still works")
	b.ReleaseOwner(1)
	b.ExpireAllLocks()
	assert.Len(t, q.Peek(0, 10), 1)
}
