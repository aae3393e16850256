package entitycheck_test

import (
	"context"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry/internal/entitycheck"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func codes(ws []entitycheck.Warning) []entitycheck.Code {
	var out []entitycheck.Code
	for _, w := range ws {
		out = append(out, w.Code)
	}
	return out
}

func TestCheckAgainstTheEmulator(t *testing.T) {
	em := sbemu.StartT(t, sbemu.Config{
		Queues: []broker.QueueConfig{
			{Name: "good", DuplicateDetectionWindow: 10 * time.Minute},
			{Name: "nodedup", MaxDeliveryCount: 3},
			{Name: "shortwindow", DuplicateDetectionWindow: time.Minute, LockDuration: time.Minute},
			{Name: "retries", DuplicateDetectionWindow: 2 * time.Minute, LockDuration: 30 * time.Second},
			{Name: "sessions", RequiresSession: true, DuplicateDetectionWindow: 10 * time.Minute},
		},
		Topics: []broker.TopicConfig{{Name: "events", Subscriptions: []broker.SubscriptionConfig{
			{Name: "billing", LockDuration: 2 * time.Minute, MaxDeliveryCount: 2},
		}}},
	})
	ac, err := admin.NewClientFromConnectionString(em.ConnectionString(), em.AdminClientOptions())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	tests := []struct {
		name   string
		entity string
		opts   *entitycheck.Options
		want   []entitycheck.Code
	}{
		{"recommended settings", "good", nil, nil},
		{"a session queue: copies would rejoin their session out of order", "sessions", nil, []entitycheck.Code{entitycheck.RequiresSession}},
		{"duplicate detection off, few deliveries", "nodedup", nil, []entitycheck.Code{entitycheck.MaxDeliveryCountLow, entitycheck.DuplicateDetectionOff}},
		{"window below lock + settle + handler", "shortwindow", nil, []entitycheck.Code{entitycheck.DuplicateDetectionWindowShort}},
		{"long handlers need a longer window", "good", &entitycheck.Options{HandlerAllowance: 9 * time.Minute}, []entitycheck.Code{entitycheck.DuplicateDetectionWindowShort}},
		{"subscription alone", "events/Subscriptions/billing", nil, []entitycheck.Code{entitycheck.MaxDeliveryCountLow}},
		{"subscription with its retry queue: the subscription's longer lock counts", "events/Subscriptions/billing",
			&entitycheck.Options{RetryQueue: "retries"}, []entitycheck.Code{entitycheck.MaxDeliveryCountLow, entitycheck.DuplicateDetectionWindowShort}},
		{"retry queue window long enough", "events/Subscriptions/billing",
			&entitycheck.Options{RetryQueue: "good"}, []entitycheck.Code{entitycheck.MaxDeliveryCountLow}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ws, err := entitycheck.Check(ctx, ac, tc.entity, tc.opts)
			require.NoError(t, err)
			assert.Equal(t, tc.want, codes(ws))
			for _, w := range ws {
				assert.NotEmpty(t, w.Message)
				assert.NotEmpty(t, w.Entity)
			}
		})
	}

	ws, err := entitycheck.Check(ctx, ac, "shortwindow", nil)
	require.NoError(t, err)
	assert.Contains(t, ws[0].Message, "2m30s", "lock 1m + settle 30s + handler 1m")

	_, err = entitycheck.Check(ctx, ac, "missing", nil)
	assert.ErrorIs(t, err, entitycheck.ErrNotFound)
	_, err = entitycheck.Check(ctx, ac, "events/Subscriptions/none", nil)
	assert.ErrorIs(t, err, entitycheck.ErrNotFound)
	_, err = entitycheck.Check(ctx, ac, "a/b", nil)
	assert.Error(t, err)
}
