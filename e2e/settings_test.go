//go:build !live

package e2e

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// With CheckSettings the consumer reads the entity's settings through the administration API at start
// and reports those that weaken the crash contract: here duplicate detection is off and
// MaxDeliveryCount is 2. A queue set up as recommended gets no warning.
func TestSettingsWarningsAtStart(t *testing.T) {
	parallel(t)
	em := sbemu.StartT(t, sbemu.Config{Queues: []broker.QueueConfig{
		{Name: "weak", MaxDeliveryCount: 2},
		{Name: "good", DuplicateDetectionWindow: 10 * time.Minute},
	}})
	warnings := func(queue string) []string {
		connect, err := retry.QueueConnectionString(em.ConnectionString(), queue, &retry.ConnectOptions{
			Client: &azservicebus.ClientOptions{RetryOptions: fastRetries}, CheckSettings: true, Admin: em.AdminClientOptions(),
		})
		require.NoError(t, err)
		c, err := retry.NewConsumer(connect, okHandler, &retry.Options{Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		waitRunning(t, c)
		ws := c.Health().Warnings
		cancel()
		require.NoError(t, <-done)
		return ws
	}
	weak := strings.Join(warnings("weak"), "\n")
	assert.Contains(t, strings.ToLower(weak), "duplicate detection")
	assert.Contains(t, weak, "MaxDeliveryCount")
	assert.Empty(t, warnings("good"))
}
