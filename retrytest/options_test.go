package retrytest_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/retrytest"
	"github.com/sbretry/retry/sbemu/broker"
)

func TestNewRejectsInvalidOptions(t *testing.T) {
	cases := []struct {
		name string
		opts retrytest.BrokerOptions
	}{
		{"negative lock duration", retrytest.BrokerOptions{LockDuration: -time.Second}},
		{"lock duration above 5 minutes", retrytest.BrokerOptions{LockDuration: 6 * time.Minute}},
		{"negative max delivery count", retrytest.BrokerOptions{MaxDeliveryCount: -1}},
		{"negative duplicate window", retrytest.BrokerOptions{DuplicateDetectionWindow: -time.Second}},
		{"negative default TTL", retrytest.BrokerOptions{DefaultMessageTimeToLive: -time.Second}},
		{"negative max message size", retrytest.BrokerOptions{MaxMessageSize: -1}},
		{"entity path with a slash", retrytest.BrokerOptions{EntityPath: "a/b"}},
		{"subscription rule that does not parse", retrytest.BrokerOptions{Subscriptions: []broker.SubscriptionConfig{{Name: "s", Rules: []broker.RuleConfig{{Name: "r", SQLFilter: "region = "}}}}}},
		{"duplicate subscription", retrytest.BrokerOptions{Subscriptions: []broker.SubscriptionConfig{{Name: "s"}, {Name: "S"}}}},
		{"subscription forwarding", retrytest.BrokerOptions{Subscriptions: []broker.SubscriptionConfig{{Name: "s", ForwardTo: "elsewhere"}}}},
		{"subscription path without a subscription", retrytest.BrokerOptions{EntityPath: "orders/Subscriptions/"}},
		{"subscription path without a topic", retrytest.BrokerOptions{EntityPath: "/Subscriptions/billing"}},
		{"subscription path with another slash", retrytest.BrokerOptions{EntityPath: "orders/Subscriptions/billing/more"}},
		{"subscription path not among the subscriptions", retrytest.BrokerOptions{EntityPath: "orders/Subscriptions/billing", Subscriptions: []broker.SubscriptionConfig{{Name: "audit"}}}},
		{"retry queue of a queue", retrytest.BrokerOptions{EntityPath: "orders", RetryQueue: "orders-retry"}},
		{"retry queue with a slash", retrytest.BrokerOptions{EntityPath: "orders/Subscriptions/billing", RetryQueue: "orders/retry"}},
		{"retry queue named like its topic", retrytest.BrokerOptions{EntityPath: "orders/Subscriptions/billing", RetryQueue: "Orders"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := retrytest.New(clock.NewMock(), &tc.opts)
			require.ErrorIs(t, err, broker.ErrInvalidConfig)
			assert.Nil(t, b)
		})
	}
}

func TestNewWithDefaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := retrytest.New(nil, nil)
		require.NoError(t, err)
		_, err = b.Send(&azservicebus.Message{Body: []byte("x")})
		require.NoError(t, err)
		msgs, err := b.Receiver().ReceiveMessages(t.Context(), 1, nil)
		require.NoError(t, err)
		assert.Equal(t, retrytest.DefaultLockDuration, msgs[0].LockedUntil.Sub(*msgs[0].EnqueuedTime))
		assert.NotEmpty(t, msgs[0].MessageID, "the broker assigns a MessageID, as Service Bus does")
	})
}

// DuplicateDetection alone uses the Service Bus default window of 10 minutes; a duplicate does not
// extend it.
func TestDuplicateDetectionDefaultWindow(t *testing.T) {
	mock := clock.NewMock()
	b := newBroker(t, mock, &retrytest.BrokerOptions{DuplicateDetection: true})
	id := "same"
	for _, step := range []time.Duration{0, retrytest.DefaultDuplicateDetectionWindow - time.Second, time.Second} {
		mock.Add(step)
		_, err := b.Send(&azservicebus.Message{MessageID: &id})
		require.NoError(t, err)
	}
	st := b.Stats()
	assert.Equal(t, 2, st.Active, "the first and the one a window after it")
	assert.Equal(t, 1, st.Duplicates)
}

func TestMaxMessageSizeOption(t *testing.T) {
	b := newBroker(t, clock.NewMock(), &retrytest.BrokerOptions{MaxMessageSize: 1024})
	_, err := b.Send(&azservicebus.Message{Body: make([]byte, 1024)})
	require.ErrorIs(t, err, azservicebus.ErrMessageTooLarge)
	require.ErrorIs(t, err, broker.ErrMessageTooLarge)
	_, err = b.Sender().ScheduleMessages(t.Context(), []*azservicebus.Message{{Body: make([]byte, 1024)}}, time.Time{}, nil)
	require.ErrorIs(t, err, azservicebus.ErrMessageTooLarge)
	assert.Empty(t, b.Scheduled(), "a refused copy is not recorded")
	assert.Equal(t, retrytest.Stats{}, b.Stats())
}

// With a default TTL and dead-lettering on expiration, a message nobody receives ends up in the
// dead-letter list, and WaitUntil sees it happen on the clock alone.
func TestDefaultTimeToLiveDeadLetters(t *testing.T) {
	mock := clock.NewMock()
	b := newBroker(t, mock, &retrytest.BrokerOptions{DefaultMessageTimeToLive: time.Minute, DeadLetteringOnMessageExpiration: true})
	_, err := b.Send(&azservicebus.Message{Body: []byte("stale")})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- b.WaitUntil(t.Context(), func() bool { return len(b.DeadLettered()) == 1 }) }()
	mock.Add(time.Minute)
	require.NoError(t, <-done)
	dl := b.DeadLettered()[0]
	assert.Equal(t, broker.ReasonTTLExpired, dl.Reason)
	assert.Equal(t, "stale", string(dl.Message.Body))
	assert.Equal(t, retrytest.DefaultEntityPath, *dl.Message.DeadLetterSource)
	assert.Equal(t, 1, b.Stats().DeadLettered)
}

func TestReleaseLocksOnClose(t *testing.T) {
	for _, release := range []bool{false, true} {
		b := newBroker(t, clock.NewMock(), &retrytest.BrokerOptions{ReleaseLocksOnClose: release})
		_, err := b.Send(&azservicebus.Message{Body: []byte("x")})
		require.NoError(t, err)
		conn, err := b.Connector()(t.Context())
		require.NoError(t, err)
		_, err = conn.Receiver.ReceiveMessages(t.Context(), 1, nil)
		require.NoError(t, err)
		require.NoError(t, conn.Close(context.Background()))
		st := b.Stats()
		if release {
			assert.Equal(t, 1, st.Active, "back in the queue at once")
			msgs, err := b.Receiver().ReceiveMessages(t.Context(), 1, nil)
			require.NoError(t, err)
			assert.Equal(t, uint32(2), msgs[0].DeliveryCount, "the dropped delivery counts")
		} else {
			assert.Equal(t, 1, st.Locked, "locked until the lock expires")
		}
	}
}
