package inspect

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseEntity(t *testing.T) {
	cases := []struct {
		name, path string
		want       Entity
		dlq        string
		wantErr    bool
	}{
		{name: "queue", path: "orders", want: Entity{Queue: "orders"}, dlq: "orders/$DeadLetterQueue"},
		{name: "subscription", path: "events/Subscriptions/billing", want: Entity{Topic: "events", Subscription: "billing"}, dlq: "events/Subscriptions/billing/$DeadLetterQueue"},
		{name: "subscription lower case", path: "events/subscriptions/billing", want: Entity{Topic: "events", Subscription: "billing"}, dlq: "events/Subscriptions/billing/$DeadLetterQueue"},
		{name: "empty", path: "", wantErr: true},
		{name: "dead-letter queue", path: "orders/$DeadLetterQueue", wantErr: true},
		{name: "two segments", path: "events/billing", wantErr: true},
		{name: "empty subscription", path: "events/Subscriptions/", wantErr: true},
		{name: "wrong middle", path: "events/Subs/billing", wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseEntity(tc.path)
			if tc.wantErr {
				assert.ErrorIs(t, err, ErrInvalidEntity)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.dlq, got.DeadLetterPath())
			assert.Equal(t, tc.want.Topic != "", got.IsSubscription())
		})
	}
}

func TestOptionsDefaultsAndValidation(t *testing.T) {
	got, err := (*Options)(nil).withDefaults()
	require.NoError(t, err)
	assert.Equal(t, Options{MaxPeek: DefaultMaxPeek, PeekBatchSize: DefaultPeekBatchSize, MaxSessions: DefaultMaxSessions}, got)
	got, err = (&Options{MaxPeek: 10}).withDefaults()
	require.NoError(t, err)
	assert.Equal(t, 10, got.PeekBatchSize, "a batch never exceeds the bound")
	for name, o := range map[string]Options{
		"negative MaxPeek":       {MaxPeek: -1},
		"negative PeekBatchSize": {PeekBatchSize: -1},
		"negative MaxSessions":   {MaxSessions: -1},
		"retry queue with slash": {RetryQueue: "t/Subscriptions/s"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := o.withDefaults()
			assert.ErrorIs(t, err, ErrInvalidOptions)
		})
	}
	_, err = New(nil, "orders", nil)
	assert.ErrorIs(t, err, ErrInvalidOptions)
}
