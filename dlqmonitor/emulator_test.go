package dlqmonitor_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"net/http"
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

// TestMonitorErrorsNameTheEndpoint gives the monitor an admin client that
// does not trust the emulator's certificate: the error says which endpoint
// it could not read, not only "x509: certificate signed by unknown
// authority", and counts in the monitor's health. Before, the error named
// the entity only, and nothing counted it.
func TestMonitorErrorsNameTheEndpoint(t *testing.T) {
	em := sbemu.StartT(t, sbemu.Config{Queues: []broker.QueueConfig{{Name: "orders"}}})
	opts := em.AdminClientOptions()
	tr := opts.Transport.(*http.Client).Transport.(*http.Transport)
	tr.TLSClientConfig.RootCAs = x509.NewCertPool() // trusts nothing
	opts.Retry.MaxRetries = -1
	ac, err := admin.NewClientFromConnectionString(em.ConnectionString(), opts)
	require.NoError(t, err)
	m, err := dlqmonitor.New(ac, []string{"orders"}, nil)
	require.NoError(t, err)

	res := m.Poll(context.Background())
	require.Error(t, res[0].Err)
	endpoint := "https://" + em.Addr().String() + "/"
	assert.Contains(t, res[0].Err.Error(), "reading orders at "+endpoint)
	assert.Contains(t, res[0].Err.Error(), "x509")
	h := m.Health()
	assert.False(t, h.OK())
	assert.Equal(t, uint64(1), h.Failures)
	assert.Contains(t, h.LastError, endpoint)
}

// TestMonitorFollowsARestartedEmulator is the monitor next to
// cmd/sbemu -data DIR, with its admin client built from DIR alone: it
// reads the count, reports (in its errors and health) that the emulator is
// gone while it is down, and reads the kept count again once the emulator
// is back on new ports, with nothing changed on the monitor's side. Before,
// such a monitor trusted the first run's certificate and failed forever
// after a restart with "x509: certificate signed by unknown authority".
func TestMonitorFollowsARestartedEmulator(t *testing.T) {
	dir := t.TempDir()
	cfg := sbemu.Config{DataDir: dir, Queues: []broker.QueueConfig{{Name: "orders"}}}
	first, err := sbemu.Start(cfg)
	require.NoError(t, err)
	connStr := first.ConnectionString()
	client, err := azservicebus.NewClientFromConnectionString(connStr, nil)
	require.NoError(t, err)
	sender, err := client.NewSender("orders", nil)
	require.NoError(t, err)
	receiver, err := client.NewReceiverForQueue("orders", nil)
	require.NoError(t, err)
	deadLetterOne(t, sender, receiver)
	require.NoError(t, client.Close(context.Background()))

	opts, err := sbemu.AdminClientOptionsFromDir(dir)
	require.NoError(t, err)
	opts.Retry.MaxRetries = -1
	ac, err := admin.NewClientFromConnectionString(connStr, opts)
	require.NoError(t, err)
	m, err := dlqmonitor.New(ac, []string{"orders"}, nil)
	require.NoError(t, err)
	res := m.Poll(context.Background())
	require.NoError(t, res[0].Err)
	assert.Equal(t, int64(1), res[0].Count)

	require.NoError(t, first.Close())
	res = m.Poll(context.Background())
	require.Error(t, res[0].Err)
	assert.Contains(t, res[0].Err.Error(), "reading orders at https://"+first.Addr().String()+"/")
	assert.Contains(t, res[0].Err.Error(), "no emulator is running with the data directory "+dir)
	assert.False(t, m.Health().OK())

	sbemu.StartT(t, cfg)
	res = m.Poll(context.Background())
	require.NoError(t, res[0].Err, "the same monitor reads the restarted emulator")
	assert.Equal(t, int64(1), res[0].Count, "the dead letter was kept")
	assert.True(t, m.Health().OK())
}

// BenchmarkPollFromDir measures one poll of one entity through the admin
// client options built from a data directory (a new TLS connection per
// request, the endpoints file read each time), to compare with
// BenchmarkPollPerEntity/entities=1 (kept-alive connections).
func BenchmarkPollFromDir(b *testing.B) {
	dir := b.TempDir()
	em := sbemu.StartT(b, sbemu.Config{DataDir: dir, Queues: []broker.QueueConfig{{Name: "orders"}}})
	opts, err := sbemu.AdminClientOptionsFromDir(dir)
	require.NoError(b, err)
	ac, err := admin.NewClientFromConnectionString(em.ConnectionString(), opts)
	require.NoError(b, err)
	m, err := dlqmonitor.New(ac, []string{"orders"}, nil)
	require.NoError(b, err)
	ctx := context.Background()
	for b.Loop() {
		if r := m.Poll(ctx); r[0].Err != nil {
			b.Fatal(r[0].Err)
		}
	}
}
