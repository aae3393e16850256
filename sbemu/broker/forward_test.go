package broker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestForwardTo(t *testing.T) {
	b, mock := newTopicBroker(t, []QueueConfig{
		{Name: "inbox", ForwardTo: "work"},
		{Name: "work", MaxDeliveryCount: 1, ForwardDeadLetteredMessagesTo: "parking"},
		{Name: "parking"},
	}, TopicConfig{Name: "events", Subscriptions: []SubscriptionConfig{
		{Name: "to-queue", ForwardTo: "inbox"},
		{Name: "dl", MaxDeliveryCount: 1, ForwardDeadLetteredMessagesTo: "parking"},
	}})
	inbox, _ := b.Queue("inbox")
	work, _ := b.Queue("work")
	parking, _ := b.Queue("parking")
	events, _ := b.Queue("events")

	// A message sent to the topic travels subscription -> inbox -> work.
	mustSend(t, events, newMsg("1", "event"))
	assert.Equal(t, Stats{}, mustSubscription(t, b, "events", "to-queue").Stats())
	assert.Equal(t, Stats{}, inbox.Stats())
	d := mustReceive(t, work, PeekLock)
	assert.Equal(t, "event", body(d))

	// Dead-lettered messages of work go to parking, with their reason.
	require.NoError(t, work.DeadLetter(d.LockToken, "Broken", "it broke", nil))
	assert.Equal(t, Stats{}, work.Stats(), "not in work's own dead-letter queue")
	parked := mustReceive(t, parking, ReceiveAndDelete)
	assert.Equal(t, "Broken", parked.Message.ApplicationProperties[PropertyDeadLetterReason])

	// A subscription forwards its dead letters too (here via MaxDeliveryCount).
	dl := mustSubscription(t, b, "events", "dl")
	d = mustReceive(t, dl, PeekLock)
	require.NoError(t, dl.Abandon(d.LockToken, nil))
	parked = mustReceive(t, parking, ReceiveAndDelete)
	assert.Equal(t, ReasonMaxDeliveryCountExceeded, parked.Message.ApplicationProperties[PropertyDeadLetterReason])

	// A message scheduled to a forwarding queue waits there until due.
	_, err := inbox.Schedule(newMsg("3", "later"), 10, mock.Now().Add(time.Minute))
	require.NoError(t, err)
	assert.Equal(t, Stats{Scheduled: 1}, inbox.Stats())
	mock.Add(time.Minute)
	assert.Equal(t, Stats{}, inbox.Stats())
	assert.Equal(t, "later", body(mustReceive(t, work, ReceiveAndDelete)))
}
