package sbemu

import (
	"testing"

	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

// TestAMQPPutTokenForAMissingEntityIsNotFound: put-token answers 404 for an
// audience naming a queue, topic or subscription that does not exist
// (with or without "/$management" after it), and 202 for one that does and
// for the namespace itself.
func TestAMQPPutTokenForAMissingEntityIsNotFound(t *testing.T) {
	em := startEmulator(t, Config{
		Queues: []broker.QueueConfig{{Name: "orders"}},
		Topics: []broker.TopicConfig{{Name: "events", Subscriptions: []broker.SubscriptionConfig{{Name: "audit"}}}},
	})
	session := dialAMQP(t, em)
	base := "amqp://" + em.Addr().String() + "/"
	tests := []struct {
		name     string
		audience string
		want     int32
	}{
		{"queue", base + "orders", 202},
		{"queue, other case", base + "ORDERS", 202},
		{"management node", base + "orders/$management", 202},
		{"dead-letter queue", base + "orders/$DeadLetterQueue", 202},
		{"topic", base + "events", 202},
		{"subscription", base + "events/Subscriptions/audit", 202},
		{"namespace", "sb://" + em.Addr().String() + "/", 202},
		{"missing queue", base + "missing", 404},
		{"missing queue's management node", base + "missing/$management", 404},
		{"missing subscription", base + "events/Subscriptions/missing", 404},
		{"missing topic's subscription", base + "missing/Subscriptions/audit", 404},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, putToken(t, session, tc.audience, "any token"))
		})
	}
}

// TestAMQPSecondCBSLinkIsRefused: while a sender to "$cbs" is attached on a
// connection, a second one (on another session) is refused with
// amqp:not-allowed, which the SDK answers by resetting the connection;
// receivers are limited the same way; once the first sender is closed a new
// one attaches.
func TestAMQPSecondCBSLinkIsRefused(t *testing.T) {
	em := startEmulator(t, Config{})
	conn, err := amqp.Dial(ctxT(t), "amqp://"+em.Addr().String(), &amqp.ConnOptions{SASLType: amqp.SASLTypeAnonymous()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	session, err := conn.NewSession(ctxT(t), nil)
	require.NoError(t, err)
	first, err := session.NewSender(ctxT(t), "$cbs", nil)
	require.NoError(t, err)
	firstReply, err := session.NewReceiver(ctxT(t), "$cbs", &amqp.ReceiverOptions{TargetAddress: "$cbs-reply-1"})
	require.NoError(t, err)

	other, err := conn.NewSession(ctxT(t), nil)
	require.NoError(t, err)
	_, err = other.NewSender(ctxT(t), "$cbs", nil)
	var refused *amqp.Error
	require.ErrorAs(t, err, &refused)
	assert.Equal(t, amqp.ErrCondNotAllowed, refused.Condition)
	_, err = other.NewReceiver(ctxT(t), "$cbs", &amqp.ReceiverOptions{TargetAddress: "$cbs-reply-2"})
	require.ErrorAs(t, err, &refused)
	assert.Equal(t, amqp.ErrCondNotAllowed, refused.Condition)

	require.NoError(t, first.Close(ctxT(t)))
	require.NoError(t, firstReply.Close(ctxT(t)))
	assert.Equal(t, int32(202), putToken(t, other, "amqp://"+em.Addr().String()+"/queue", "any token"), "one pair at a time is fine")
}
