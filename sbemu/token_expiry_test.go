package sbemu

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// attachedEntityLinks counts the queue links (not request/response nodes)
// that the emulator has not detached, over every connection.
func (e *Emulator) attachedEntityLinks() int {
	n := 0
	for _, c := range e.snapshotConns() {
		for _, s := range c.allSessions() {
			s.mu.Lock()
			for _, l := range s.links {
				l.mu.Lock()
				if (l.kind == kindQueueIn || l.kind == kindQueueOut) && !l.detachSent && !l.stopped {
					n++
				}
				l.mu.Unlock()
			}
			s.mu.Unlock()
		}
	}
	return n
}

// TestSDKStrictAuthDetachesLinksWhenTheTokenExpires moves the emulator's
// clock past the expiry of the tokens the SDK put (it signs them for two
// hours, azservicebus v1.11.0 internal/sbauth/token_provider.go, and
// renews them on the real clock, which does not move): the emulator
// detaches the links as Service Bus does, and the SDK's re-attach, whose
// fresh token is already expired on the emulator's clock, fails with
// CodeUnauthorizedAccess. Once the clock is back where the SDK's tokens
// are valid, the same sender and receiver recover on their own. Before,
// links lived on with an expired token.
func TestSDKStrictAuthDetachesLinksWhenTheTokenExpires(t *testing.T) {
	mock := clock.NewMock()
	start := time.Now()
	mock.Set(start)
	em := startEmulator(t, Config{StrictAuth: true, Clock: mock})
	client := newClient(t, em)
	sender := newSender(t, client, "queue")
	receiver := newReceiver(t, client, "queue", nil)
	sendText(t, sender, "while valid")
	require.NoError(t, receiver.CompleteMessage(ctxT(t), receiveOne(t, receiver), nil))
	require.Equal(t, 2, em.attachedEntityLinks(), "one sender and one receiver link")

	mock.Add(3 * time.Hour)
	waitFor(t, func() bool { return em.attachedEntityLinks() == 0 })

	err := sender.SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("after expiry")}, nil)
	requireCode(t, err, azservicebus.CodeUnauthorizedAccess)
	q, _ := em.Broker().Queue("queue")
	assert.Zero(t, q.Stats().Active, "nothing was stored with an expired token")

	mock.Set(start.Add(time.Minute))
	sendText(t, sender, "renewed")
	msg := receiveAfterRecovery(t, receiver)
	assert.Equal(t, "renewed", string(msg.Body))
	require.NoError(t, receiver.CompleteMessage(ctxT(t), msg, nil))
}

// putToken presents token for name on the connection of session, the way
// the SDK's CBS client does, and returns the reply's status code.
func putToken(t *testing.T, session *amqp.Session, name, token string) int32 {
	t.Helper()
	replyTo := fmt.Sprintf("$cbs-reply-%d", time.Now().UnixNano())
	receiver, err := session.NewReceiver(ctxT(t), "$cbs", &amqp.ReceiverOptions{TargetAddress: replyTo})
	require.NoError(t, err)
	defer func() { _ = receiver.Close(context.Background()) }()
	sender, err := session.NewSender(ctxT(t), "$cbs", nil)
	require.NoError(t, err)
	defer func() { _ = sender.Close(context.Background()) }()
	id := "put-" + replyTo
	require.NoError(t, sender.Send(ctxT(t), &amqp.Message{
		Properties:            &amqp.MessageProperties{MessageID: id, ReplyTo: &replyTo},
		ApplicationProperties: map[string]any{"operation": "put-token", "type": "servicebus.windows.net:sastoken", "name": name},
		Value:                 token,
	}, nil))
	reply, err := receiver.Receive(ctxT(t), nil)
	require.NoError(t, err)
	require.NoError(t, receiver.AcceptMessage(ctxT(t), reply))
	status, _ := reply.ApplicationProperties["status-code"].(int32)
	return status
}

// TestAMQPRenewedTokenKeepsTheLink drives put-token by hand, which the SDK
// only does on its own real-time schedule: a link whose token is renewed
// before it expires stays attached past the first token's expiry, and is
// force-detached with amqp:link:detach-forced ("Code: RenewToken") once
// the renewed token expires too.
func TestAMQPRenewedTokenKeepsTheLink(t *testing.T) {
	mock := clock.NewMock()
	now := time.Now()
	mock.Set(now)
	em := startEmulator(t, Config{StrictAuth: true, Clock: mock})
	session := dialAMQP(t, em)
	audience := "amqp://" + em.Addr().String() + "/queue"
	require.Equal(t, int32(202), putToken(t, session, audience, signSAS(audience, DefaultKeyName, DefaultKey, now.Add(10*time.Minute))))
	receiver, err := session.NewReceiver(ctxT(t), "queue", &amqp.ReceiverOptions{Credit: 10, SettlementMode: amqp.ReceiverSettleModeSecond.Ptr()})
	require.NoError(t, err)

	mock.Add(9 * time.Minute)
	require.Equal(t, int32(202), putToken(t, session, audience, signSAS(audience, DefaultKeyName, DefaultKey, now.Add(time.Hour))))
	mock.Add(2 * time.Minute) // past the first token's expiry
	sendText(t, newSender(t, newClient(t, em), "queue"), "still attached")
	msg, err := receiver.Receive(ctxT(t), nil)
	require.NoError(t, err, "the renewed token keeps the link")
	assert.Equal(t, "still attached", string(msg.GetData()))
	require.NoError(t, receiver.AcceptMessage(ctxT(t), msg))

	mock.Set(now.Add(time.Hour))
	_, err = receiver.Receive(ctxT(t), nil)
	var detached *amqp.LinkError
	require.ErrorAs(t, err, &detached)
	require.NotNil(t, detached.RemoteErr)
	assert.Equal(t, amqp.ErrCondDetachForced, detached.RemoteErr.Condition)
	assert.Contains(t, detached.RemoteErr.Description, "RenewToken")
	assert.NotContains(t, detached.RemoteErr.Description, "sig=", "the token never appears in the error")

	_, err = session.NewReceiver(ctxT(t), "queue", nil)
	var refused *amqp.Error
	require.True(t, errors.As(err, &refused), "a new attach with only an expired token is refused: %v", err)
	assert.Equal(t, amqp.ErrCond(condUnauthorized), refused.Condition)
}

// TestSDKLaxAuthLinksOutliveTheClock: without StrictAuth tokens are not
// checked, so moving the clock far ahead detaches nothing.
func TestSDKLaxAuthLinksOutliveTheClock(t *testing.T) {
	mock := clock.NewMock()
	mock.Set(time.Now())
	em := startEmulator(t, Config{Clock: mock})
	client := newClient(t, em)
	sender := newSender(t, client, "queue")
	sendText(t, sender, "first")
	mock.Add(48 * time.Hour)
	assert.Equal(t, 1, em.attachedEntityLinks())
	sendText(t, sender, "second")
}
