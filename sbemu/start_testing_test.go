package sbemu_test

import (
	"context"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// TestStartT is written the way a user's own test would be: one line starts
// the emulator, the SDK connects with its connection string, and the broker
// is inspected afterwards. Copy it as a starting point.
func TestStartT(t *testing.T) {
	em := sbemu.StartT(t, sbemu.Config{Queues: []broker.QueueConfig{{Name: "orders"}}})

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close(context.Background()) })

	sender, err := client.NewSender("orders", nil)
	require.NoError(t, err)
	require.NoError(t, sender.SendMessage(ctx, &azservicebus.Message{Body: []byte("hello")}, nil))

	receiver, err := client.NewReceiverForQueue("orders", nil)
	require.NoError(t, err)
	msgs, err := receiver.ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	assert.Equal(t, "hello", string(msgs[0].Body))
	require.NoError(t, receiver.DeadLetterMessage(ctx, msgs[0], nil))

	q, ok := em.Broker().Queue("orders")
	require.True(t, ok)
	assert.Equal(t, broker.Stats{DeadLettered: 1}, q.Stats())
}

// fakeTB records what StartT reports, to check its failure path without
// failing the real test.
type fakeTB struct {
	testing.TB
	fatal    string
	cleanups []func()
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatal = format
	// The real Fatalf stops the goroutine; StartT must not go on either.
	panic(f)
}
func (f *fakeTB) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }

func TestStartTFailsTheTestOnAStartError(t *testing.T) {
	tb := &fakeTB{TB: t}
	func() {
		defer func() {
			r := recover()
			require.Equal(t, tb, r, "StartT must stop at Fatalf")
		}()
		sbemu.StartT(tb, sbemu.Config{Queues: []broker.QueueConfig{{Name: "a/b"}}})
	}()
	assert.Contains(t, tb.fatal, "starting emulator")
	assert.Empty(t, tb.cleanups, "nothing to clean up after a failed start")
}
