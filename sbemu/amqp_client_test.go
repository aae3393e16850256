package sbemu

import (
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"
	"github.com/benbjohnson/clock"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

// dialAMQP connects a plain go-amqp client (SASL PLAIN) to em, for the
// protocol features the Service Bus SDK does not use directly.
func dialAMQP(t *testing.T, em *Emulator) *amqp.Session {
	t.Helper()
	conn, err := amqp.Dial(ctxT(t), "amqp://"+em.Addr().String(), &amqp.ConnOptions{SASLType: amqp.SASLTypePlain("user", "pass")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	session, err := conn.NewSession(ctxT(t), nil)
	require.NoError(t, err)
	return session
}

func TestAMQPDrainWithEmptyQueueEndsAtOnce(t *testing.T) {
	em := startEmulator(t, Config{})
	session := dialAMQP(t, em)
	receiver, err := session.NewReceiver(ctxT(t), "queue", &amqp.ReceiverOptions{
		Credit:         -1,
		SettlementMode: amqp.ReceiverSettleModeSecond.Ptr(),
	})
	require.NoError(t, err)
	require.NoError(t, receiver.IssueCredit(5))
	// Returns only when the emulator answers with a drain flow.
	require.NoError(t, receiver.DrainCredit(ctxT(t), nil))
}

func TestAMQPReleaseReturnsMessageUncounted(t *testing.T) {
	em := startEmulator(t, Config{})
	session := dialAMQP(t, em)
	sender, err := session.NewSender(ctxT(t), "queue", nil)
	require.NoError(t, err)
	require.NoError(t, sender.Send(ctxT(t), amqp.NewMessage([]byte("back")), nil))

	receiver, err := session.NewReceiver(ctxT(t), "queue", &amqp.ReceiverOptions{
		Credit:         1,
		SettlementMode: amqp.ReceiverSettleModeSecond.Ptr(),
	})
	require.NoError(t, err)
	msg, err := receiver.Receive(ctxT(t), nil)
	require.NoError(t, err)
	assert.Len(t, msg.DeliveryTag, 16)
	assert.Equal(t, uint32(0), msg.Header.DeliveryCount)
	require.NoError(t, receiver.ReleaseMessage(ctxT(t), msg))

	again, err := receiver.Receive(ctxT(t), nil)
	require.NoError(t, err)
	assert.Equal(t, uint32(0), again.Header.DeliveryCount, "a released delivery does not count")
	require.NoError(t, receiver.AcceptMessage(ctxT(t), again))
}

// TestAMQPUnsupportedManagementOperationFailsFast: an operation the
// emulator does not know is answered 501 at once, not left unanswered.
func TestAMQPUnsupportedManagementOperationFailsFast(t *testing.T) {
	em := startEmulator(t, Config{})
	reply := managementRequest(t, dialAMQP(t, em), "queue/$management", &amqp.Message{
		ApplicationProperties: map[string]any{"operation": "com.microsoft:no-such-operation"},
		Value:                 map[string]any{},
	})
	assert.Equal(t, int32(501), reply.ApplicationProperties["statusCode"])
}

// managementRequest sends msg to node on session and returns the reply.
func managementRequest(t *testing.T, session *amqp.Session, node string, msg *amqp.Message) *amqp.Message {
	t.Helper()
	replyTo := node + "-reply"
	receiver, err := session.NewReceiver(ctxT(t), node, &amqp.ReceiverOptions{TargetAddress: replyTo})
	require.NoError(t, err)
	defer func() { _ = receiver.Close(ctxT(t)) }()
	sender, err := session.NewSender(ctxT(t), node, nil)
	require.NoError(t, err)
	defer func() { _ = sender.Close(ctxT(t)) }()
	msg.Properties = &amqp.MessageProperties{MessageID: "req", ReplyTo: &replyTo}
	require.NoError(t, sender.Send(ctxT(t), msg, nil))
	reply, err := receiver.Receive(ctxT(t), nil)
	require.NoError(t, err)
	require.NoError(t, receiver.AcceptMessage(ctxT(t), reply))
	return reply
}

// amqpRequest sends one request to node ("$cbs" or "<entity>/$management")
// on links of its own and returns the reply.
func amqpRequest(t *testing.T, session *amqp.Session, node string, msg *amqp.Message) *amqp.Message {
	t.Helper()
	id := uuid.NewString()
	replyTo := node + "-reply-" + id
	receiver, err := session.NewReceiver(ctxT(t), node, &amqp.ReceiverOptions{TargetAddress: replyTo})
	require.NoError(t, err)
	defer func() { _ = receiver.Close(ctxT(t)) }()
	sender, err := session.NewSender(ctxT(t), node, nil)
	require.NoError(t, err)
	defer func() { _ = sender.Close(ctxT(t)) }()
	msg.Properties = &amqp.MessageProperties{MessageID: id, ReplyTo: &replyTo}
	require.NoError(t, sender.Send(ctxT(t), msg, nil))
	reply, err := receiver.Receive(ctxT(t), nil)
	require.NoError(t, err)
	require.NoError(t, receiver.AcceptMessage(ctxT(t), reply))
	assert.Equal(t, id, reply.Properties.CorrelationID)
	return reply
}

// TestAMQPManagementFailuresNameTheirErrorCondition: a failed management
// reply carries errorCondition, which the JavaScript SDK maps to its error
// codes (requests.go); a lost lock's 410 is described in Service Bus's words.
func TestAMQPManagementFailuresNameTheirErrorCondition(t *testing.T) {
	em := startEmulator(t, Config{})
	session := dialAMQP(t, em)

	renew := amqpRequest(t, session, "queue/$management", &amqp.Message{
		ApplicationProperties: map[string]any{"operation": "com.microsoft:renew-lock"},
		Value:                 map[string]any{"lock-tokens": []amqp.UUID{{1, 2, 3}}},
	})
	assert.Equal(t, int32(410), renew.ApplicationProperties["statusCode"])
	assert.EqualValues(t, "com.microsoft:message-lock-lost", renew.ApplicationProperties["errorCondition"]) // go-amqp reads a symbol as a string
	desc, _ := renew.ApplicationProperties["statusDescription"].(string)
	assert.True(t, strings.HasPrefix(desc, "The lock supplied is invalid. Either the lock expired, or the message has already been removed from the queue."), desc)

	unknown := amqpRequest(t, session, "queue/$management", &amqp.Message{
		ApplicationProperties: map[string]any{"operation": "com.microsoft:no-such-operation"},
		Value:                 map[string]any{},
	})
	assert.Equal(t, int32(501), unknown.ApplicationProperties["statusCode"])
	assert.EqualValues(t, "amqp:not-implemented", unknown.ApplicationProperties["errorCondition"])

	deferred := amqpRequest(t, session, "queue/$management", &amqp.Message{
		ApplicationProperties: map[string]any{"operation": "com.microsoft:receive-by-sequence-number"},
		Value:                 map[string]any{"sequence-numbers": []int64{12345}, "receiver-settle-mode": uint32(1)},
	})
	assert.Equal(t, int32(404), deferred.ApplicationProperties["statusCode"])
	assert.EqualValues(t, "com.microsoft:message-not-found", deferred.ApplicationProperties["errorCondition"])

	peek := amqpRequest(t, session, "queue/$management", &amqp.Message{
		ApplicationProperties: map[string]any{"operation": "com.microsoft:peek-message"},
		Value:                 map[string]any{"from-sequence-number": int64(1), "message-count": int32(1)},
	})
	assert.Equal(t, int32(204), peek.ApplicationProperties["statusCode"])
	assert.NotContains(t, peek.ApplicationProperties, "errorCondition", "a success names no error")
}

// TestSDKLockLostIsDescribedAsServiceBusDoes: renewing and settling a lost
// lock fail with CodeLockLost and Service Bus's description, which the SDK's
// live test TestReceiverRenewMessageLock checks for.
func TestSDKLockLostIsDescribedAsServiceBusDoes(t *testing.T) {
	clk := clock.NewMock()
	em := startEmulator(t, Config{Clock: clk, Queues: []broker.QueueConfig{{Name: "q", LockDuration: time.Minute}}})
	client := newClient(t, em)
	sendText(t, newSender(t, client, "q"), "short-lived lock")
	receiver := newReceiver(t, client, "q", nil)
	msg := receiveOne(t, receiver)
	clk.Add(2 * time.Minute)

	const serviceBusText = "The lock supplied is invalid. Either the lock expired, or the message has already been removed from the queue"
	err := receiver.RenewMessageLock(ctxT(t), msg, nil)
	requireCode(t, err, azservicebus.CodeLockLost)
	assert.Contains(t, err.Error(), "status code 410 and description: "+serviceBusText)
	err = receiver.CompleteMessage(ctxT(t), msg, nil)
	requireCode(t, err, azservicebus.CodeLockLost)
	assert.Contains(t, err.Error(), serviceBusText)
}

// TestAMQPManagementRepliesUseServiceBusStatusNames checks the reply
// property names: "statusCode"/"statusDescription" on the management node,
// which the JavaScript SDK reads, and "status-code" on $cbs (see requests.go).
func TestAMQPManagementRepliesUseServiceBusStatusNames(t *testing.T) {
	em := startEmulator(t, Config{})
	session := dialAMQP(t, em)
	request := func(node string, msg *amqp.Message) *amqp.Message {
		t.Helper()
		return amqpRequest(t, session, node, msg)
	}

	peek := request("queue/$management", &amqp.Message{
		ApplicationProperties: map[string]any{"operation": "com.microsoft:peek-message"},
		Value:                 map[string]any{"from-sequence-number": int64(1), "message-count": int32(1)},
	})
	assert.Equal(t, int32(204), peek.ApplicationProperties["statusCode"])
	assert.Contains(t, peek.ApplicationProperties, "statusDescription")
	assert.NotContains(t, peek.ApplicationProperties, "status-code")

	token := request("$cbs", &amqp.Message{
		ApplicationProperties: map[string]any{"operation": "put-token", "type": "servicebus.windows.net:sastoken", "name": "amqp://host/queue"},
		Value:                 "token",
	})
	assert.Equal(t, int32(202), token.ApplicationProperties["status-code"])
	assert.NotContains(t, token.ApplicationProperties, "statusCode")
}
