package inspect

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/sbtest"
)

func TestParseRef(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		want Ref
		bad  bool
	}{
		{in: "17", want: Ref{SequenceNumber: 17}},
		{in: " 17 ", want: Ref{SequenceNumber: 17}},
		{in: "billing-retry/$DeadLetterQueue:17", want: Ref{Entity: "billing-retry/$DeadLetterQueue", SequenceNumber: 17}},
		{in: "events/Subscriptions/billing:0", want: Ref{Entity: "events/Subscriptions/billing", SequenceNumber: 0}},
		{in: ":17", bad: true},
		{in: "q:", bad: true},
		{in: "q:-1", bad: true},
		{in: "q:x", bad: true},
		{in: "", bad: true},
		{in: "-3", bad: true},
		{in: "billing-retry/:6", bad: true}, // an unquoted $DeadLetterQueue, emptied by the shell
		{in: "events//billing:6", bad: true},
	}
	for _, tc := range cases {
		got, err := ParseRef(tc.in)
		if tc.bad {
			assert.ErrorIs(t, err, ErrInvalidRef, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
		again, err := ParseRef(got.String())
		require.NoError(t, err)
		assert.Equal(t, got, again, "String is what ParseRef reads")
	}
}

// subscriptionLayout seeds the README's subscription layout so that sequence numbers collide: perm-1
// is dead-lettered at its first attempt from the subscription, max-1 after its retry from the retry
// queue, and each is number 1 of its own dead-letter queue; pending-1 waits in the retry queue.
func subscriptionLayout(t *testing.T) (*sbtest.Harness, *Inspector, DeadLetter, DeadLetter) {
	t.Helper()
	h := sbtest.NewSubscription(t)
	h.Seed(t, "perm-1", "max-1", "pending-1")
	in, err := New(h.Client, sbtest.SubscriptionPath, &Options{RetryQueue: sbtest.RetryQueue})
	require.NoError(t, err)
	list, err := in.DeadLetters(sbtest.Context(t), DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, list.Items, 2)
	sub, rq := list.Items[0], list.Items[1]
	require.Equal(t, sbtest.SubscriptionPath+"/$DeadLetterQueue", sub.Entity)
	require.Equal(t, sbtest.RetryQueue+"/$DeadLetterQueue", rq.Entity)
	require.Equal(t, sub.SequenceNumber, rq.SequenceNumber, "the layout must collide for this test to mean anything")
	require.Equal(t, "perm-1", sub.OriginalMessageID())
	require.Equal(t, "max-1", rq.OriginalMessageID())
	return h, in, sub, rq
}

// TestRefsNameTheEntity: in the subscription layout the two dead-letter queues both hold a number 1;
// every lookup and selection by Ref finds the one named, a bare number is refused as ambiguous, and an
// entity the inspector does not read is refused.
func TestRefsNameTheEntity(t *testing.T) {
	t.Parallel()
	_, in, sub, rq := subscriptionLayout(t)
	ctx := sbtest.Context(t)

	for _, want := range []DeadLetter{sub, rq} {
		got, err := in.DeadLetter(ctx, want.Ref())
		require.NoError(t, err)
		assert.Equal(t, want.MessageID, got.MessageID)
		assert.Equal(t, want.Entity, got.Entity)

		list, err := in.DeadLetters(ctx, DeadLetterFilter{Refs: []Ref{want.Ref()}})
		require.NoError(t, err)
		require.Len(t, list.Items, 1)
		assert.Equal(t, want.MessageID, list.Items[0].MessageID)
		assert.Empty(t, list.Missing)
	}
	// Case as an operator might type it.
	upper := Ref{Entity: "BILLING-RETRY/$DEADLETTERQUEUE", SequenceNumber: rq.SequenceNumber}
	got, err := in.DeadLetter(ctx, upper)
	require.NoError(t, err)
	assert.Equal(t, rq.MessageID, got.MessageID)

	bare := Ref{SequenceNumber: sub.SequenceNumber}
	_, err = in.DeadLetter(ctx, bare)
	assert.ErrorIs(t, err, ErrAmbiguousRef)
	assert.ErrorContains(t, err, sub.Ref().String())
	assert.ErrorContains(t, err, rq.Ref().String())
	_, err = in.DeadLetters(ctx, DeadLetterFilter{Refs: []Ref{bare}})
	assert.ErrorIs(t, err, ErrAmbiguousRef)

	// The retry queue itself is not a dead-letter queue: a pending retry's ref never selects a dead
	// letter with the same number.
	_, err = in.DeadLetter(ctx, Ref{Entity: sbtest.RetryQueue, SequenceNumber: rq.SequenceNumber})
	assert.ErrorIs(t, err, ErrUnknownEntity)
	_, err = in.DeadLetter(ctx, Ref{Entity: "orders/$DeadLetterQueue", SequenceNumber: 1})
	assert.ErrorIs(t, err, ErrUnknownEntity)

	gone := Ref{Entity: rq.Entity, SequenceNumber: rq.SequenceNumber + 100}
	list, err := in.DeadLetters(ctx, DeadLetterFilter{Refs: []Ref{rq.Ref(), gone}})
	require.NoError(t, err)
	require.Len(t, list.Items, 1)
	assert.Equal(t, []Ref{gone}, list.Missing)
}

// TestFirstAttemptDeadLetterKeepsItsKey: a message dead-lettered at its first attempt carries no
// envelope of its own; the consumer records its key and correlation id on the dead letter.
func TestFirstAttemptDeadLetterKeepsItsKey(t *testing.T) {
	t.Parallel()
	_, _, sub, rq := subscriptionLayout(t)
	assert.Equal(t, 1, sub.Attempt)
	assert.Equal(t, "perm-1", sub.Key)
	assert.Equal(t, "corr-perm-1", sub.CorrelationID)
	assert.Equal(t, "max-1", rq.Key)
	assert.Equal(t, "corr-max-1", rq.CorrelationID)
}

// TestCancelInTheSubscriptionLayout: pending retries are in the retry queue, which a bare number
// names; the subscription holds none.
func TestCancelInTheSubscriptionLayout(t *testing.T) {
	t.Parallel()
	h, in, _, _ := subscriptionLayout(t)
	ctx := sbtest.Context(t)
	st, err := in.Status(ctx, "pending-1")
	require.NoError(t, err)
	require.Len(t, st.Pending, 1)
	p := st.Pending[0]
	assert.Equal(t, sbtest.RetryQueue, p.Entity)

	_, err = in.Cancel(ctx, Ref{Entity: sbtest.SubscriptionPath, SequenceNumber: p.SequenceNumber})
	assert.ErrorIs(t, err, ErrUnknownEntity)
	preview, err := in.PendingRetry(ctx, Ref{SequenceNumber: p.SequenceNumber})
	require.NoError(t, err)
	assert.Equal(t, p.Ref(), preview.Ref())
	assert.Equal(t, 1, h.QueueStats(t, sbtest.RetryQueue).Scheduled, "a preview cancels nothing")
	got, err := in.Cancel(context.Background(), Ref{SequenceNumber: p.SequenceNumber})
	require.NoError(t, err)
	assert.Equal(t, p.MessageID, got.MessageID)
	assert.Equal(t, 0, h.QueueStats(t, sbtest.RetryQueue).Scheduled)
}

// FuzzParseRef: whatever the input, ParseRef returns a Ref whose String parses back to it, or an error
// wrapping ErrInvalidRef; never a panic.
func FuzzParseRef(f *testing.F) {
	for _, s := range []string{"17", "billing-retry/$DeadLetterQueue:17", "events/Subscriptions/billing:0", ":1", "a:b:3", "q:-1", "x/:2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRef(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidRef) {
				t.Fatalf("ParseRef(%q): %v does not wrap ErrInvalidRef", s, err)
			}
			return
		}
		if r.SequenceNumber < 0 {
			t.Fatalf("ParseRef(%q) = %+v: negative sequence number", s, r)
		}
		again, err := ParseRef(r.String())
		if err != nil || again != r {
			t.Fatalf("ParseRef(%q) = %+v, but its String %q parses to %+v, %v", s, r, r.String(), again, err)
		}
	})
}

// TestRetryQueueMessagesOfAnotherEntityAreLeftOut: a retry queue shared with another subscription's
// consumer, or named by mistake, holds chains of another entity (their sbretry-source says so). They
// never appear in an answer, are counted in Scan.Foreign, and a Ref to one is refused.
func TestRetryQueueMessagesOfAnotherEntityAreLeftOut(t *testing.T) {
	t.Parallel()
	h := sbtest.NewSubscription(t)
	ctx := sbtest.Context(t)
	other := "events/Subscriptions/audit"
	props := func() map[string]any {
		return map[string]any{envelope.PropAttempt: int64(2), envelope.PropKey: "order-9", envelope.PropOriginalMessageID: "order-9", envelope.PropSource: other}
	}
	s, err := h.Client.NewSender(sbtest.RetryQueue, nil)
	require.NoError(t, err)
	defer func() { _ = s.Close(ctx) }()
	seqs, err := s.ScheduleMessages(ctx, []*azservicebus.Message{{MessageID: ptr("audit-copy"), Body: []byte("x"), ApplicationProperties: props()}}, time.Now().Add(time.Hour), nil)
	require.NoError(t, err)
	require.NoError(t, s.SendMessage(ctx, &azservicebus.Message{MessageID: ptr("audit-dead"), Body: []byte("x"), ApplicationProperties: props()}, nil))
	r, err := h.Client.NewReceiverForQueue(sbtest.RetryQueue, nil)
	require.NoError(t, err)
	defer func() { _ = r.Close(ctx) }()
	got, err := r.ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.NoError(t, r.DeadLetterMessage(ctx, got[0], nil))

	in, err := New(h.Client, sbtest.SubscriptionPath, &Options{RetryQueue: sbtest.RetryQueue})
	require.NoError(t, err)
	st, err := in.Status(ctx, "order-9")
	require.NoError(t, err)
	assert.Empty(t, st.Pending)
	assert.Empty(t, st.DeadLetters)
	foreign := 0
	for _, sc := range st.Scans {
		foreign += sc.Foreign
	}
	assert.Equal(t, 2, foreign, "the copy in the retry queue and the dead letter in its dead-letter queue")
	page, err := in.ListPending(ctx, PageOptions{})
	require.NoError(t, err)
	assert.Empty(t, page.Items)
	list, err := in.DeadLetters(ctx, DeadLetterFilter{})
	require.NoError(t, err)
	assert.Empty(t, list.Items)
	require.NotNil(t, list.RetryQueueScan)
	assert.Equal(t, 1, list.RetryQueueScan.Foreign)

	_, err = in.Cancel(ctx, Ref{Entity: sbtest.RetryQueue, SequenceNumber: seqs[0]})
	assert.ErrorIs(t, err, ErrOtherEntity)
	assert.Equal(t, 1, h.QueueStats(t, sbtest.RetryQueue).Scheduled, "not cancelled")
	_, err = in.DeadLetter(ctx, Ref{Entity: sbtest.RetryQueue + "/$DeadLetterQueue", SequenceNumber: 1})
	assert.ErrorIs(t, err, ErrOtherEntity)
}
