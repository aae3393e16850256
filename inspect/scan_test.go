package inspect

import (
	"context"
	"encoding/base64"
	"errors"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
)

// fakeEntity is an in-memory entity whose peek replies hold at most replyCap messages, as Service Bus
// caps replies by size.
type fakeEntity struct {
	msgs     []*azservicebus.ReceivedMessage // in sequence order
	replyCap int
	err      error
	calls    int
	closed   int
}

func (f *fakeEntity) PeekMessages(_ context.Context, n int, o *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	f.calls++
	if f.err != nil {
		return nil, f.err
	}
	var out []*azservicebus.ReceivedMessage
	for _, m := range f.msgs {
		if *m.SequenceNumber >= *o.FromSequenceNumber && len(out) < min(n, f.replyCap) {
			out = append(out, m)
		}
	}
	return out, nil
}

func (f *fakeEntity) Close(context.Context) error { f.closed++; return nil }

type fakeLinks struct{ live, dead *fakeEntity }

func (l *fakeLinks) peeker(s source) (peeker, error) {
	if s == sourceDeadLetter {
		return l.dead, nil
	}
	return l.live, nil
}

func (l *fakeLinks) canceller(source) (canceller, error) { return nil, errors.New("not in this test") }

func scheduledCopy(seq int64, key string, due time.Time) *azservicebus.ReceivedMessage {
	id := "copy-" + key
	return &azservicebus.ReceivedMessage{
		MessageID:             id,
		SequenceNumber:        &seq,
		State:                 azservicebus.MessageStateScheduled,
		ScheduledEnqueueTime:  &due,
		ApplicationProperties: map[string]any{envelope.PropAttempt: int64(2), envelope.PropKey: key, envelope.PropOriginalMessageID: key},
	}
}

// TestScanShortRepliesAreNotTheEnd: a reply shorter than asked for (Service Bus caps replies by size)
// must not end the scan; only an empty one does.
func TestScanShortRepliesAreNotTheEnd(t *testing.T) {
	live := &fakeEntity{replyCap: 3}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 10 {
		// Sequence numbers with gaps, due times in reverse.
		live.msgs = append(live.msgs, scheduledCopy(int64(5+i*3), "k", base.Add(time.Duration(10-i)*time.Minute)))
	}
	probe := scheduledCopy(100, "probe", base)
	probe.ApplicationProperties[retry.PropProbe] = retry.ProbeValue
	live.msgs = append(live.msgs, probe)
	in := newInspector(Entity{Queue: "q"}, Options{MaxPeek: 100, PeekBatchSize: 50}, &fakeLinks{live: live, dead: &fakeEntity{replyCap: 1}})
	page, err := in.ListPending(context.Background(), PageOptions{Limit: 4})
	require.NoError(t, err)
	assert.Equal(t, Scan{Entity: "q", Peeked: 11, Requests: 5}, page.Scans[0])
	require.Len(t, page.Items, 4)
	assert.Equal(t, []int64{32, 29, 26, 23}, []int64{page.Items[0].SequenceNumber, page.Items[1].SequenceNumber, page.Items[2].SequenceNumber, page.Items[3].SequenceNumber}, "earliest due first; the probe is skipped")
	assert.NotEmpty(t, page.Next)
	assert.Equal(t, 1, live.closed, "every link the call opened is closed")
}

func TestScanErrorsAreWrapped(t *testing.T) {
	sbErr := &azservicebus.Error{Code: azservicebus.CodeUnauthorizedAccess}
	in := newInspector(Entity{Queue: "q"}, Options{MaxPeek: 10, PeekBatchSize: 5}, &fakeLinks{live: &fakeEntity{err: sbErr}, dead: &fakeEntity{}})
	_, err := in.Status(context.Background(), "k")
	var got *azservicebus.Error
	require.ErrorAs(t, err, &got)
	assert.Equal(t, azservicebus.CodeUnauthorizedAccess, got.Code)
}

func TestScanRefusesRepliesThatDoNotAdvance(t *testing.T) {
	// A reply whose messages carry no sequence number would be asked for again forever.
	in := newInspector(Entity{Queue: "q"}, Options{MaxPeek: 10, PeekBatchSize: 5}, &stuckLinks{m: &azservicebus.ReceivedMessage{MessageID: "no-seq"}})
	_, err := in.Status(context.Background(), "k")
	assert.ErrorContains(t, err, "without sequence numbers")
}

type stuckLinks struct{ m *azservicebus.ReceivedMessage }

func (s *stuckLinks) peeker(source) (peeker, error)       { return s, nil }
func (s *stuckLinks) canceller(source) (canceller, error) { return nil, errors.New("unused") }
func (s *stuckLinks) PeekMessages(context.Context, int, *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	return []*azservicebus.ReceivedMessage{s.m}, nil
}
func (s *stuckLinks) Close(context.Context) error { return nil }

// TestSubscriptionNeedsRetryQueue: an inspector of a subscription alone would answer "nothing pending"
// for the retry queue it never read.
func TestSubscriptionNeedsRetryQueue(t *testing.T) {
	client, err := azservicebus.NewClientFromConnectionString("Endpoint=sb://127.0.0.1:1/;SharedAccessKeyName=k;SharedAccessKey=x;UseDevelopmentEmulator=true", nil)
	require.NoError(t, err)
	defer func() { _ = client.Close(context.Background()) }()
	_, err = New(client, "events/Subscriptions/billing", nil)
	assert.ErrorIs(t, err, ErrNoRetryQueue)
	assert.ErrorContains(t, err, "Options.RetryQueue")
	in, err := New(client, "events/Subscriptions/billing", &Options{RetryQueue: "billing-retry"})
	require.NoError(t, err)
	assert.Equal(t, []string{"events/Subscriptions/billing/$DeadLetterQueue", "billing-retry/$DeadLetterQueue"}, in.DeadLetterQueues())
	assert.Equal(t, []string{"billing-retry"}, in.RetryEntities())
	q, err := New(client, "orders", nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"orders/$DeadLetterQueue"}, q.DeadLetterQueues())
	assert.Equal(t, []string{"orders"}, q.RetryEntities())

	// A subscription a session consumer consumes has no retry queue: everything is in it.
	ss, err := New(client, "events/Subscriptions/billing", &Options{SessionConsumer: true})
	require.NoError(t, err)
	assert.Equal(t, []string{"events/Subscriptions/billing/$DeadLetterQueue"}, ss.DeadLetterQueues())
	assert.Empty(t, ss.RetryEntities())
	_, err = ss.Cancel(t.Context(), Ref{SequenceNumber: 7})
	assert.ErrorIs(t, err, ErrUnknownEntity)
	assert.ErrorContains(t, err, "holds retries in the session")
	_, err = New(client, "events/Subscriptions/billing", &Options{SessionConsumer: true, RetryQueue: "billing-retry"})
	assert.ErrorIs(t, err, ErrInvalidOptions)
	// Its entity requires sessions: the calls that would peek it say so, and read nothing.
	_, err = ss.ListPending(t.Context(), PageOptions{})
	assert.ErrorIs(t, err, ErrSessionEntity)
	_, err = ss.Status(t.Context(), "order-42")
	assert.ErrorIs(t, err, ErrSessionEntity)
	_, err = ss.Counts(t.Context())
	assert.ErrorIs(t, err, ErrSessionEntity)
	// A session queue alike: nothing to cancel, and the queue is not peeked.
	sq, err := New(client, "jobs", &Options{SessionConsumer: true})
	require.NoError(t, err)
	assert.Empty(t, sq.RetryEntities())
	assert.Equal(t, []string{"jobs/$DeadLetterQueue"}, sq.DeadLetterQueues())
	_, err = sq.Cancel(t.Context(), Ref{SequenceNumber: 7})
	assert.ErrorIs(t, err, ErrUnknownEntity)
	_, err = sq.Status(t.Context(), "order-42")
	assert.ErrorIs(t, err, ErrSessionEntity)
}

// TestCursorRoundTrip: a cursor names its item's due time exactly, also past the year 2262, where Unix
// nanoseconds (the version 1 format) overflow an int64: the year-9000 retry any producer can schedule
// came back from its cursor as a date in 1677 or so, and the next page repeated items.
func TestCursorRoundTrip(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		due  time.Time
	}{
		{"now-ish", time.Date(2026, 3, 4, 5, 6, 7, 8, time.UTC)},
		{"year 9000", time.Date(9000, 1, 1, 0, 0, 0, 999_999_999, time.UTC)},
		{"past 2262", time.Date(2262, 4, 12, 0, 0, 0, 1, time.UTC)},
		{"before 1678", time.Date(1600, 1, 1, 0, 0, 0, 5, time.UTC)},
		{"zero", time.Time{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := Pending{Entity: "q|with|bars", SequenceNumber: 42, DueTime: tc.due}
			got, err := decodeCursor(encodeCursor(p))
			require.NoError(t, err)
			assert.Equal(t, 0, comparePending(p, got))
			assert.True(t, tc.due.Equal(got.DueTime), "due %v came back as %v", tc.due, got.DueTime)
			assert.Equal(t, p.Entity, got.Entity)
		})
	}
	// A version 1 cursor, handed out before an upgrade, still reads.
	v1 := base64.RawURLEncoding.EncodeToString([]byte("1|1772600767000000008|42|orders"))
	got, err := decodeCursor(v1)
	require.NoError(t, err)
	assert.Equal(t, Pending{Entity: "orders", SequenceNumber: 42, DueTime: time.Unix(0, 1772600767000000008)}, got)
	for _, bad := range []string{"!!", "MnwxfDI", encodeCursor(Pending{Entity: "q"})[:5],
		base64.RawURLEncoding.EncodeToString([]byte("2|1|1000000000|4|q")), // nanoseconds beyond a second
		base64.RawURLEncoding.EncodeToString([]byte("2|1|-1|4|q")),
		base64.RawURLEncoding.EncodeToString([]byte("3|1|1|4|q")),
	} {
		_, err := decodeCursor(bad)
		assert.ErrorIs(t, err, ErrInvalidCursor, bad)
	}
}

// FuzzDecodeCursor: whatever a client sends as a cursor, decodeCursor returns a position or
// ErrInvalidCursor, and a position it returns encodes to a cursor that decodes to the same position.
func FuzzDecodeCursor(f *testing.F) {
	f.Add(encodeCursor(Pending{Entity: "orders", SequenceNumber: 7, DueTime: time.Date(9000, 1, 1, 0, 0, 0, 0, time.UTC)}))
	f.Add(base64.RawURLEncoding.EncodeToString([]byte("1|1772600767000000008|42|orders")))
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := decodeCursor(s)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidCursor)
			return
		}
		again, err := decodeCursor(encodeCursor(p))
		require.NoError(t, err)
		require.Equal(t, 0, comparePending(p, again))
		require.Equal(t, p.Entity, again.Entity)
	})
}
