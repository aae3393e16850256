package retryindex

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
)

// fakePeeker serves msgs by sequence number, or fails while failing is set.
type fakePeeker struct {
	msgs    []*azservicebus.ReceivedMessage
	failing *atomic.Bool
	peeks   *atomic.Int64
}

var errUnreachable = errors.New("namespace unreachable")

func (f fakePeeker) PeekMessages(_ context.Context, n int, o *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	f.peeks.Add(1)
	if f.failing.Load() {
		return nil, errUnreachable
	}
	var out []*azservicebus.ReceivedMessage
	for _, m := range f.msgs {
		if *m.SequenceNumber >= *o.FromSequenceNumber && len(out) < n {
			out = append(out, m)
		}
	}
	return out, nil
}

func (fakePeeker) Close(context.Context) error { return nil }

// TestTailerRunPollsEveryInterval: Run polls at once and then every interval, reports a failed poll
// and goes on, tells OnPoll what each good poll read, and returns when its context ends.
func TestTailerRunPollsEveryInterval(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s, _ := openTemp(t, nil)
		failing, peeks := &atomic.Bool{}, &atomic.Int64{}
		seq := int64(1)
		due := time.Now().Add(time.Hour)
		env := envOf("order-1", 1)
		copyMsg := &azservicebus.ReceivedMessage{MessageID: env.RetryMessageID(2), SequenceNumber: &seq, State: azservicebus.MessageStateScheduled,
			ScheduledEnqueueTime: &due, ApplicationProperties: map[string]any{"sbretry-attempt": int64(2), "sbretry-source": "orders",
				"sbretry-first-sequence-number": int64(1), "sbretry-original-message-id": "order-1"}}
		var polls []TailResult
		opts := &TailerOptions{OnPoll: func(r TailResult) { polls = append(polls, r) }}
		tl, err := newTailer(s, "orders", opts, func(path string) (peeker, error) {
			if path == "orders" {
				return fakePeeker{msgs: []*azservicebus.ReceivedMessage{copyMsg}, failing: failing, peeks: peeks}, nil
			}
			return fakePeeker{failing: failing, peeks: peeks}, nil
		})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		var errs []error
		done := make(chan error, 1)
		go func() { done <- tl.Run(ctx, time.Minute, func(err error) { errs = append(errs, err) }) }()
		synctest.Wait()
		first := peeks.Load()
		assert.Positive(t, first, "the first poll at once")
		ans, err := s.Lookup(context.Background(), "order-1", nil)
		require.NoError(t, err)
		require.Len(t, ans.Events, 1)
		assert.Equal(t, StatePending, ans.Events[0].State)
		require.Len(t, polls, 1)
		assert.Equal(t, 1, polls[0].Recorded)
		assert.Equal(t, 1, polls[0].Peeked["orders"])

		failing.Store(true)
		time.Sleep(time.Minute) // the fake clock of the bubble: the next interval
		synctest.Wait()
		require.Len(t, errs, 1)
		assert.ErrorIs(t, errs[0], errUnreachable)
		failing.Store(false)
		time.Sleep(time.Minute)
		synctest.Wait()
		assert.Len(t, errs, 1, "a good poll reports nothing")
		require.Len(t, polls, 2, "OnPoll hears of the good polls only")
		assert.Zero(t, polls[1].Recorded, "nothing new")

		cancel()
		assert.ErrorIs(t, <-done, context.Canceled)
		assert.ErrorIs(t, tl.Run(context.Background(), 0, nil), ErrInvalidOptions)
	})
}
