package sbemu

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"github.com/Azure/go-amqp"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

// sessionConfig is one session-aware queue "sq" and a topic "st" whose
// subscription "sub" requires sessions.
func sessionConfig() Config {
	return Config{
		Queues: []broker.QueueConfig{{Name: "sq", RequiresSession: true, LockDuration: 30 * time.Second}, {Name: "plain"}},
		Topics: []broker.TopicConfig{{Name: "st", Subscriptions: []broker.SubscriptionConfig{{Name: "sub", RequiresSession: true}}}},
	}
}

func sendToSession(t *testing.T, s *azservicebus.Sender, session, body string) {
	t.Helper()
	require.NoError(t, s.SendMessage(ctxT(t), &azservicebus.Message{Body: []byte(body), SessionID: to.Ptr(session)}, nil))
}

func acceptSession(t *testing.T, client *azservicebus.Client, queue, id string) *azservicebus.SessionReceiver {
	t.Helper()
	r, err := client.AcceptSessionForQueue(ctxT(t), queue, id, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return r
}

func receiveSessionOne(t *testing.T, r *azservicebus.SessionReceiver) *azservicebus.ReceivedMessage {
	t.Helper()
	msgs, err := r.ReceiveMessages(ctxT(t), 1, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	return msgs[0]
}

// TestSDKSessionAcceptAndState is the live test
// TestSessionReceiver_acceptSession: a named session, its lock expiry, its
// messages only, and its state set, read and cleared.
func TestSDKSessionAcceptAndState(t *testing.T) {
	em := startEmulator(t, sessionConfig())
	client := newClient(t, em)
	sender := newSender(t, client, "sq")
	sendToSession(t, sender, "other", "not mine")
	sendToSession(t, sender, "session-1", "session-based message")

	r := acceptSession(t, client, "sq", "session-1")
	assert.Equal(t, "session-1", r.SessionID())
	assert.True(t, r.LockedUntil().After(time.Now()), "locked-until-utc in the attach reply")
	msg := receiveSessionOne(t, r)
	assert.Equal(t, "session-based message", string(msg.Body))
	require.NotNil(t, msg.SessionID)
	assert.Equal(t, "session-1", *msg.SessionID)
	require.NoError(t, r.CompleteMessage(ctxT(t), msg, nil))

	state, err := r.GetSessionState(ctxT(t), nil)
	require.NoError(t, err)
	assert.Nil(t, state)
	require.NoError(t, r.SetSessionState(ctxT(t), []byte("hello"), nil))
	state, err = r.GetSessionState(ctxT(t), nil)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(state))
	require.NoError(t, r.SetSessionState(ctxT(t), nil, nil))
	state, err = r.GetSessionState(ctxT(t), nil)
	require.NoError(t, err)
	assert.Nil(t, state)
}

// TestSDKSessionFIFOAndEmptyID: messages of one session arrive in send
// order; "" is a session id like any other (TestSessionReceiver_blankSessionIDs).
func TestSDKSessionFIFOAndEmptyID(t *testing.T) {
	em := startEmulator(t, sessionConfig())
	client := newClient(t, em)
	sender := newSender(t, client, "sq")
	for _, b := range []string{"1", "2", "3"} {
		sendToSession(t, sender, "", b)
		sendToSession(t, sender, "x", "x"+b)
	}
	r := acceptSession(t, client, "sq", "")
	assert.Equal(t, "", r.SessionID())
	var got []string
	for len(got) < 3 {
		msgs, err := r.ReceiveMessages(ctxT(t), 3, nil)
		require.NoError(t, err)
		for _, m := range msgs {
			got = append(got, string(m.Body))
			require.NoError(t, r.CompleteMessage(ctxT(t), m, nil))
		}
	}
	assert.Equal(t, []string{"1", "2", "3"}, got)
}

// TestSDKSessionAlreadyLocked is TestSessionReceiver_acceptSessionButAlreadyLocked;
// closing the first receiver releases the session.
func TestSDKSessionAlreadyLocked(t *testing.T) {
	em := startEmulator(t, sessionConfig())
	client := newClient(t, em)
	first, err := client.AcceptSessionForQueue(ctxT(t), "sq", "session-1", nil)
	require.NoError(t, err)

	_, err = client.AcceptSessionForQueue(ctxT(t), "sq", "session-1", nil)
	var amqpErr *amqp.Error
	require.True(t, errors.As(err, &amqpErr), "got %T: %v", err, err)
	assert.EqualValues(t, "com.microsoft:session-cannot-be-locked", amqpErr.Condition)

	require.NoError(t, first.Close(ctxT(t)))
	acceptSession(t, client, "sq", "session-1")
}

// TestSDKAcceptNextSession is TestSessionReceiver_acceptNextSession_sessionExists
// on a queue and TestSessionReceiver_subscription on a subscription: the
// next available session is one with messages that nobody holds.
func TestSDKAcceptNextSession(t *testing.T) {
	em := startEmulator(t, sessionConfig())
	client := newClient(t, em)
	sender := newSender(t, client, "sq")
	sendToSession(t, sender, "busy", "b")
	sendToSession(t, sender, "acceptnextsession-test", "session-based message")
	acceptSession(t, client, "sq", "busy")

	r, err := client.AcceptNextSessionForQueue(ctxT(t), "sq", nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	assert.Equal(t, "acceptnextsession-test", r.SessionID())
	msg := receiveSessionOne(t, r)
	assert.Equal(t, "session-based message", string(msg.Body))
	require.NoError(t, r.CompleteMessage(ctxT(t), msg, nil))

	require.NoError(t, newSender(t, client, "st").SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("t"), SessionID: to.Ptr("session1")}, nil))
	sr, err := client.AcceptNextSessionForSubscription(ctxT(t), "st", "sub", nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sr.Close(context.Background()) })
	assert.Equal(t, "session1", sr.SessionID())
	msgs, err := sr.ReceiveMessages(ctxT(t), 1, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.NoError(t, sr.CompleteMessage(ctxT(t), msgs[0], nil))
}

// TestSDKAcceptNextSessionTimesOut is TestSessionReceiver_acceptNextSession_noSessionsExist:
// the emulator waits the com.microsoft:timeout the SDK asks for, on its
// clock, then answers com.microsoft:timeout, which the SDK reports as
// CodeTimeout.
func TestSDKAcceptNextSessionTimesOut(t *testing.T) {
	mock := clock.NewMock()
	cfg := sessionConfig()
	cfg.Clock = mock
	em := startEmulator(t, cfg)
	client := newClient(t, em)
	done := make(chan error, 1)
	go func() {
		_, err := client.AcceptNextSessionForQueue(ctxT(t), "sq", nil)
		done <- err
	}()
	// The wait is parked on the mock clock's timer; move past it until it
	// fires (the SDK asks for about the 20 s of ctxT).
	var err error
	waitFor(t, func() bool {
		mock.Add(time.Minute)
		select {
		case err = <-done:
			return true
		default:
			return false
		}
	})
	requireCode(t, err, azservicebus.CodeTimeout)
}

// TestSDKNonSessionReceiverOnSessionQueue is TestSessionReceiver_nonSessionReceiver.
func TestSDKNonSessionReceiverOnSessionQueue(t *testing.T) {
	em := startEmulator(t, sessionConfig())
	client := newClient(t, em)
	r := newReceiver(t, client, "sq", nil)
	_, err := r.ReceiveMessages(ctxT(t), 1, nil)
	var amqpErr *amqp.Error
	require.True(t, errors.As(err, &amqpErr), "got %T: %v", err, err)
	assert.EqualValues(t, "amqp:not-allowed", amqpErr.Condition)
	assert.Contains(t, amqpErr.Description, "It is not possible for an entity that requires sessions to create a non-sessionful message receiver.")

	_, err = client.AcceptSessionForQueue(ctxT(t), "plain", "s", nil)
	require.True(t, errors.As(err, &amqpErr), "a session receiver on a queue without sessions: %v", err)
	assert.EqualValues(t, "amqp:not-allowed", amqpErr.Condition)
}

// TestSDKRenewSessionLock is TestSessionReceiver_RenewSessionLock, on the
// fake clock; once the lock ran out, renewal is lock-lost and another
// receiver may take the session.
func TestSDKRenewSessionLock(t *testing.T) {
	mock := clock.NewMock()
	mock.Set(time.Now())
	cfg := sessionConfig()
	cfg.Clock = mock
	em := startEmulator(t, cfg)
	client := newClient(t, em)
	r := acceptSession(t, client, "sq", "session-1")
	orig := r.LockedUntil()
	mock.Add(10 * time.Second)
	require.NoError(t, r.RenewSessionLock(ctxT(t), nil))
	assert.True(t, r.LockedUntil().After(orig), "renewed from now")

	// Once the lock ran out another receiver may take the session; the
	// first one's renewal is then refused (the SDK treats the 410 as
	// recoverable, re-attaches, and gets session-cannot-be-locked).
	mock.Add(31 * time.Second)
	acceptSession(t, newClient(t, em), "sq", "session-1")
	require.Error(t, r.RenewSessionLock(ctxT(t), nil))
}

// TestSDKSessionAbandonAndNextReceiver: an abandoned session
// message comes back to the session's next receiver, FIFO kept.
func TestSDKSessionAbandonAndNextReceiver(t *testing.T) {
	em := startEmulator(t, sessionConfig())
	client := newClient(t, em)
	sender := newSender(t, client, "sq")
	sendToSession(t, sender, "s", "1")
	sendToSession(t, sender, "s", "2")
	r, err := client.AcceptSessionForQueue(ctxT(t), "sq", "s", nil)
	require.NoError(t, err)
	first := receiveSessionOne(t, r)
	require.NoError(t, r.AbandonMessage(ctxT(t), first, nil))
	require.NoError(t, r.Close(ctxT(t)))

	r2 := acceptSession(t, newClient(t, em), "sq", "s")
	again := receiveSessionOne(t, r2)
	assert.Equal(t, "1", string(again.Body))
	assert.Equal(t, uint32(2), again.DeliveryCount)
}

// TestSDKSessionDeadLetterAndDeferral: the dead-letter queue of a
// session queue is read without a session; deferral works within one.
func TestSDKSessionDeadLetterAndDeferral(t *testing.T) {
	em := startEmulator(t, sessionConfig())
	client := newClient(t, em)
	sender := newSender(t, client, "sq")
	sendToSession(t, sender, "s", "poison")
	sendToSession(t, sender, "s", "later")
	r := acceptSession(t, client, "sq", "s")
	poison := receiveSessionOne(t, r)
	require.NoError(t, r.DeadLetterMessage(ctxT(t), poison, nil))
	later := receiveSessionOne(t, r)
	require.NoError(t, r.DeferMessage(ctxT(t), later, nil))

	got, err := r.ReceiveDeferredMessages(ctxT(t), []int64{*later.SequenceNumber}, nil)
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, "later", string(got[0].Body))
	require.NoError(t, r.CompleteMessage(ctxT(t), got[0], nil))

	dlq := newReceiver(t, client, "sq", &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	dead := receiveOne(t, dlq)
	assert.Equal(t, "poison", string(dead.Body))
	require.NoError(t, dlq.CompleteMessage(ctxT(t), dead, nil))
}

func TestSDKSessionBounds(t *testing.T) {
	em := startEmulator(t, Config{Queues: []broker.QueueConfig{{Name: "sq", RequiresSession: true, MaxMessageSize: 1024}}})
	client := newClient(t, em)
	sender := newSender(t, client, "sq")
	long := strings.Repeat("s", broker.MaxSessionIDLength+1)

	err := sender.SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("x")}, nil)
	require.Error(t, err, "a session-aware queue refuses a message without a session id")
	err = sender.SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("x"), SessionID: &long}, nil)
	require.Error(t, err, "session id over 128 characters")

	_, err = client.AcceptSessionForQueue(ctxT(t), "sq", long, nil)
	var amqpErr *amqp.Error
	require.True(t, errors.As(err, &amqpErr), "got %T: %v", err, err)
	assert.EqualValues(t, "amqp:not-allowed", amqpErr.Condition)

	r := acceptSession(t, client, "sq", strings.Repeat("s", broker.MaxSessionIDLength))
	// The management request carrying the state is a message, bounded by
	// the entity's MaxMessageSize (the broker refuses a larger state too).
	require.Error(t, r.SetSessionState(ctxT(t), make([]byte, 2048), nil), "state larger than a message")
	require.NoError(t, r.SetSessionState(ctxT(t), make([]byte, 256), nil))
}

func TestSDKListSessions(t *testing.T) {
	em := startEmulator(t, sessionConfig())
	client := newClient(t, em)
	sender := newSender(t, client, "sq")
	sendToSession(t, sender, "b", "1")
	sendToSession(t, sender, "a", "2")
	pager := client.NewListSessionsForQueuePager("sq", nil)
	var ids []string
	for pager.More() {
		page, err := pager.NextPage(ctxT(t))
		require.NoError(t, err)
		ids = append(ids, page.Sessions...)
	}
	assert.Equal(t, []string{"a", "b"}, ids)
}

// TestSDKListSessionsUpdatedAfter: with SessionStateUpdatedAfter the SDK's
// pager lists the sessions whose state was set after the time, leaving out
// a session with messages but no state, as the live test
// TestClient_ListSessionsForQueue_SessionStateUpdatedAfter_Live expects.
func TestSDKListSessionsUpdatedAfter(t *testing.T) {
	em := startEmulator(t, sessionConfig())
	client := newClient(t, em)
	sendToSession(t, newSender(t, client, "sq"), "messages-only", "m")
	before := time.Now().Add(-time.Hour)
	for _, id := range []string{"state-1", "state-0"} {
		r := acceptSession(t, client, "sq", id)
		require.NoError(t, r.SetSessionState(ctxT(t), []byte("state"), nil))
		require.NoError(t, r.Close(ctxT(t)))
	}
	list := func(after time.Time) []string {
		t.Helper()
		pager := client.NewListSessionsForQueuePager("sq", &azservicebus.ListSessionsOptions{SessionStateUpdatedAfter: &after})
		var ids []string
		for pager.More() {
			page, err := pager.NextPage(ctxT(t))
			require.NoError(t, err)
			ids = append(ids, page.Sessions...)
		}
		return ids
	}
	assert.Equal(t, []string{"state-0", "state-1"}, list(before))
	assert.Empty(t, list(time.Now().Add(time.Hour)))
}

func TestSDKSessionStatePersists(t *testing.T) {
	cfg := sessionConfig()
	cfg.DataDir = t.TempDir()
	em := StartT(t, cfg)
	client := newClient(t, em)
	r := acceptSession(t, client, "sq", "kept")
	require.NoError(t, r.SetSessionState(ctxT(t), []byte("state"), nil))
	require.NoError(t, client.Close(ctxT(t)))
	require.NoError(t, em.Close())

	em2 := StartT(t, cfg)
	r2 := acceptSession(t, newClient(t, em2), "sq", "kept")
	state, err := r2.GetSessionState(ctxT(t), nil)
	require.NoError(t, err)
	assert.Equal(t, "state", string(state))
}

// TestSDKAdminRequiresSession creates a session queue and subscription
// through the administration API, reads the setting back and receives
// through a session from them.
func TestSDKAdminRequiresSession(t *testing.T) {
	em := startEmulator(t, Config{Topics: []broker.TopicConfig{{Name: "t"}}})
	ac, err := admin.NewClientFromConnectionString(em.ConnectionString(), em.AdminClientOptions())
	require.NoError(t, err)
	ctx := ctxT(t)
	_, err = ac.CreateQueue(ctx, "sessions", &admin.CreateQueueOptions{Properties: &admin.QueueProperties{RequiresSession: to.Ptr(true)}})
	require.NoError(t, err)
	q, err := ac.GetQueue(ctx, "sessions", nil)
	require.NoError(t, err)
	require.NotNil(t, q.RequiresSession)
	assert.True(t, *q.RequiresSession)
	_, err = ac.CreateSubscription(ctx, "t", "s", &admin.CreateSubscriptionOptions{Properties: &admin.SubscriptionProperties{RequiresSession: to.Ptr(true)}})
	require.NoError(t, err)
	sub, err := ac.GetSubscription(ctx, "t", "s", nil)
	require.NoError(t, err)
	require.NotNil(t, sub.RequiresSession)
	assert.True(t, *sub.RequiresSession)
	_, err = ac.UpdateQueue(ctx, "sessions", admin.QueueProperties{RequiresSession: to.Ptr(false)}, nil)
	require.Error(t, err, "RequiresSession is fixed at creation")

	client := newClient(t, em)
	sendToSession(t, newSender(t, client, "sessions"), "s1", "hello")
	msg := receiveSessionOne(t, acceptSession(t, client, "sessions", "s1"))
	assert.Equal(t, "hello", string(msg.Body))
}

// TestAMQPSessionLockLossDetachesTheLink: when a session lock runs out
// (here on the fake clock) the receive link is detached with
// com.microsoft:session-lock-lost, as Service Bus does. The SDK would
// re-accept the session on its own, so a plain AMQP client shows it.
func TestAMQPSessionLockLossDetachesTheLink(t *testing.T) {
	mock := clock.NewMock()
	mock.Set(time.Now())
	cfg := sessionConfig()
	cfg.Clock = mock
	em := startEmulator(t, cfg)
	session := dialAMQP(t, em)
	receiver, err := session.NewReceiver(ctxT(t), "sq", &amqp.ReceiverOptions{
		Credit:  1,
		Filters: []amqp.LinkFilter{amqp.NewLinkFilter(sessionFilterName, sessionFilterCode, "s")},
	})
	require.NoError(t, err)
	assert.Equal(t, "s", receiver.LinkSourceFilterValue(sessionFilterName), "the granted session id")
	ticks, ok := receiver.Properties()[propLockedUntilUTC].(int64)
	require.True(t, ok, "locked-until-utc as ticks")
	assert.Equal(t, toTicks(mock.Now().Add(30*time.Second)), ticks)

	waitFor(t, func() bool { return em.receiversWaiting() == 1 })
	mock.Add(31 * time.Second)
	_, err = receiver.Receive(ctxT(t), nil)
	var linkErr *amqp.LinkError
	require.True(t, errors.As(err, &linkErr), "got %T: %v", err, err)
	require.NotNil(t, linkErr.RemoteErr)
	assert.EqualValues(t, "com.microsoft:session-lock-lost", linkErr.RemoteErr.Condition)
}

// TestAMQPWaitingSessionReceiversAreBounded: receivers waiting for the
// next available session count against Limits.MaxLinksPerSession, and
// their handles stay taken while they wait.
func TestAMQPWaitingSessionReceiversAreBounded(t *testing.T) {
	cfg := sessionConfig()
	cfg.Limits.MaxLinksPerSession = 2
	em := startEmulator(t, cfg)
	session := dialAMQP(t, em)
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := session.NewReceiver(ctxT(t), "sq", &amqp.ReceiverOptions{
				Filters: []amqp.LinkFilter{amqp.NewLinkFilter(sessionFilterName, sessionFilterCode, nil)},
			})
			errs <- err
		}()
	}
	// Two wait for a session; the third is refused at once.
	err := <-errs
	var amqpErr *amqp.Error
	require.True(t, errors.As(err, &amqpErr), "got %T: %v", err, err)
	assert.EqualValues(t, "amqp:resource-limit-exceeded", amqpErr.Condition)
	// A message lets one waiter through; closing the client ends the other.
	require.NoError(t, newSender(t, newClient(t, em), "sq").SendMessage(ctxT(t), &azservicebus.Message{SessionID: to.Ptr("s")}, nil))
	require.NoError(t, <-errs)
}
