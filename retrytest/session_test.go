package retrytest_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/retrytest"
	"github.com/sbretry/retry/sbemu/broker"
)

// sessionReceiver lists the methods of *azservicebus.SessionReceiver that a session consumer calls.
// Both the SDK's receiver and the broker's satisfy it, so the two cannot drift apart.
type sessionReceiver interface {
	ReceiveMessages(ctx context.Context, maxMessages int, options *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	CompleteMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.CompleteMessageOptions) error
	AbandonMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.AbandonMessageOptions) error
	DeadLetterMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.DeadLetterOptions) error
	DeferMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.DeferMessageOptions) error
	ReceiveDeferredMessages(ctx context.Context, sequenceNumbers []int64, options *azservicebus.ReceiveDeferredMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	PeekMessages(ctx context.Context, maxMessageCount int, options *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	GetSessionState(ctx context.Context, options *azservicebus.GetSessionStateOptions) ([]byte, error)
	SetSessionState(ctx context.Context, state []byte, options *azservicebus.SetSessionStateOptions) error
	RenewSessionLock(ctx context.Context, options *azservicebus.RenewSessionLockOptions) error
	SessionID() string
	LockedUntil() time.Time
	Close(ctx context.Context) error
}

var (
	_ sessionReceiver = (*azservicebus.SessionReceiver)(nil)
	_ sessionReceiver = (*retrytest.SessionReceiver)(nil)
)

// sendTo sends a message with body to session id.
func sendTo(t *testing.T, b *retrytest.Broker, id, body string) int64 {
	t.Helper()
	seq, err := b.Send(&azservicebus.Message{SessionID: &id, Body: []byte(body)})
	require.NoError(t, err)
	return seq
}

// accept is AcceptSession that fails the test on error and closes the receiver at the end.
func accept(t *testing.T, b *retrytest.Broker, id string) *retrytest.SessionReceiver {
	t.Helper()
	r, err := b.AcceptSession(t.Context(), id)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return r
}

// receiveNow receives up to n messages that must be available now.
func receiveNow(t *testing.T, r *retrytest.SessionReceiver, n int) []*azservicebus.ReceivedMessage {
	t.Helper()
	msgs, err := r.ReceiveMessages(t.Context(), n, nil)
	require.NoError(t, err)
	return msgs
}

func bodies(msgs []*azservicebus.ReceivedMessage) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = string(m.Body)
	}
	return out
}

// requireCode requires err to carry an *azservicebus.Error with code.
func requireCode(t *testing.T, err error, code azservicebus.Code) {
	t.Helper()
	var sbErr *azservicebus.Error
	require.ErrorAs(t, err, &sbErr, "%v", err)
	assert.Equal(t, code, sbErr.Code, "%v", err)
}

// requireCondition requires err to carry an *amqp.Error with cond.
func requireCondition(t *testing.T, err error, cond amqp.ErrCond) *amqp.Error {
	t.Helper()
	var amqpErr *amqp.Error
	require.ErrorAs(t, err, &amqpErr, "%v", err)
	assert.Equal(t, cond, amqpErr.Condition)
	return amqpErr
}

func sessionBroker(t *testing.T, clk *clock.Mock, opts retrytest.BrokerOptions) *retrytest.Broker {
	t.Helper()
	opts.RequiresSession = true
	if opts.LockDuration == 0 {
		opts.LockDuration = 30 * time.Second
	}
	return newBroker(t, clk, &opts)
}

func TestSessionMessagesInOrderPerSession(t *testing.T) {
	b := sessionBroker(t, clock.NewMock(), retrytest.BrokerOptions{})
	for _, m := range [][2]string{{"a", "a1"}, {"b", "b1"}, {"a", "a2"}, {"b", "b2"}, {"a", "a3"}} {
		sendTo(t, b, m[0], m[1])
	}
	ra, rb := accept(t, b, "a"), accept(t, b, "b")
	assert.Equal(t, "a", ra.SessionID())

	// Each receiver gets only its session, in order, and settling one session leaves the other alone.
	gotA := receiveNow(t, ra, 2)
	assert.Equal(t, []string{"a1", "a2"}, bodies(gotA))
	gotB := receiveNow(t, rb, 10)
	assert.Equal(t, []string{"b1", "b2"}, bodies(gotB))
	for _, m := range gotB {
		require.NoError(t, rb.CompleteMessage(t.Context(), m, nil))
		assert.Equal(t, "b", *m.SessionID)
		assert.Equal(t, rb.LockedUntil(), *m.LockedUntil, "a message's lock is its session's")
	}
	assert.Equal(t, []string{"a3"}, bodies(receiveNow(t, ra, 10)))
	require.NoError(t, ra.CompleteMessage(t.Context(), gotA[1], nil), "settled out of order within the session")
	require.NoError(t, ra.AbandonMessage(t.Context(), gotA[0], &azservicebus.AbandonMessageOptions{PropertiesToModify: map[string]any{"k": "v"}}))

	again := receiveNow(t, ra, 10)
	require.Len(t, again, 1, "the abandoned message comes back first")
	assert.Equal(t, "a1", string(again[0].Body))
	assert.Equal(t, uint32(2), again[0].DeliveryCount)
	assert.Equal(t, "v", again[0].ApplicationProperties["k"])
	require.NoError(t, ra.DeadLetterMessage(t.Context(), again[0], &azservicebus.DeadLetterOptions{Reason: str("poison")}))
	st := b.Stats()
	assert.Equal(t, 3, st.Succeeded)
	assert.Equal(t, 1, st.DeadLettered)
	assert.Equal(t, 1, st.Locked, "a3 is still locked")
}

func TestAcceptNextSession(t *testing.T) {
	mock := clock.NewMock()
	b := sessionBroker(t, mock, retrytest.BrokerOptions{})
	sendTo(t, b, "held", "h1")
	sendTo(t, b, "free", "f1")
	accept(t, b, "held")

	r, err := b.AcceptNextSession(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	assert.Equal(t, "free", r.SessionID(), "the held session is skipped though its message is older")
	assert.Equal(t, mock.Now().Add(30*time.Second), r.LockedUntil())

	// A session with only a state or a deferred message is not available either.
	sendTo(t, b, "deferred", "d1")
	d := accept(t, b, "deferred")
	require.NoError(t, d.DeferMessage(t.Context(), receiveNow(t, d, 1)[0], nil))
	require.NoError(t, d.SetSessionState(t.Context(), []byte("x"), nil))
	require.NoError(t, d.Close(t.Context()))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = b.AcceptNextSession(ctx)
	assert.ErrorIs(t, err, context.Canceled)
}

// AcceptNextSession waits on the broker's clock, as Service Bus does, and ends as the SDK's does: with
// CodeTimeout when the broker's wait ends first, with the context's error when the context ends first.
func TestAcceptNextSessionWaits(t *testing.T) {
	tests := []struct {
		name  string
		ctx   func(context.Context) (context.Context, context.CancelFunc)
		after time.Duration // how long the accept takes to fail
		check func(t *testing.T, err error)
	}{
		{
			name:  "no deadline: the service's default",
			ctx:   func(ctx context.Context) (context.Context, context.CancelFunc) { return ctx, func() {} },
			after: retrytest.DefaultAcceptNextSessionTimeout,
			check: func(t *testing.T, err error) { requireCode(t, err, azservicebus.CodeTimeout) },
		},
		{
			name: "deadline: the broker answers just before it",
			ctx: func(ctx context.Context) (context.Context, context.CancelFunc) {
				return context.WithTimeout(ctx, 5*time.Second)
			},
			after: 5*time.Second - 50*time.Millisecond,
			check: func(t *testing.T, err error) { requireCode(t, err, azservicebus.CodeTimeout) },
		},
		{
			name: "cancelled while waiting",
			ctx: func(ctx context.Context) (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(ctx)
				time.AfterFunc(time.Second, cancel)
				return ctx, cancel
			},
			after: time.Second,
			check: func(t *testing.T, err error) { assert.ErrorIs(t, err, context.Canceled) },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t, nil, &retrytest.BrokerOptions{RequiresSession: true})
				ctx, cancel := tc.ctx(t.Context())
				defer cancel()
				start := time.Now()
				_, err := b.AcceptNextSession(ctx)
				tc.check(t, err)
				assert.Equal(t, tc.after, time.Since(start))
			})
		})
	}
}

// A waiting accept takes the session as soon as one becomes available: a message sent, a scheduled
// message falling due, or a session lock running out.
func TestAcceptNextSessionWakes(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, b *retrytest.Broker)
		then  func(t *testing.T, b *retrytest.Broker)
		after time.Duration
	}{
		{
			name: "message sent",
			then: func(t *testing.T, b *retrytest.Broker) { sendTo(t, b, "s", "x") },
		},
		{
			name: "scheduled message due",
			setup: func(t *testing.T, b *retrytest.Broker) {
				at := time.Now().Add(10 * time.Second)
				_, err := b.Send(&azservicebus.Message{SessionID: str("s"), ScheduledEnqueueTime: &at})
				require.NoError(t, err)
			},
			after: 10 * time.Second,
		},
		{
			name: "session lock ran out",
			setup: func(t *testing.T, b *retrytest.Broker) {
				sendTo(t, b, "s", "x")
				accept(t, b, "s")
			},
			after: 30 * time.Second,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBroker(t, nil, &retrytest.BrokerOptions{RequiresSession: true, LockDuration: 30 * time.Second})
				if tc.setup != nil {
					tc.setup(t, b)
				}
				start := time.Now()
				done := make(chan *retrytest.SessionReceiver, 1)
				go func() {
					r, err := b.AcceptNextSession(t.Context())
					assert.NoError(t, err)
					done <- r
				}()
				synctest.Wait()
				if tc.then != nil {
					tc.then(t, b)
				}
				r := <-done
				require.NotNil(t, r)
				assert.Equal(t, "s", r.SessionID())
				assert.Equal(t, tc.after, time.Since(start))
				require.NoError(t, r.Close(t.Context()))
			})
		})
	}
}

func TestSessionLockExpiryAndRenewal(t *testing.T) {
	mock := clock.NewMock()
	b := sessionBroker(t, mock, retrytest.BrokerOptions{})
	sendTo(t, b, "s", "kept")
	sendTo(t, b, "s", "lost")
	sendTo(t, b, "s", "never")
	r := accept(t, b, "s")

	// Renewing the session lock keeps its messages locked, long past the lock duration.
	kept := receiveNow(t, r, 1)[0]
	for range 4 {
		mock.Add(20 * time.Second)
		require.NoError(t, r.RenewSessionLock(t.Context(), nil))
		assert.Equal(t, mock.Now().Add(30*time.Second), r.LockedUntil())
	}
	require.NoError(t, r.CompleteMessage(t.Context(), kept, nil))

	// Without renewal the session lock runs out: every call of the receiver reports the lost lock, and
	// another receiver gets the session with the unsettled message first, its delivery counted.
	lost := receiveNow(t, r, 1)[0]
	assert.Equal(t, []retrytest.SessionInfo{{Entity: "queue", ID: "s", Active: 1, Locked: 1, LockedUntil: r.LockedUntil()}}, b.Sessions())
	mock.Add(30 * time.Second)
	requireCode(t, r.CompleteMessage(t.Context(), lost, nil), azservicebus.CodeLockLost)
	_, err := r.ReceiveMessages(t.Context(), 1, nil)
	requireCode(t, err, azservicebus.CodeLockLost)
	requireCode(t, r.RenewSessionLock(t.Context(), nil), azservicebus.CodeLockLost)
	_, err = r.GetSessionState(t.Context(), nil)
	requireCode(t, err, azservicebus.CodeLockLost)
	_, err = r.PeekMessages(t.Context(), 1, nil)
	requireCode(t, err, azservicebus.CodeLockLost)
	assert.Equal(t, []retrytest.SessionInfo{{Entity: "queue", ID: "s", Active: 2}}, b.Sessions())

	next := accept(t, b, "s")
	got := receiveNow(t, next, 10)
	assert.Equal(t, []string{"lost", "never"}, bodies(got))
	assert.Equal(t, []uint32{2, 1}, []uint32{got[0].DeliveryCount, got[1].DeliveryCount})
}

// A receiver blocked in ReceiveMessages learns of the lost lock when the lock runs out.
func TestSessionReceiveEndsWithTheLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, &retrytest.BrokerOptions{RequiresSession: true, LockDuration: 30 * time.Second})
		r := accept(t, b, "empty")
		start := time.Now()
		_, err := r.ReceiveMessages(t.Context(), 1, nil)
		requireCode(t, err, azservicebus.CodeLockLost)
		assert.Equal(t, 30*time.Second, time.Since(start))
	})
}

func TestSessionReceiverClosedWithoutSettling(t *testing.T) {
	b := sessionBroker(t, clock.NewMock(), retrytest.BrokerOptions{})
	for _, body := range []string{"1", "2", "3"} {
		sendTo(t, b, "s", body)
	}
	gone := accept(t, b, "s")
	held := receiveNow(t, gone, 2)
	_, err := b.AcceptSession(t.Context(), "s")
	requireCondition(t, err, "com.microsoft:session-cannot-be-locked")

	require.NoError(t, gone.Close(t.Context()))
	require.NoError(t, gone.Close(t.Context()), "Close is idempotent")
	requireCode(t, gone.CompleteMessage(t.Context(), held[0], nil), azservicebus.CodeClosed)
	_, err = gone.ReceiveMessages(t.Context(), 1, nil)
	requireCode(t, err, azservicebus.CodeClosed)

	next, err := b.AcceptNextSession(t.Context())
	require.NoError(t, err, "the session is free at once")
	t.Cleanup(func() { _ = next.Close(context.Background()) })
	got := receiveNow(t, next, 10)
	assert.Equal(t, []string{"1", "2", "3"}, bodies(got), "in order")
	assert.Equal(t, []uint32{1, 1, 1}, []uint32{got[0].DeliveryCount, got[1].DeliveryCount, got[2].DeliveryCount}, "a close does not count the delivery")
}

func TestSessionDeferral(t *testing.T) {
	b := sessionBroker(t, clock.NewMock(), retrytest.BrokerOptions{})
	first := sendTo(t, b, "a", "a1")
	sendTo(t, b, "a", "a2")
	other := sendTo(t, b, "b", "b1")

	rb := accept(t, b, "b")
	require.NoError(t, rb.DeferMessage(t.Context(), receiveNow(t, rb, 1)[0], nil))
	ra := accept(t, b, "a")
	msgs := receiveNow(t, ra, 1)
	require.Equal(t, first, *msgs[0].SequenceNumber)
	require.NoError(t, ra.DeferMessage(t.Context(), msgs[0], &azservicebus.DeferMessageOptions{PropertiesToModify: map[string]any{"why": "blocked"}}))
	a2 := receiveNow(t, ra, 10)
	assert.Equal(t, []string{"a2"}, bodies(a2), "a deferred message is not received again")
	require.NoError(t, ra.CompleteMessage(t.Context(), a2[0], nil))

	deferred := b.Deferred()
	require.Len(t, deferred, 2)
	assert.Equal(t, "a", *deferred[0].Message.SessionID, "by session")
	assert.Equal(t, "b", *deferred[1].Message.SessionID)
	assert.Equal(t, azservicebus.MessageStateDeferred, deferred[0].Message.State)
	assert.Equal(t, "queue", deferred[0].Entity)

	tests := []struct {
		name string
		seqs []int64
	}{
		{"another session's", []int64{other}},
		{"unknown", []int64{9999}},
		{"one of them unknown", []int64{first, 9999}},
	}
	for _, tc := range tests {
		_, err := ra.ReceiveDeferredMessages(t.Context(), tc.seqs, nil)
		requireCode(t, err, azservicebus.CodeNotFound)
	}
	_, err := ra.ReceiveDeferredMessages(t.Context(), nil, nil)
	assert.ErrorContains(t, err, "at least one sequence number")

	got, err := ra.ReceiveDeferredMessages(t.Context(), []int64{first}, nil)
	require.NoError(t, err, "nothing was received by the failed calls")
	require.Len(t, got, 1)
	assert.Equal(t, "a1", string(got[0].Body))
	assert.Equal(t, "blocked", got[0].ApplicationProperties["why"])
	assert.Equal(t, azservicebus.MessageStateDeferred, got[0].State)
	assert.Equal(t, uint32(2), got[0].DeliveryCount)
	assert.Equal(t, ra.LockedUntil(), *got[0].LockedUntil, "locked under the session lock")

	// Abandoned, it stays deferred; completed, it is gone.
	require.NoError(t, ra.AbandonMessage(t.Context(), got[0], nil))
	assert.Len(t, b.Deferred(), 2)
	got, err = ra.ReceiveDeferredMessages(t.Context(), []int64{first}, nil)
	require.NoError(t, err)
	require.NoError(t, ra.CompleteMessage(t.Context(), got[0], nil))
	assert.Len(t, b.Deferred(), 1)

	peeked, err := rb.PeekMessages(t.Context(), 10, nil)
	require.NoError(t, err)
	require.Len(t, peeked, 1)
	assert.Equal(t, azservicebus.MessageStateDeferred, peeked[0].State)
	peeked, err = rb.PeekMessages(t.Context(), 10, nil)
	require.NoError(t, err)
	assert.Empty(t, peeked, "the peek goes on after the last message it returned")
	peeked, err = rb.PeekMessages(t.Context(), 10, &azservicebus.PeekMessagesOptions{FromSequenceNumber: &other})
	require.NoError(t, err)
	assert.Len(t, peeked, 1)
}

func TestSessionState(t *testing.T) {
	b := sessionBroker(t, clock.NewMock(), retrytest.BrokerOptions{MaxMessageSize: 1024})
	r := accept(t, b, "s")
	state, err := r.GetSessionState(t.Context(), nil)
	require.NoError(t, err)
	assert.Nil(t, state, "no state yet")

	require.NoError(t, r.SetSessionState(t.Context(), []byte(`{"blocked":[7]}`), nil))
	err = r.SetSessionState(t.Context(), make([]byte, 1025), nil)
	assert.ErrorIs(t, err, azservicebus.ErrMessageTooLarge, "bounded by the entity's message size")
	require.NoError(t, r.SetSessionState(t.Context(), make([]byte, 1024), nil), "up to the limit")
	require.NoError(t, r.SetSessionState(t.Context(), []byte(`{"blocked":[7]}`), nil))
	assert.Equal(t, []retrytest.SessionInfo{{Entity: "queue", ID: "s", LockedUntil: r.LockedUntil(), State: []byte(`{"blocked":[7]}`)}}, b.Sessions())

	// The state outlives the receiver, and the session has no messages.
	require.NoError(t, r.Close(t.Context()))
	again := accept(t, b, "s")
	state, err = again.GetSessionState(t.Context(), nil)
	require.NoError(t, err)
	assert.Equal(t, `{"blocked":[7]}`, string(state))
	require.NoError(t, again.SetSessionState(t.Context(), nil, nil))
	state, err = again.GetSessionState(t.Context(), nil)
	require.NoError(t, err)
	assert.Nil(t, state, "nil clears it")
	require.NoError(t, again.Close(t.Context()))
	assert.Empty(t, b.Sessions(), "a session with nothing left is gone")
}

func TestScheduledMessageLandsInItsSession(t *testing.T) {
	mock := clock.NewMock()
	b := sessionBroker(t, mock, retrytest.BrokerOptions{})
	sendTo(t, b, "s", "first")
	at := mock.Now().Add(time.Minute)
	_, err := b.Sender().ScheduleMessages(t.Context(), []*azservicebus.Message{{SessionID: str("s"), Body: []byte("scheduled")}}, at, nil)
	require.NoError(t, err)
	_, err = b.Send(&azservicebus.Message{SessionID: str("later"), Body: []byte("x"), ScheduledEnqueueTime: &at})
	require.NoError(t, err)
	assert.Equal(t, []retrytest.SessionInfo{{Entity: "queue", ID: "later", Scheduled: 1}, {Entity: "queue", ID: "s", Active: 1, Scheduled: 1}}, b.Sessions())

	r := accept(t, b, "s")
	m := receiveNow(t, r, 10)
	assert.Equal(t, []string{"first"}, bodies(m), "not before its time")
	require.NoError(t, r.CompleteMessage(t.Context(), m[0], nil))
	require.NoError(t, r.Close(t.Context()))

	_, ok := b.AdvanceToNextScheduled(mock)
	require.True(t, ok)
	r, err = b.AcceptNextSession(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	assert.Equal(t, "s", r.SessionID(), "the session whose message is oldest")
	m = receiveNow(t, r, 10)
	require.Len(t, m, 1)
	assert.Equal(t, "scheduled", string(m[0].Body))
	assert.Equal(t, at, *m[0].EnqueuedTime)
}

// A session entity refuses a plain receiver as Service Bus does, and bad input to the session calls is
// an error, never a panic.
func TestSessionRefusals(t *testing.T) {
	b := sessionBroker(t, clock.NewMock(), retrytest.BrokerOptions{})
	plain := b.Receiver()
	_, err := plain.ReceiveMessages(t.Context(), 1, nil)
	e := requireCondition(t, err, amqp.ErrCondNotAllowed)
	assert.Contains(t, e.Description, "It is not possible for an entity that requires sessions to create a non-sessionful message receiver.")
	conn, err := b.Connector()(t.Context())
	require.NoError(t, err)
	_, err = conn.Receiver.ReceiveMessages(t.Context(), 1, nil)
	requireCondition(t, err, amqp.ErrCondNotAllowed)
	requireCondition(t, plain.CompleteMessage(t.Context(), &azservicebus.ReceivedMessage{}, nil), amqp.ErrCondNotAllowed)

	_, err = b.Send(&azservicebus.Message{Body: []byte("x")})
	assert.ErrorIs(t, err, broker.ErrSessionRequired, "a message without SessionID")
	_, err = b.Send(&azservicebus.Message{SessionID: str(strings.Repeat("x", broker.MaxSessionIDLength+1))})
	assert.ErrorIs(t, err, broker.ErrInvalidSessionID, "a SessionID over 128 characters")
	assert.Empty(t, b.Sessions(), "nothing was stored")

	tests := []struct {
		name string
		id   string
	}{
		{"too long", strings.Repeat("é", broker.MaxSessionIDLength+1)},
		{"not UTF-8", "\xff"},
	}
	for _, tc := range tests {
		_, err := b.AcceptSession(t.Context(), tc.id)
		requireCondition(t, err, amqp.ErrCondNotAllowed)
	}
	empty := accept(t, b, "")
	assert.Empty(t, empty.SessionID(), "the empty id is a session id like any other")

	r := accept(t, b, "s")
	for name, call := range map[string]func() error{
		"complete":    func() error { return r.CompleteMessage(t.Context(), nil, nil) },
		"abandon":     func() error { return r.AbandonMessage(t.Context(), nil, nil) },
		"defer":       func() error { return r.DeferMessage(t.Context(), nil, nil) },
		"dead-letter": func() error { return r.DeadLetterMessage(t.Context(), nil, nil) },
	} {
		assert.ErrorContains(t, call(), "nil message", name)
	}
	requireCode(t, r.CompleteMessage(t.Context(), &azservicebus.ReceivedMessage{}, nil), azservicebus.CodeLockLost)
	_, err = r.ReceiveMessages(t.Context(), 0, nil)
	assert.Error(t, err)
	_, err = r.PeekMessages(t.Context(), 0, nil)
	assert.Error(t, err)

	noSessions := newBroker(t, clock.NewMock(), nil)
	_, err = noSessions.AcceptSession(t.Context(), "s")
	requireCondition(t, err, amqp.ErrCondNotAllowed)
	_, err = noSessions.AcceptNextSession(t.Context())
	requireCondition(t, err, amqp.ErrCondNotAllowed)
	_, err = b.AcceptSubscriptionSession(t.Context(), "nope", "s")
	assert.ErrorContains(t, err, "no subscription")
}

func TestSessionOptionsValidated(t *testing.T) {
	_, err := retrytest.New(nil, &retrytest.BrokerOptions{
		EntityPath: "orders/Subscriptions/billing", RetryQueue: "orders-billing-retry", RequiresSession: true,
	})
	assert.ErrorIs(t, err, broker.ErrInvalidConfig)
	assert.ErrorContains(t, err, "session")
}

func TestSessionFaults(t *testing.T) {
	b := sessionBroker(t, clock.NewMock(), retrytest.BrokerOptions{})
	sendTo(t, b, "s", "x")
	b.Fail(retrytest.OpAccept, 1, nil)
	_, err := b.AcceptSession(t.Context(), "s")
	assert.ErrorIs(t, err, retrytest.ErrInjected)
	b.Fail(retrytest.OpAccept, 1, retrytest.ErrConnectionLost)
	_, err = b.AcceptNextSession(t.Context())
	requireCode(t, err, azservicebus.CodeConnectionLost)

	r := accept(t, b, "s")
	m := receiveNow(t, r, 1)[0]
	tests := []struct {
		op   retrytest.Op
		call func() error
	}{
		{retrytest.OpSessionState, func() error { _, err := r.GetSessionState(t.Context(), nil); return err }},
		{retrytest.OpSessionState, func() error { return r.SetSessionState(t.Context(), []byte("x"), nil) }},
		{retrytest.OpRenew, func() error { return r.RenewSessionLock(t.Context(), nil) }},
		{retrytest.OpDefer, func() error { return r.DeferMessage(t.Context(), m, nil) }},
		{retrytest.OpAbandon, func() error { return r.AbandonMessage(t.Context(), m, nil) }},
		{retrytest.OpComplete, func() error { return r.CompleteMessage(t.Context(), m, nil) }},
		{retrytest.OpReceive, func() error { _, err := r.ReceiveMessages(t.Context(), 1, nil); return err }},
	}
	for _, tc := range tests {
		t.Run(tc.op.String(), func(t *testing.T) {
			b.Fail(tc.op, 1, nil)
			assert.ErrorIs(t, tc.call(), retrytest.ErrInjected)
		})
	}
	require.NoError(t, r.CompleteMessage(t.Context(), m, nil), "a failed settle leaves the message locked")
}

// On a topic, RequiresSession makes every subscription session-aware; each is accepted on its own.
func TestSubscriptionSessions(t *testing.T) {
	b := newBroker(t, clock.NewMock(), &retrytest.BrokerOptions{
		EntityPath: "orders", RequiresSession: true,
		Subscriptions: []broker.SubscriptionConfig{{Name: "billing"}, {Name: "audit"}},
	})
	sendTo(t, b, "o1", "created")
	sendTo(t, b, "o1", "paid")

	for _, sub := range []string{"billing", "audit"} {
		r, err := b.AcceptNextSubscriptionSession(t.Context(), sub)
		require.NoError(t, err)
		assert.Equal(t, "o1", r.SessionID())
		assert.Equal(t, []string{"created", "paid"}, bodies(receiveNow(t, r, 10)), sub)
		require.NoError(t, r.Close(t.Context()))
	}
	r, err := b.AcceptSession(t.Context(), "o1")
	require.NoError(t, err, "the first subscription")
	require.NoError(t, r.Close(t.Context()))
	r, err = b.AcceptSubscriptionSession(t.Context(), "AUDIT", "o1")
	require.NoError(t, err)
	require.NoError(t, r.Close(t.Context()))
	infos := b.Sessions()
	require.Len(t, infos, 2)
	assert.Equal(t, "orders/Subscriptions/billing", infos[0].Entity)
	assert.Equal(t, "orders/Subscriptions/audit", infos[1].Entity)

	_, err = b.SubscriptionReceiver("billing")
	require.NoError(t, err)
	sr, _ := b.SubscriptionReceiver("billing")
	_, err = sr.ReceiveMessages(t.Context(), 1, nil)
	requireCondition(t, err, amqp.ErrCondNotAllowed)
	assert.False(t, errors.Is(err, context.Canceled))
}

// ExpireLocks ends session locks too, counting the delivery of their unsettled messages.
func TestExpireLocksEndsSessionLocks(t *testing.T) {
	b := sessionBroker(t, clock.NewMock(), retrytest.BrokerOptions{})
	sendTo(t, b, "s", "x")
	r := accept(t, b, "s")
	m := receiveNow(t, r, 1)[0]
	b.ExpireLocks()
	requireCode(t, r.CompleteMessage(t.Context(), m, nil), azservicebus.CodeLockLost)
	requireCode(t, r.SetSessionState(t.Context(), []byte("x"), nil), azservicebus.CodeLockLost)
	next := accept(t, b, "s")
	again := receiveNow(t, next, 1)
	assert.Equal(t, uint32(2), again[0].DeliveryCount)
}

// Receivers racing for the next session each get a different one; the one left over times out.
func TestAcceptNextSessionIsExclusive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, &retrytest.BrokerOptions{RequiresSession: true, LockDuration: 5 * time.Minute})
		sendTo(t, b, "s1", "x")
		sendTo(t, b, "s2", "y")
		type result struct {
			id  string
			err error
		}
		results := make(chan result, 3)
		for range 3 {
			go func() {
				r, err := b.AcceptNextSession(t.Context())
				if err != nil {
					results <- result{err: err}
					return
				}
				results <- result{id: r.SessionID()}
				// Held until the test ends, so the leftover receiver cannot take it.
				<-t.Context().Done()
				_ = r.Close(context.Background())
			}()
		}
		got := map[string]int{}
		var timeouts int
		for range 3 {
			res := <-results
			if res.err != nil {
				requireCode(t, res.err, azservicebus.CodeTimeout)
				timeouts++
				continue
			}
			got[res.id]++
		}
		assert.Equal(t, map[string]int{"s1": 1, "s2": 1}, got)
		assert.Equal(t, 1, timeouts)
	})
}

// A deferred message does not expire by itself: it is checked when a receive by sequence number asks
// for it, and then dead-lettered (with DeadLetteringOnMessageExpiration) instead of delivered.
func TestDeferredMessageExpiresWhenAskedFor(t *testing.T) {
	mock := clock.NewMock()
	b := sessionBroker(t, mock, retrytest.BrokerOptions{DeadLetteringOnMessageExpiration: true})
	ttl := time.Minute
	_, err := b.Send(&azservicebus.Message{SessionID: str("s"), Body: []byte("short-lived"), TimeToLive: &ttl})
	require.NoError(t, err)
	r := accept(t, b, "s")
	m := receiveNow(t, r, 1)[0]
	require.NoError(t, r.DeferMessage(t.Context(), m, nil))
	require.NoError(t, r.Close(t.Context()))

	mock.Add(2 * time.Minute)
	assert.Equal(t, []retrytest.SessionInfo{{Entity: "queue", ID: "s", Deferred: 1}}, b.Sessions(), "still deferred, past its expiry")
	assert.Empty(t, b.DeadLettered())

	r = accept(t, b, "s")
	_, err = r.ReceiveDeferredMessages(t.Context(), []int64{*m.SequenceNumber}, nil)
	requireCode(t, err, azservicebus.CodeNotFound)
	dl := b.DeadLettered()
	require.Len(t, dl, 1)
	assert.Equal(t, broker.ReasonTTLExpired, dl[0].Reason)
	assert.Empty(t, b.Deferred())
}
