//go:build repro

package repro

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

// TestCompleteAfterRejectedDispositionIsNotReportedAsSuccess: the broker rejects one complete with
// server-busy (a settled disposition in state rejected; the lock stays). azservicebus retries the
// settle, but go-amqp marked the message settled when the rejection arrived, so the retried
// AcceptMessage returns nil without sending anything: CompleteMessage reports success after ~4 s (the
// SDK's retry delay) and the message comes back when its lock runs out. Seen in the soak as a handler
// run twice in one process (seed 4).
func TestCompleteAfterRejectedDispositionIsNotReportedAsSuccess(t *testing.T) {
	em, err := sbemu.Start(sbemu.Config{Queues: []broker.QueueConfig{{Name: "q", LockDuration: 2 * time.Second}}})
	require.NoError(t, err)
	defer em.Close()
	ctx := context.Background()
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), nil)
	require.NoError(t, err)
	defer client.Close(ctx)
	sender, err := client.NewSender("q", nil)
	require.NoError(t, err)
	id := "m-1"
	require.NoError(t, sender.SendMessage(ctx, &azservicebus.Message{MessageID: &id}, nil))
	receiver, err := client.NewReceiverForQueue("q", nil)
	require.NoError(t, err)
	msgs, err := receiver.ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 1)

	em.RejectNextSettlements(1, "com.microsoft:server-busy")
	completeErr := receiver.CompleteMessage(ctx, msgs[0], nil)
	q, _ := em.Broker().Queue("q")
	st := q.Stats()
	t.Logf("CompleteMessage returned %v; broker now %+v", completeErr, st)
	if completeErr == nil {
		assert.Zero(t, st.Active+st.Locked, "CompleteMessage returned nil, so the message must be gone")
	}
}
