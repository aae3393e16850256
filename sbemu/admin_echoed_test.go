package sbemu

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

// TestAdminTopicEchoesAutoDeletePartitioningAndSize: a topic reports the
// AutoDeleteOnIdle, EnablePartitioning, MaxSizeInMegabytes (16 partitions'
// worth) and EnableBatchedOperations it was created with, an update changes
// AutoDeleteOnIdle but not partitioning, as on Service Bus (the SDK's live
// tests testTopicCreation and TestAdminClient_UpdateTopic).
func TestAdminTopicEchoesAutoDeletePartitioningAndSize(t *testing.T) {
	em := startEmulator(t, Config{})
	ac := newAdminClient(t, em)
	ctx := ctxT(t)

	created, err := ac.CreateTopic(ctx, "events", &admin.CreateTopicOptions{Properties: &admin.TopicProperties{
		AutoDeleteOnIdle:        to.Ptr("PT7M"),
		EnablePartitioning:      to.Ptr(true),
		MaxSizeInMegabytes:      to.Ptr(int32(2048)),
		EnableBatchedOperations: to.Ptr(false),
	}})
	require.NoError(t, err)
	assert.Equal(t, "PT7M", *created.AutoDeleteOnIdle)
	assert.True(t, *created.EnablePartitioning)
	assert.EqualValues(t, 16*2048, *created.MaxSizeInMegabytes)
	assert.False(t, *created.EnableBatchedOperations)

	got, err := ac.GetTopic(ctx, "events", nil)
	require.NoError(t, err)
	assert.Equal(t, created.TopicProperties, got.TopicProperties)

	props := got.TopicProperties
	props.AutoDeleteOnIdle = to.Ptr("PT11M")
	updated, err := ac.UpdateTopic(ctx, "events", props, nil)
	require.NoError(t, err)
	assert.Equal(t, "PT11M", *updated.AutoDeleteOnIdle)
	assert.EqualValues(t, 16*2048, *updated.MaxSizeInMegabytes, "the size read back is the size kept")

	props.EnablePartitioning = to.Ptr(false)
	_, err = ac.UpdateTopic(ctx, "events", props, nil)
	requireStatus(t, err, http.StatusBadRequest)
	assert.Contains(t, err.Error(), "Partitioning cannot be changed for Topic. ")

	plain, err := ac.CreateTopic(ctx, "plain", nil)
	require.NoError(t, err)
	assert.Equal(t, timeSpanMax, *plain.AutoDeleteOnIdle, "never, by default")
	assert.False(t, *plain.EnablePartitioning)
	assert.EqualValues(t, 1024, *plain.MaxSizeInMegabytes)
	assert.True(t, *plain.EnableBatchedOperations)

	_, err = ac.CreateTopic(ctx, "hasty", &admin.CreateTopicOptions{Properties: &admin.TopicProperties{AutoDeleteOnIdle: to.Ptr("PT1M")}})
	requireStatus(t, err, http.StatusBadRequest)
	assert.Contains(t, err.Error(), "minimum of 5 minutes")
}

// TestAdminQueueAndSubscriptionEchoAutoDeleteOnIdle: queues and
// subscriptions report their AutoDeleteOnIdle and EnableBatchedOperations
// too (the SDK's live tests testCreateQueue and testTopicCreation).
func TestAdminQueueAndSubscriptionEchoAutoDeleteOnIdle(t *testing.T) {
	em := startEmulator(t, Config{Topics: []broker.TopicConfig{{Name: "events"}}})
	ac := newAdminClient(t, em)
	ctx := ctxT(t)

	q, err := ac.CreateQueue(ctx, "work", &admin.CreateQueueOptions{Properties: &admin.QueueProperties{
		AutoDeleteOnIdle:   to.Ptr("PT10M"),
		EnablePartitioning: to.Ptr(true),
		MaxSizeInMegabytes: to.Ptr(int32(4096)),
	}})
	require.NoError(t, err)
	assert.Equal(t, "PT10M", *q.AutoDeleteOnIdle)
	assert.EqualValues(t, 16*4096, *q.MaxSizeInMegabytes)

	sub, err := ac.CreateSubscription(ctx, "events", "audit", &admin.CreateSubscriptionOptions{Properties: &admin.SubscriptionProperties{
		AutoDeleteOnIdle:        to.Ptr("PT11M"),
		EnableBatchedOperations: to.Ptr(false),
	}})
	require.NoError(t, err)
	assert.Equal(t, "PT11M", *sub.AutoDeleteOnIdle)
	assert.False(t, *sub.EnableBatchedOperations)
	got, err := ac.GetSubscription(ctx, "events", "audit", nil)
	require.NoError(t, err)
	assert.Equal(t, sub.SubscriptionProperties, got.SubscriptionProperties)
}

// TestAdminForwardToKeepsTheGivenScheme: a forwarding target comes back in
// the form it was written, https:// or sb:// (the SDK's live tests
// TestAdminClient_Queue_Forwarding and TestAdminClient_Forwarding), and a
// bare name as an https URL on the namespace.
func TestAdminForwardToKeepsTheGivenScheme(t *testing.T) {
	em := startEmulator(t, Config{Queues: []broker.QueueConfig{{Name: "target"}}, Topics: []broker.TopicConfig{{Name: "events"}}})
	ac := newAdminClient(t, em)
	ctx := ctxT(t)
	host := em.Addr().String() // the connection string's namespace, which the SDK's URLs name

	tests := []struct {
		name, given, want string
	}{
		{name: "https", given: "https://" + host + "/target", want: "https://" + host + "/target"},
		{name: "sb", given: "sb://" + host + "/target", want: "sb://" + host + "/target"},
		{name: "bare name", given: "target", want: "https://" + host + "/target"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			queue := "from-" + strings.ReplaceAll(tt.name, " ", "-")
			created, err := ac.CreateQueue(ctx, queue, &admin.CreateQueueOptions{Properties: &admin.QueueProperties{
				ForwardTo: to.Ptr(tt.given), ForwardDeadLetteredMessagesTo: to.Ptr(tt.given),
			}})
			require.NoError(t, err)
			assert.Equal(t, tt.want, *created.ForwardTo)
			assert.Equal(t, tt.want, *created.ForwardDeadLetteredMessagesTo)

			sub, err := ac.CreateSubscription(ctx, "events", queue, &admin.CreateSubscriptionOptions{Properties: &admin.SubscriptionProperties{
				ForwardTo: to.Ptr(tt.given),
			}})
			require.NoError(t, err)
			assert.Equal(t, tt.want, *sub.ForwardTo)
		})
	}
}

// TestAdminAccessedAtIsZeroUntilUsed: a queue or topic nobody has sent to
// or received from reports a zero AccessedAt, a subscription its creation,
// as Service Bus does (the SDK's live tests testCreateQueue,
// testTopicCreation and TestAdminClient_ListSubscriptionRuntimeProperties);
// a send and a receive set it.
func TestAdminAccessedAtIsZeroUntilUsed(t *testing.T) {
	clk := clock.NewMock()
	clk.Set(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	em := startEmulator(t, Config{Clock: clk, Queues: []broker.QueueConfig{{Name: "work"}}, Topics: []broker.TopicConfig{{Name: "events", Subscriptions: []broker.SubscriptionConfig{{Name: "s"}}}}})
	ac := newAdminClient(t, em)
	ctx := ctxT(t)

	q, err := ac.GetQueueRuntimeProperties(ctx, "work", nil)
	require.NoError(t, err)
	assert.True(t, q.AccessedAt.IsZero(), "never used: %v", q.AccessedAt)
	topic, err := ac.GetTopicRuntimeProperties(ctx, "events", nil)
	require.NoError(t, err)
	assert.True(t, topic.AccessedAt.IsZero(), "never used: %v", topic.AccessedAt)
	sub, err := ac.GetSubscriptionRuntimeProperties(ctx, "events", "s", nil)
	require.NoError(t, err)
	assert.False(t, sub.AccessedAt.IsZero(), "a subscription counts as accessed from its creation")

	client := newClient(t, em)
	sendText(t, newSender(t, client, "work"), "x")
	q, err = ac.GetQueueRuntimeProperties(ctx, "work", nil)
	require.NoError(t, err)
	assert.True(t, q.AccessedAt.Equal(clk.Now()), "a send sets it: %v", q.AccessedAt)

	clk.Add(time.Minute)
	receiveOne(t, newReceiver(t, client, "work", nil))
	q, err = ac.GetQueueRuntimeProperties(ctx, "work", nil)
	require.NoError(t, err)
	assert.True(t, q.AccessedAt.Equal(clk.Now()), "a receive sets it: %v", q.AccessedAt)
}
