package retry_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/retrytest"
)

// TestConnectionCheckGatesRunning: a connection whose Check fails is a failed connect (closed, counted,
// schedule goes on), so the consumer never reports itself running against an unreachable namespace.
func TestConnectionCheckGatesRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		connect, conns := trackingConnector(b)
		unreachable := errors.New("dial tcp: connection refused")
		checks := 0
		checked := func(ctx context.Context) (*retry.Connection, error) {
			conn, err := connect(ctx)
			if err != nil {
				return nil, err
			}
			conn.Check = func(context.Context) error {
				if checks++; checks <= 2 {
					return unreachable
				}
				return nil
			}
			return conn, nil
		}
		var mu sync.Mutex
		var changes []retry.StateChangeParams
		c, err := retry.NewConsumer(checked, okHandler, &retry.Options{Logger: discardLogger(),
			Hooks: retry.Hooks{OnStateChange: func(p retry.StateChangeParams) {
				mu.Lock()
				changes = append(changes, p)
				mu.Unlock()
			}}})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		synctest.Wait()
		assert.Equal(t, retry.StateReconnecting, c.Health().State, "built but unchecked is not running")
		<-time.After(5 * time.Second)
		synctest.Wait()
		assert.False(t, c.Health().Ready(), "the second check failed too")
		<-time.After(10 * time.Second)
		synctest.Wait()
		assert.True(t, c.Health().Ready())
		require.Len(t, *conns, 3)
		assert.True(t, (*conns)[0].closed.Load(), "a connection that failed its check is closed")
		assert.True(t, (*conns)[1].closed.Load())
		h := c.Health()
		assert.Equal(t, uint64(2), h.ConnectFailures)
		assert.Contains(t, h.LastError, "connection check failed")
		require.NoError(t, stop())

		mu.Lock()
		defer mu.Unlock()
		require.GreaterOrEqual(t, len(changes), 3)
		assert.Equal(t, retry.StateReconnecting, changes[1].To)
		assert.ErrorIs(t, changes[1].Err, unreachable, "the state hook says why")
	})
}

// TestStateChangeCarriesReceiveError: the move out of running names the receive failure.
func TestStateChangeCarriesReceiveError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		var mu sync.Mutex
		var changes []retry.StateChangeParams
		c, err := retry.NewConsumer(b.Connector(), okHandler, &retry.Options{Logger: discardLogger(),
			Hooks: retry.Hooks{OnStateChange: func(p retry.StateChangeParams) {
				mu.Lock()
				changes = append(changes, p)
				mu.Unlock()
			}}})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		synctest.Wait()
		b.Fail(retrytest.OpReceive, 1, retrytest.ErrConnectionLost)
		synctest.Wait()
		require.NoError(t, stop())
		mu.Lock()
		defer mu.Unlock()
		var found bool
		for _, ch := range changes {
			if ch.From == retry.StateRunning && ch.To == retry.StateReconnecting {
				found = true
				assert.ErrorIs(t, ch.Err, retrytest.ErrConnectionLost)
			}
		}
		assert.True(t, found, "%v", changes)
	})
}
