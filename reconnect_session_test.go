package retry_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/retrytest"
)

// oneSessionReceiver is the adapter a user writes to hand one session to a queue Consumer: session
// receivers (the SDK's and retrytest's) have no RenewMessageLock, since the session lock keeps their
// messages, so it renews that instead. It keeps the SessionID method of the receiver it embeds.
type oneSessionReceiver struct{ *retrytest.SessionReceiver }

func (r oneSessionReceiver) RenewMessageLock(ctx context.Context, _ *azservicebus.ReceivedMessage, _ *azservicebus.RenewMessageLockOptions) error {
	return r.RenewSessionLock(ctx, nil)
}

var _ retry.Receiver = oneSessionReceiver{}

// oneSessionConnector is a Connector whose connections receive the session id of b's session queue
// through a oneSessionReceiver, and send to b; asSource puts that receiver in Sources instead, behind a
// plain Receiver.
func oneSessionConnector(b *retrytest.Broker, id string, asSource bool) retry.Connector {
	return func(ctx context.Context) (*retry.Connection, error) {
		r, err := b.AcceptSession(ctx, id)
		if err != nil {
			return nil, err
		}
		c := &retry.Connection{Receiver: oneSessionReceiver{r}, Sender: b.Sender(), EntityPath: "orders"}
		if asSource {
			plain := b.Receiver()
			c.Receiver = plain
			c.Sources = []retry.Source{{Receiver: oneSessionReceiver{r}, EntityPath: "orders"}}
			c.Close = func(ctx context.Context) error {
				_ = plain.Close(ctx)
				_ = r.Close(ctx)
				return c.Sender.Close(ctx)
			}
		}
		return c, nil
	}
}

// sendInSession sends bodies to b in session id, in order.
func sendInSession(t *testing.T, b *retrytest.Broker, id string, bodies ...string) {
	t.Helper()
	for _, body := range bodies {
		_, err := b.Send(&azservicebus.Message{MessageID: &body, SessionID: &id, Body: []byte(body)})
		require.NoError(t, err)
	}
}

// Without AllowReorder, a Consumer whose connection receives from a session returns ErrSessionEntity
// from Run at once, whichever receiver of the connection holds the session and even with
// RetryStartupErrors, and touches no message.
func TestConsumerRefusesASessionReceiver(t *testing.T) {
	tests := []struct {
		name     string
		asSource bool
		opts     retry.Options
	}{
		{name: "the connection's receiver", opts: retry.Options{}},
		{name: "a source's receiver", asSource: true, opts: retry.Options{}},
		{name: "RetryStartupErrors does not retry it", opts: retry.Options{RetryStartupErrors: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, err := retrytest.New(nil, &retrytest.BrokerOptions{RequiresSession: true})
				require.NoError(t, err)
				sendInSession(t, b, "order-1", "created")
				called := false
				opts := tc.opts
				opts.Logger = discardLogger()
				connect, connects := oneSessionConnector(b, "order-1", tc.asSource), 0
				counted := func(ctx context.Context) (*retry.Connection, error) {
					connects++
					return connect(ctx)
				}
				c, err := retry.NewConsumer(counted, func(context.Context, *azservicebus.ReceivedMessage) error {
					called = true
					return nil
				}, &opts)
				require.NoError(t, err)
				err = c.Run(t.Context())
				require.ErrorIs(t, err, retry.ErrSessionEntity)
				assert.Contains(t, err.Error(), "NewSessionConsumer")
				assert.Contains(t, err.Error(), "AllowReorder")
				assert.Contains(t, err.Error(), `"order-1"`, "the error names the session")
				assert.False(t, called, "no handler ran")
				assert.Equal(t, 1, connects, "no reconnect")
				assert.Empty(t, b.Completed())
				h := c.Health()
				assert.Equal(t, retry.StateStopped, h.State)
				assert.Zero(t, h.Received)
				// The message is still first in its session, never delivered: the refusal came before any
				// receive, and closing the receiver gave the session up.
				r, err := b.AcceptSession(t.Context(), "order-1")
				require.NoError(t, err)
				msgs, err := r.ReceiveMessages(t.Context(), 1, nil)
				require.NoError(t, err)
				require.Len(t, msgs, 1)
				assert.Equal(t, "created", string(msgs[0].Body))
				assert.Equal(t, uint32(1), msgs[0].DeliveryCount, "its first delivery")
				require.NoError(t, r.Close(t.Context()))
			})
		})
	}
}

// With AllowReorder the same connection works, and a failed message's retry copy keeps its SessionID:
// it goes back to its session, behind the message that came after it, as the option accepts.
func TestConsumerAllowReorderRetriesIntoTheSession(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := retrytest.New(nil, &retrytest.BrokerOptions{RequiresSession: true, DuplicateDetection: true})
		require.NoError(t, err)
		sendInSession(t, b, "order-1", "created", "paid")
		var mu sync.Mutex
		var handled []string
		handler := func(ctx context.Context, msg *azservicebus.ReceivedMessage) error {
			env, _ := envelope.FromContext(ctx)
			mu.Lock()
			defer mu.Unlock()
			handled = append(handled, fmt.Sprintf("%s#%d", msg.Body, env.Attempt))
			if string(msg.Body) == "created" && env.Attempt == 1 {
				return errBoom
			}
			return nil
		}
		c, err := retry.NewConsumer(oneSessionConnector(b, "order-1", false), handler, &retry.Options{
			AllowReorder: true, MaxConcurrency: 1, Backoff: backoff.Constant{Interval: 10 * time.Second}, Logger: discardLogger(),
		})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		require.NoError(t, b.WaitUntil(t.Context(), func() bool { return len(b.Completed()) == 3 }))
		cancel()
		require.NoError(t, <-done)

		mu.Lock()
		assert.Equal(t, []string{"created#1", "paid#1", "created#2"}, handled, "the retry came back behind the later message")
		mu.Unlock()
		var copied *azservicebus.ReceivedMessage
		for _, m := range b.Completed() {
			if m.ApplicationProperties[envelope.PropAttempt] != nil {
				copied = m
			}
		}
		require.NotNil(t, copied, "the retry copy was received and completed")
		require.NotNil(t, copied.SessionID)
		assert.Equal(t, "order-1", *copied.SessionID, "the copy kept its session")
	})
}

// settingsSay is b's Connector with a Settings that reports what the built-in connectors' settings
// check (ConnectOptions.CheckSettings) reports for an entity that requires sessions.
func settingsSay(b *retrytest.Broker, warnings []string, err error) retry.Connector {
	connect := b.Connector()
	return func(ctx context.Context) (*retry.Connection, error) {
		c, cerr := connect(ctx)
		if c != nil {
			c.Settings = func(context.Context, time.Duration) ([]string, error) { return warnings, err }
		}
		return c, cerr
	}
}

// A settings check that finds RequiresSession ends Run with ErrSessionEntity before anything is
// received; with AllowReorder the consumer runs and says so in Health.Warnings.
func TestConsumerSettingsRequireSessions(t *testing.T) {
	sessionErr := fmt.Errorf("%w (orders: RequiresSession is set)", retry.ErrSessionEntity)
	t.Run("refused", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b, err := retrytest.New(nil, nil)
			require.NoError(t, err)
			_, err = b.Send(&azservicebus.Message{Body: []byte("x")})
			require.NoError(t, err)
			c, err := retry.NewConsumer(settingsSay(b, nil, sessionErr), okHandler, &retry.Options{EntityPath: "orders", Logger: discardLogger()})
			require.NoError(t, err)
			err = c.Run(t.Context())
			require.ErrorIs(t, err, retry.ErrSessionEntity)
			assert.Empty(t, b.Completed(), "nothing was received")
			assert.Zero(t, c.Health().Received)
			assert.Equal(t, 1, b.Stats().Active, "the message is still there")
		})
	})
	t.Run("AllowReorder", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b, err := retrytest.New(nil, nil)
			require.NoError(t, err)
			_, err = b.Send(&azservicebus.Message{Body: []byte("x")})
			require.NoError(t, err)
			c, err := retry.NewConsumer(settingsSay(b, []string{"orders: duplicate detection is off"}, sessionErr), okHandler,
				&retry.Options{EntityPath: "orders", AllowReorder: true, Logger: discardLogger()})
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			require.NoError(t, b.WaitUntil(t.Context(), func() bool { return len(b.Completed()) == 1 }))
			cancel()
			require.NoError(t, <-done)
			ws := c.Health().Warnings
			require.Len(t, ws, 2, "%q", ws)
			assert.Equal(t, "orders: duplicate detection is off", ws[0])
			assert.True(t, strings.HasPrefix(ws[1], "orders: the entity requires sessions"), ws[1])
		})
	})
}

// checkedBy is b's Connector with a Check that receives through the connection's receiver, as the
// built-in connectors' check peeks through theirs, and, when sessionSettings, the Settings of a
// settings check that found RequiresSession.
func checkedBy(b *retrytest.Broker, sessionSettings bool) retry.Connector {
	connect := b.Connector()
	return func(ctx context.Context) (*retry.Connection, error) {
		c, err := connect(ctx)
		if c == nil {
			return c, err
		}
		recv := c.Receiver
		c.Check = func(ctx context.Context) error {
			_, err := recv.ReceiveMessages(ctx, 0, nil)
			return err
		}
		if sessionSettings {
			c.Settings = func(context.Context, time.Duration) ([]string, error) {
				return nil, fmt.Errorf("%w (orders: RequiresSession is set)", retry.ErrSessionEntity)
			}
		}
		return c, err
	}
}

// A plain receiver on a session entity is refused by the broker (amqp:not-allowed) at the first
// connect's check: Run returns a startup error pointing to NewSessionConsumer instead of reconnecting
// for ever, and with a settings check to tell why, one wrapping ErrSessionEntity.
func TestConsumerPlainReceiverOnASessionEntity(t *testing.T) {
	for _, tc := range []struct {
		name     string
		settings bool
	}{{"without settings", false}, {"with a settings check", true}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, err := retrytest.New(nil, &retrytest.BrokerOptions{RequiresSession: true})
				require.NoError(t, err)
				sendInSession(t, b, "order-1", "created")
				c, err := retry.NewConsumer(checkedBy(b, tc.settings), okHandler, &retry.Options{Logger: discardLogger()})
				require.NoError(t, err)
				err = c.Run(t.Context())
				require.Error(t, err)
				assert.Contains(t, err.Error(), "NewSessionConsumer")
				assert.Equal(t, tc.settings, errors.Is(err, retry.ErrSessionEntity), "%v", err)
				assert.Equal(t, 1, b.Connects(), "no reconnect")
				assert.Zero(t, c.Health().Received)
			})
		})
	}
}
