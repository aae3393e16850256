//go:build !live

package e2e

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// sdkSessionReceiver hands one session of the SDK to a queue Consumer, the way a user would: the SDK's
// session receiver has no RenewMessageLock (the session lock keeps its messages), so the adapter renews
// the session lock instead. Embedding keeps its SessionID method, by which the consumer knows it.
type sdkSessionReceiver struct{ *azservicebus.SessionReceiver }

func (r sdkSessionReceiver) RenewMessageLock(ctx context.Context, _ *azservicebus.ReceivedMessage, _ *azservicebus.RenewMessageLockOptions) error {
	return r.RenewSessionLock(ctx, nil)
}

// sessionQueueEnv starts an emulator with the session queue "sessions", sends bodies in session id,
// and returns its env.
func sessionQueueEnv(t *testing.T, id string, bodies ...string) *env {
	t.Helper()
	em, err := sbemu.Start(sbemu.Config{Queues: []broker.QueueConfig{{Name: "sessions", RequiresSession: true, DuplicateDetectionWindow: 10 * time.Minute}}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, em.Close()) })
	e := &env{connStr: em.ConnectionString(), queue: "sessions", em: em}
	sender, err := e.client(t).NewSender(e.queue, nil)
	require.NoError(t, err)
	for _, body := range bodies {
		require.NoError(t, sender.SendMessage(t.Context(), &azservicebus.Message{MessageID: &body, SessionID: &id, Body: []byte(body)}, nil))
	}
	return e
}

// oneSDKSession is a Connector whose connection receives session id of e's queue through the SDK's
// session receiver and schedules the retry copies back to the queue.
func oneSDKSession(t *testing.T, e *env, id string) retry.Connector {
	return func(ctx context.Context) (*retry.Connection, error) {
		client, err := azservicebus.NewClientFromConnectionString(e.connStr, &azservicebus.ClientOptions{RetryOptions: fastRetries})
		if err != nil {
			return nil, err
		}
		r, err := client.AcceptSessionForQueue(ctx, e.queue, id, nil)
		if err != nil {
			_ = client.Close(ctx)
			return nil, err
		}
		s, err := client.NewSender(e.queue, nil)
		if err != nil {
			_ = client.Close(ctx)
			return nil, err
		}
		return &retry.Connection{Receiver: sdkSessionReceiver{r}, Sender: s, EntityPath: e.queue, Close: client.Close}, nil
	}
}

// A queue Consumer handed the SDK's session receiver refuses it at connect with ErrSessionEntity,
// before anything is received; with AllowReorder it consumes the session, and the retry copy of a
// failed message, which keeps its SessionID, comes back to the session behind the message after it.
func TestConsumerOnSDKSessionReceiver(t *testing.T) {
	parallel(t)
	e := sessionQueueEnv(t, "order-1", "created", "paid")

	c, err := retry.NewConsumer(oneSDKSession(t, e, "order-1"), okHandler, &retry.Options{Logger: quietLogger()})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	err = c.Run(ctx)
	require.ErrorIs(t, err, retry.ErrSessionEntity)
	assert.NoError(t, ctx.Err(), "refused at once, not at the test's deadline")
	assert.Zero(t, c.Health().Received)

	var (
		mu      sync.Mutex
		handled []string
		copySID string
		done    = make(chan struct{})
	)
	handler := func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		env, _ := envelope.FromContext(ctx)
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, fmt.Sprintf("%s#%d", m.Body, env.Attempt))
		if env.Attempt > 1 && m.SessionID != nil {
			copySID = *m.SessionID
		}
		switch {
		case string(m.Body) == "created" && env.Attempt == 1:
			return errBoom
		case len(handled) == 3:
			close(done)
		}
		return nil
	}
	runConsumer(t, oneSDKSession(t, e, "order-1"), handler, &retry.Options{
		AllowReorder: true, MaxConcurrency: 1, SettleTimeout: 5 * time.Second,
		Backoff: backoff.Fibonacci{Base: 200 * time.Millisecond, Cap: 2 * time.Second},
	})
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatal("the retry did not come back")
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"created#1", "paid#1", "created#2"}, handled, "the nothing-received first run left both messages in order; the retry came back behind paid")
	assert.Equal(t, "order-1", copySID, "the copy kept its session")
}

// The built-in queue connector on a queue that requires sessions ends Run at start, before anything
// is received: its check's peek, through a receiver that holds no session, is refused
// (amqp:not-allowed), a startup error that points to NewSessionConsumer. With
// ConnectOptions.CheckSettings the consumer reads the settings to explain the refusal, and the error
// wraps ErrSessionEntity.
func TestConsumerOnSessionQueueRefused(t *testing.T) {
	parallel(t)
	e := sessionQueueEnv(t, "order-1", "created")
	for _, check := range []bool{false, true} {
		t.Run(fmt.Sprintf("CheckSettings=%v", check), func(t *testing.T) {
			connect := newConnector(t, e.connStr, e.queue, &retry.ConnectOptions{
				Client: &azservicebus.ClientOptions{RetryOptions: fastRetries}, CheckSettings: check, Admin: e.em.AdminClientOptions(),
			})
			c, err := retry.NewConsumer(connect, okHandler, &retry.Options{Logger: quietLogger()})
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
			defer cancel()
			err = c.Run(ctx)
			require.Error(t, err)
			assert.NoError(t, ctx.Err(), "refused at once, not at the test's deadline")
			assert.Contains(t, err.Error(), "NewSessionConsumer")
			assert.Equal(t, check, errors.Is(err, retry.ErrSessionEntity), "only the settings tell that the entity requires sessions: %v", err)
			if check {
				assert.Contains(t, err.Error(), "sessions: RequiresSession is set")
			} else {
				assert.Contains(t, err.Error(), "with ConnectOptions.CheckSettings the settings tell which", "the error says how to learn more")
			}
			assert.Zero(t, c.Health().Received)
		})
	}
	q, ok := e.em.Broker().Queue(e.queue)
	require.True(t, ok)
	assert.Equal(t, 1, q.Stats().Active, "the message is still there")
}
