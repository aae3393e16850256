package sbemu

import (
	"errors"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

// requireDisabled asserts that err carries com.microsoft:entity-disabled
// with Service Bus's description.
func requireDisabled(t *testing.T, err error, description string) {
	t.Helper()
	var amqpErr *amqp.Error
	require.True(t, errors.As(err, &amqpErr), "want *amqp.Error, got %T: %v", err, err)
	assert.Equal(t, amqp.ErrCond(condEntityDisabled), amqpErr.Condition)
	assert.Contains(t, amqpErr.Description, description)
}

// TestAdminEntityStatusIsStoredAndEchoed: the administration API keeps the
// status a client sets on a queue, topic or subscription and reports it
// back; a status only the service sets is refused.
func TestAdminEntityStatusIsStoredAndEchoed(t *testing.T) {
	em := startEmulator(t, Config{Topics: []broker.TopicConfig{{Name: "t", Subscriptions: []broker.SubscriptionConfig{{Name: "paused", Status: broker.StatusReceiveDisabled}}}}})
	ac := newAdminClient(t, em)
	ctx := ctxT(t)

	created, err := ac.CreateQueue(ctx, "q", &admin.CreateQueueOptions{Properties: &admin.QueueProperties{Status: to.Ptr(admin.EntityStatusReceiveDisabled)}})
	require.NoError(t, err)
	assert.Equal(t, admin.EntityStatusReceiveDisabled, *created.Status)
	got, err := ac.GetQueue(ctx, "q", nil)
	require.NoError(t, err)
	assert.Equal(t, admin.EntityStatusReceiveDisabled, *got.Status)
	got.Status = to.Ptr(admin.EntityStatusSendDisabled)
	updated, err := ac.UpdateQueue(ctx, "q", got.QueueProperties, nil)
	require.NoError(t, err)
	assert.Equal(t, admin.EntityStatusSendDisabled, *updated.Status)
	q, _ := em.Broker().Queue("q")
	assert.Equal(t, broker.StatusSendDisabled, q.Status())

	got.Status = to.Ptr(admin.EntityStatus("Restoring"))
	_, err = ac.UpdateQueue(ctx, "q", got.QueueProperties, nil)
	requireStatus(t, err, 400)

	topic, err := ac.GetTopic(ctx, "t", nil)
	require.NoError(t, err)
	assert.Equal(t, admin.EntityStatusActive, *topic.Status)
	topic.Status = to.Ptr(admin.EntityStatusDisabled)
	updatedTopic, err := ac.UpdateTopic(ctx, "t", topic.TopicProperties, nil)
	require.NoError(t, err)
	assert.Equal(t, admin.EntityStatusDisabled, *updatedTopic.Status)

	// The Go SDK does not send a subscription's Status
	// (admin_client_subscription.go), so the subscription's comes from the
	// configuration.
	sub, err := ac.GetSubscription(ctx, "t", "paused", nil)
	require.NoError(t, err)
	assert.Equal(t, admin.EntityStatusReceiveDisabled, *sub.Status)
}

// TestAdminRequiresSessionCannotChange: an update that changes
// RequiresSession is refused in Service Bus's words, which the SDK's live
// tests look for.
func TestAdminRequiresSessionCannotChange(t *testing.T) {
	em := startEmulator(t, Config{Queues: []broker.QueueConfig{{Name: "q"}}, Topics: []broker.TopicConfig{{Name: "t", Subscriptions: []broker.SubscriptionConfig{{Name: "s"}}}}})
	ac := newAdminClient(t, em)
	ctx := ctxT(t)
	q, err := ac.GetQueue(ctx, "q", nil)
	require.NoError(t, err)
	q.RequiresSession = to.Ptr(true)
	_, err = ac.UpdateQueue(ctx, "q", q.QueueProperties, nil)
	requireStatus(t, err, 400)
	assert.Contains(t, err.Error(), "The value for the RequiresSession property of an existing Queue cannot be changed")

	s, err := ac.GetSubscription(ctx, "t", "s", nil)
	require.NoError(t, err)
	s.RequiresSession = to.Ptr(true)
	_, err = ac.UpdateSubscription(ctx, "t", "s", s.SubscriptionProperties, nil)
	requireStatus(t, err, 400)
	assert.Contains(t, err.Error(), "The value for the RequiresSession property of an existing Subscription cannot be changed")
}

// TestSDKSendDisabledRefusesSends: a SendDisabled queue refuses the SDK's
// sender with com.microsoft:entity-disabled and Service Bus's words, and
// still delivers what it holds.
func TestSDKSendDisabledRefusesSends(t *testing.T) {
	em := startEmulator(t, Config{Queues: []broker.QueueConfig{{Name: "q"}}})
	client := newClient(t, em)
	sendText(t, newSender(t, client, "q"), "before")
	setStatus(t, em, "q", broker.StatusSendDisabled)

	err := newSender(t, client, "q").SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("after")}, nil)
	requireDisabled(t, err, "Messaging entity 'q' is currently disabled for Send operations.")
	receiver := newReceiver(t, client, "q", nil)
	msg := receiveOne(t, receiver)
	assert.Equal(t, "before", string(msg.Body))
	require.NoError(t, receiver.CompleteMessage(ctxT(t), msg, nil))
}

// TestSDKReceiveDisabledRefusesReceives: a ReceiveDisabled queue refuses a
// new receiver, fails the completion of a message received before the
// change, and still takes sends; an attached sender whose queue becomes
// SendDisabled has its next message rejected.
func TestSDKReceiveDisabledRefusesReceives(t *testing.T) {
	em := startEmulator(t, Config{Queues: []broker.QueueConfig{{Name: "q"}}})
	client := newClient(t, em)
	sender := newSender(t, client, "q")
	sendText(t, sender, "first")
	early := newReceiver(t, client, "q", nil)
	msg := receiveOne(t, early)

	setStatus(t, em, "q", broker.StatusReceiveDisabled)
	sendText(t, sender, "sends still work")
	err := early.CompleteMessage(ctxT(t), msg, nil)
	requireDisabled(t, err, "Messaging entity 'q' is currently disabled.")
	_, err = newReceiver(t, client, "q", nil).ReceiveMessages(ctxT(t), 1, nil)
	requireDisabled(t, err, "Messaging entity 'q' is currently disabled.")

	setStatus(t, em, "q", broker.StatusSendDisabled)
	err = sender.SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("refused")}, nil)
	requireDisabled(t, err, "disabled for Send operations")
	q, _ := em.Broker().Queue("q")
	st := q.Stats()
	assert.Equal(t, 1, st.Locked, "the first message stays locked: its completion failed")
	assert.Equal(t, 1, st.Active, "the refused third message was not added")
}

// TestSDKDisabledTopicRefusesItsSubscriptions: nothing is received from a
// subscription of a Disabled topic, and nothing is sent to the topic.
func TestSDKDisabledTopicRefusesItsSubscriptions(t *testing.T) {
	em := startEmulator(t, Config{Topics: []broker.TopicConfig{{Name: "t", Status: broker.StatusDisabled, Subscriptions: []broker.SubscriptionConfig{{Name: "s"}}}}})
	client := newClient(t, em)
	err := newSender(t, client, "t").SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("x")}, nil)
	requireDisabled(t, err, "disabled for Send operations")
	receiver, err := client.NewReceiverForSubscription("t", "s", nil)
	require.NoError(t, err)
	defer func() { _ = receiver.Close(ctxT(t)) }()
	_, err = receiver.ReceiveMessages(ctxT(t), 1, nil)
	requireDisabled(t, err, "is currently disabled")
}

// setStatus changes queue's status through the broker.
func setStatus(t *testing.T, em *Emulator, queue string, st broker.EntityStatus) {
	t.Helper()
	cfg, ok := em.Broker().QueueConfig(queue)
	require.True(t, ok)
	cfg.Status = st
	require.NoError(t, em.Broker().UpdateQueue(cfg))
}
