package broker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewValidatesConfig(t *testing.T) {
	tests := []struct {
		name   string
		queues []QueueConfig
	}{
		{"empty name", []QueueConfig{{Name: ""}}},
		{"blank name", []QueueConfig{{Name: "  "}}},
		{"slash in name", []QueueConfig{{Name: "a/b"}}},
		{"duplicate name", []QueueConfig{{Name: "q"}, {Name: "q"}}},
		{"duplicate name differing in case", []QueueConfig{{Name: "Orders"}, {Name: "orders"}}},
		{"negative lock duration", []QueueConfig{{Name: "q", LockDuration: -time.Second}}},
		{"lock duration over 5 minutes", []QueueConfig{{Name: "q", LockDuration: 6 * time.Minute}}},
		{"negative max delivery count", []QueueConfig{{Name: "q", MaxDeliveryCount: -1}}},
		{"negative duplicate window", []QueueConfig{{Name: "q", DuplicateDetectionWindow: -time.Second}}},
		{"negative default TTL", []QueueConfig{{Name: "q", DefaultTTL: -time.Second}}},
		{"negative max message size", []QueueConfig{{Name: "q", MaxMessageSize: -1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := New(Options{}, tt.queues...)
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.Nil(t, b)
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	c := QueueConfig{Name: "q"}.withDefaults()
	assert.Equal(t, 60*time.Second, c.LockDuration)
	assert.Equal(t, 10, c.MaxDeliveryCount)
	assert.Equal(t, 256*1024, c.MaxMessageSize)
	assert.Zero(t, c.DuplicateDetectionWindow)
	assert.Zero(t, c.DefaultTTL)

	explicit := QueueConfig{Name: "q", LockDuration: time.Second, MaxDeliveryCount: 2, MaxMessageSize: 5}.withDefaults()
	assert.Equal(t, time.Second, explicit.LockDuration)
	assert.Equal(t, 2, explicit.MaxDeliveryCount)
	assert.Equal(t, 5, explicit.MaxMessageSize)
}
