//go:build repro

package repro

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// TestTwo503sOnTheSendRightsProbeCost15s: a consumer starts (or reconnects) while the namespace answers
// schedule-message with 503 twice. The connection check's send-rights probe is a ScheduleMessages call;
// with the SDK's default retries (4 s, then 8 s) it outlives the 10 s connect bound, the connect counts as
// failed, and the first reconnect waits 5 s: the first message is handled ~15 s after start although
// nothing was ever unauthorized and receiving worked all along (one 503 costs ~4 s). Seen in the soak as
// 11.3 s and 5.9 s windows without progress after a kill (seeds 2 and 3).
func TestTwo503sOnTheSendRightsProbeCost15s(t *testing.T) {
	em, err := sbemu.Start(sbemu.Config{Queues: []broker.QueueConfig{{Name: "q", DuplicateDetectionWindow: time.Hour}}})
	require.NoError(t, err)
	defer em.Close()
	ctx := context.Background()
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), nil)
	require.NoError(t, err)
	defer client.Close(ctx)
	sender, err := client.NewSender("q", nil)
	require.NoError(t, err)
	require.NoError(t, sender.SendMessage(ctx, &azservicebus.Message{Body: []byte("x")}, nil))

	em.RejectNextManagement(2, "com.microsoft:schedule-message", 503)
	connect, err := retry.NewNamespace(em.ConnectionString(), nil).Queue("q")
	require.NoError(t, err)
	handled := make(chan time.Time, 1)
	c, err := retry.NewConsumer(connect, func(context.Context, *azservicebus.ReceivedMessage) error {
		handled <- time.Now()
		return nil
	}, &retry.Options{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	start := time.Now()
	go func() { _ = c.Run(runCtx); close(done) }()
	defer func() { cancel(); <-done }()
	select {
	case at := <-handled:
		t.Logf("first message handled %v after start; connect failures %d", at.Sub(start).Round(100*time.Millisecond), c.Health().ConnectFailures)
		assert.Less(t, at.Sub(start), 5*time.Second, "two transient 503s should not keep a healthy consumer idle")
	case <-time.After(30 * time.Second):
		t.Fatal("no message handled within 30 s")
	}
}
