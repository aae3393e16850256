package dlqmonitor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/dlqmonitor"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// deadLetterOne sends a message to entity and dead-letters it through the
// real SDK, from receiver.
func deadLetterOne(t *testing.T, sender *azservicebus.Sender, receiver *azservicebus.Receiver) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, sender.SendMessage(ctx, &azservicebus.Message{Body: []byte("poison")}, nil))
	msgs, err := receiver.ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.NoError(t, receiver.DeadLetterMessage(ctx, msgs[0], &azservicebus.DeadLetterOptions{Reason: to.Ptr("test")}))
}

func TestMonitorAgainstTheEmulator(t *testing.T) {
	em := sbemu.StartT(t, sbemu.Config{
		Queues: []broker.QueueConfig{{Name: "orders"}},
		Topics: []broker.TopicConfig{{Name: "events", Subscriptions: []broker.SubscriptionConfig{{Name: "billing"}}}},
	})
	ac, err := admin.NewClientFromConnectionString(em.ConnectionString(), em.AdminClientOptions())
	require.NoError(t, err)
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close(context.Background()) })
	sender, err := client.NewSender("orders", nil)
	require.NoError(t, err)
	receiver, err := client.NewReceiverForQueue("orders", nil)
	require.NoError(t, err)
	topicSender, err := client.NewSender("events", nil)
	require.NoError(t, err)
	subReceiver, err := client.NewReceiverForSubscription("events", "billing", nil)
	require.NoError(t, err)

	clock := newStepClock()
	polls := make(chan []dlqmonitor.DeadLetterParams, 8)
	var pending []dlqmonitor.DeadLetterParams
	m, err := dlqmonitor.New(ac, []string{"orders", "events/Subscriptions/billing"}, &dlqmonitor.Options{
		Clock:         clock,
		OnDeadLetters: func(p dlqmonitor.DeadLetterParams) { p.Time = time.Time{}; pending = append(pending, p) },
		OnError:       func(p dlqmonitor.ErrorParams) { t.Errorf("poll error: %v", p.Err) },
		OnPoll:        func(dlqmonitor.PollParams) { polls <- pending; pending = nil },
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	nextPoll := func() []dlqmonitor.DeadLetterParams {
		t.Helper()
		select {
		case p := <-polls:
			return p
		case <-time.After(20 * time.Second):
			t.Fatal("no poll")
			return nil
		}
	}

	assert.Empty(t, nextPoll(), "nothing dead-lettered yet")

	deadLetterOne(t, sender, receiver)
	assert.Equal(t, time.Minute, clock.next(t), "the default interval")
	assert.Equal(t, []dlqmonitor.DeadLetterParams{{Entity: "orders", Count: 1, New: 1}}, nextPoll())

	deadLetterOne(t, sender, receiver)
	deadLetterOne(t, topicSender, subReceiver)
	clock.next(t)
	assert.Equal(t, []dlqmonitor.DeadLetterParams{
		{Entity: "orders", Count: 2, New: 1},
		{Entity: "events/Subscriptions/billing", Count: 1, New: 1},
	}, nextPoll())

	clock.next(t)
	assert.Equal(t, []dlqmonitor.DeadLetterParams{
		{Entity: "orders", Count: 2, New: 0},
		{Entity: "events/Subscriptions/billing", Count: 1, New: 0},
	}, nextPoll(), "no new dead letters: still over the threshold, nothing new")
}

// BenchmarkPollPerEntity measures one poll's cost per entity against the
// emulator's admin API over loopback HTTPS (keep-alive connections).
func BenchmarkPollPerEntity(b *testing.B) {
	for _, n := range []int{1, 10, 50} {
		b.Run(fmt.Sprintf("entities=%d", n), func(b *testing.B) {
			var queues []broker.QueueConfig
			var names []string
			for i := range n {
				name := fmt.Sprintf("q%02d", i)
				queues = append(queues, broker.QueueConfig{Name: name})
				names = append(names, name)
			}
			em := sbemu.StartT(b, sbemu.Config{Queues: queues})
			ac, err := admin.NewClientFromConnectionString(em.ConnectionString(), em.AdminClientOptions())
			require.NoError(b, err)
			m, err := dlqmonitor.New(ac, names, nil)
			require.NoError(b, err)
			ctx := context.Background()
			m.Poll(ctx) // warm the connection
			b.ResetTimer()
			for b.Loop() {
				for _, r := range m.Poll(ctx) {
					if r.Err != nil {
						b.Fatal(r.Err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n)/1e3, "µs/entity")
		})
	}
}
