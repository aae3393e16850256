//go:build !live

package e2e

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/internal/syncbuf"
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
		connect, err := retry.NewNamespace(em.ConnectionString(), &retry.ConnectOptions{
			Client: &azservicebus.ClientOptions{RetryOptions: fastRetries}, CheckSettings: true, Admin: em.AdminClientOptions(),
		}).Queue(queue)
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

// A settings check that cannot reach the administration API is not skipped in silence: the log and
// Health().Warnings say that the settings of the entity were not checked, naming the entity and the
// endpoint, and the consumer runs on. Every settings warning names its entity.
func TestSettingsCheckThatCannotRunIsReported(t *testing.T) {
	parallel(t)
	em := sbemu.StartT(t, sbemu.Config{Queues: []broker.QueueConfig{{Name: "weak", MaxDeliveryCount: 2}}})
	run := func(admin *admin.ClientOptions) ([]string, string) {
		var logs syncbuf.Buffer
		connect, err := retry.NewNamespace(em.ConnectionString(), &retry.ConnectOptions{
			Client: &azservicebus.ClientOptions{RetryOptions: fastRetries}, CheckSettings: true, Admin: admin,
		}).Queue("weak")
		require.NoError(t, err)
		c, err := retry.NewConsumer(connect, okHandler, &retry.Options{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		waitRunning(t, c)
		ws := c.Health().Warnings
		cancel()
		require.NoError(t, <-done)
		return ws, logs.String()
	}

	// No transport to the admin API: the SDK's admin client would address the AMQP endpoint over HTTPS,
	// which cannot answer; the check says at once how to point it at the admin API instead.
	unreachable := &admin.ClientOptions{ClientOptions: azcore.ClientOptions{Retry: policy.RetryOptions{MaxRetries: -1}}}
	ws, logs := run(unreachable)
	assert.Contains(t, logs, "AdminClientOptions", "says where to point it, without asking the AMQP port")
	endpoint := "https://" + strings.TrimPrefix(strings.Split(em.ConnectionString(), ";")[0], "Endpoint=sb://") + "/"
	require.Len(t, ws, 1, "one warning: the settings were not checked")
	assert.Contains(t, ws[0], "weak")
	assert.Contains(t, ws[0], "not checked")
	assert.Contains(t, ws[0], endpoint)
	assert.Contains(t, logs, "settings not checked")
	assert.Contains(t, logs, "weak")
	assert.Contains(t, logs, endpoint)
	assert.NotContains(t, logs, "SharedAccessKey=")

	// Reachable: each warning names its entity.
	ws, logs = run(em.AdminClientOptions())
	require.Len(t, ws, 2)
	for _, w := range ws {
		assert.True(t, strings.HasPrefix(w, "weak: "), "a warning that does not name its entity: %q", w)
	}
	assert.Contains(t, logs, "weak: ")
}
