package dlqaction

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry/internal/sbtest"
)

// fakeDLQ delivers its messages in order, batch by batch, then blocks until the receive's context
// ends, as the SDK does on an empty queue.
type fakeDLQ struct {
	queue     []*azservicebus.ReceivedMessage
	completed []int64
	abandoned []int64
	failOn    int64 // CompleteMessage fails for this sequence number
	asks      []int // maxMessages of each receive
	maxBatch  int   // when set, a receive returns at most this many, as a receive cut short by its wait
}

func (f *fakeDLQ) ReceiveMessages(ctx context.Context, n int, _ *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	f.asks = append(f.asks, n)
	if len(f.queue) == 0 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	n = min(n, len(f.queue))
	if f.maxBatch > 0 {
		n = min(n, f.maxBatch)
	}
	out := f.queue[:n]
	f.queue = f.queue[n:]
	return out, nil
}

func (f *fakeDLQ) CompleteMessage(_ context.Context, m *azservicebus.ReceivedMessage, _ *azservicebus.CompleteMessageOptions) error {
	if *m.SequenceNumber == f.failOn {
		return errors.New("lock lost")
	}
	f.completed = append(f.completed, *m.SequenceNumber)
	return nil
}

func (f *fakeDLQ) AbandonMessage(_ context.Context, m *azservicebus.ReceivedMessage, _ *azservicebus.AbandonMessageOptions) error {
	f.abandoned = append(f.abandoned, *m.SequenceNumber)
	return nil
}

func fakeMessages(seqs ...int64) []*azservicebus.ReceivedMessage {
	out := make([]*azservicebus.ReceivedMessage, len(seqs))
	for i, s := range seqs {
		out[i] = &azservicebus.ReceivedMessage{SequenceNumber: &s}
	}
	return out
}

func seqRange(from, to int64) []int64 {
	var out []int64
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}

func TestDrain(t *testing.T) {
	t.Parallel()
	complete := func(f *fakeDLQ) func(context.Context, *azservicebus.ReceivedMessage) error {
		return func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
			return f.CompleteMessage(ctx, m, nil)
		}
	}
	t.Run("completes exactly the selection and abandons the rest", func(t *testing.T) {
		f := &fakeDLQ{queue: fakeMessages(1, 2, 3, 4, 5, 6)}
		var progress []int
		done, missing, left, err := drain(context.Background(), f, []int64{2, 5}, time.Second, 100, "--max-peek", complete(f), func(d int) { progress = append(progress, d) })
		require.NoError(t, err)
		assert.Equal(t, 2, done)
		assert.Empty(t, missing)
		assert.Equal(t, []int64{2, 5}, f.completed)
		assert.ElementsMatch(t, []int64{1, 3, 4}, f.abandoned, "received on the way, released untouched; 6 never asked for")
		assert.Empty(t, left, "the last receive got all it asked for: no credit left, so given back through the receiver")
		assert.Equal(t, []int{1, 2}, progress)
	})
	t.Run("selected messages that never come are reported missing", func(t *testing.T) {
		f := &fakeDLQ{queue: fakeMessages(1, 2)}
		done, missing, left, err := drain(context.Background(), f, []int64{2, 9}, 20*time.Millisecond, 100, "--max-peek", complete(f), func(int) {})
		require.NoError(t, err)
		assert.Equal(t, 1, done)
		assert.Equal(t, []int64{9}, missing)
		assert.Empty(t, f.abandoned, "the receive that waited in vain left its credit on the link")
		assert.Equal(t, []int64{1}, seqsOf(left), "left for the caller to give back once the receiver is closed")
	})
	t.Run("the first failure stops and releases everything held", func(t *testing.T) {
		f := &fakeDLQ{queue: fakeMessages(1, 2, 3, 4), failOn: 2}
		done, _, left, err := drain(context.Background(), f, []int64{2, 3}, time.Second, 100, "--max-peek", complete(f), func(int) {})
		assert.ErrorContains(t, err, "dead letter 2: lock lost")
		assert.Equal(t, 0, done)
		assert.Empty(t, f.completed)
		assert.ElementsMatch(t, []int64{1, 2}, f.abandoned, "the receive asked for two: 3 and 4 were never received")
		assert.Empty(t, left)
	})
	t.Run("a failure after a receive cut short leaves what it held to the caller", func(t *testing.T) {
		f := &fakeDLQ{queue: fakeMessages(1, 2, 3, 4), failOn: 2, maxBatch: 1}
		_, _, left, err := drain(context.Background(), f, []int64{2, 3}, time.Second, 100, "--max-peek", complete(f), func(int) {})
		assert.ErrorContains(t, err, "dead letter 2: lock lost")
		assert.Empty(t, f.abandoned, "the receive of 2 asked for two and got one: credit is left on the link")
		assert.ElementsMatch(t, []int64{1, 2}, seqsOf(left))
	})
	t.Run("a receive asks for no more than the selected dead letters still to come", func(t *testing.T) {
		// Credit a receive leaves unused stays on the link: the broker would send on it the messages
		// abandoned at the end, and one in flight when the receiver closes stays locked.
		f := &fakeDLQ{queue: fakeMessages(seqRange(1, 120)...)}
		done, _, left, err := drain(context.Background(), f, []int64{2, 3, 60, 110}, time.Second, 200, "--max-peek", complete(f), func(int) {})
		require.NoError(t, err)
		assert.Equal(t, 4, done)
		assert.Equal(t, []int{4, 50, 50, 1, 1, 1, 1, 1, 1}, f.asks,
			"1..4; then whole batches while 110 is more than a batch beyond the highest received (4, then 54); then one at a time, 110 alone at the end")
		assert.Equal(t, 110, len(f.abandoned)+len(f.completed), "nothing after 110 was received")
		assert.Empty(t, left)
	})
	t.Run("a receive asks for no more than the batch nor the holds left", func(t *testing.T) {
		f := &fakeDLQ{queue: fakeMessages(seqRange(1, 200)...)}
		want := seqRange(100, 200)
		_, _, left, err := drain(context.Background(), f, want, time.Second, 130, "--max-peek", complete(f), func(int) {})
		require.NoError(t, err)
		assert.Equal(t, []int{50, 50, 31}, f.asks[:3], "99 held after two batches, 130 allowed")
		assert.Empty(t, left)
	})
	t.Run("holding is bounded", func(t *testing.T) {
		f := &fakeDLQ{queue: fakeMessages(1, 2, 3, 4, 5)}
		_, _, left, err := drain(context.Background(), f, []int64{5}, time.Second, 2, "--max-peek", complete(f), func(int) {})
		assert.ErrorContains(t, err, "received 2 other dead letters")
		assert.Empty(t, f.completed)
		assert.ElementsMatch(t, []int64{1, 2}, f.abandoned)
		assert.Empty(t, left)
	})
	t.Run("a cancelled context stops it", func(t *testing.T) {
		f := &fakeDLQ{}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, _, left, err := drain(ctx, f, []int64{1}, time.Second, 10, "--max-peek", complete(f), func(int) {})
		assert.ErrorIs(t, err, context.Canceled)
		assert.Empty(t, left)
	})
}

func seqsOf(ms []*azservicebus.ReceivedMessage) []int64 {
	var out []int64
	for _, m := range ms {
		out = append(out, *m.SequenceNumber)
	}
	return out
}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, sbtest.IgnoreSDKLeak())
}
