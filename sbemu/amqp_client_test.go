package sbemu

import (
	"testing"

	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// TestAMQPManagementRepliesUseServiceBusStatusNames checks the reply
// property names: "statusCode"/"statusDescription" on the management node,
// which the JavaScript SDK reads, and "status-code" on $cbs (see requests.go).
func TestAMQPManagementRepliesUseServiceBusStatusNames(t *testing.T) {
	em := startEmulator(t, Config{})
	session := dialAMQP(t, em)
	request := func(node string, msg *amqp.Message) *amqp.Message {
		t.Helper()
		replyTo := node + "-reply"
		receiver, err := session.NewReceiver(ctxT(t), node, &amqp.ReceiverOptions{TargetAddress: replyTo})
		require.NoError(t, err)
		sender, err := session.NewSender(ctxT(t), node, nil)
		require.NoError(t, err)
		id := "req-" + node
		msg.Properties = &amqp.MessageProperties{MessageID: id, ReplyTo: &replyTo}
		require.NoError(t, sender.Send(ctxT(t), msg, nil))
		reply, err := receiver.Receive(ctxT(t), nil)
		require.NoError(t, err)
		require.NoError(t, receiver.AcceptMessage(ctxT(t), reply))
		assert.Equal(t, id, reply.Properties.CorrelationID)
		return reply
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
