package retry_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/retrytest"
)

// Idle sessions are released, so two workers drain fifty sessions.
func TestSessionIdleReleaseDrainsManySessions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		const sessions = 50
		for i := range sessions {
			sendSession(t, b, fmt.Sprintf("s%02d", i), 2)
		}
		var mu sync.Mutex
		running, peak := 0, 0
		h := func(context.Context, *azservicebus.ReceivedMessage) error {
			mu.Lock()
			running++
			peak = max(peak, running)
			mu.Unlock()
			time.Sleep(10 * time.Millisecond) // in the bubble: lets the other worker overlap
			mu.Lock()
			running--
			mu.Unlock()
			return nil
		}
		sc := newSessionConsumer(t, b, h, nil, nil, &retry.SessionOptions{MaxConcurrentSessions: 2, SessionIdleTimeout: time.Second})
		start := time.Now()
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 2*sessions })
		elapsed := time.Since(start)
		require.NoError(t, stop())
		assert.Equal(t, 2, peak, "never more than MaxConcurrentSessions handlers, and both used")
		assert.Less(t, elapsed, 30*time.Second, "each session released one idle timeout after its last message")
		assert.Equal(t, uint64(2*sessions), sc.Health().Completed)
	})
}

// An accept that fails other than by timing out breaks the connection, which is rebuilt after the
// reconnect delay.
func TestSessionAcceptFailureReconnects(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 1)
		b.Fail(retrytest.OpAccept, 1, &azservicebus.Error{Code: azservicebus.CodeConnectionLost})
		sc := newSessionConsumer(t, b, okHandler, nil, &retry.Options{ReconnectDelays: []time.Duration{3 * time.Second}}, &retry.SessionOptions{MaxConcurrentSessions: 1})
		start := time.Now()
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 1 })
		assert.Equal(t, 3*time.Second, time.Since(start))
		require.NoError(t, stop())
		h := sc.Health()
		assert.Equal(t, uint64(2), h.Connects)
		assert.Equal(t, 2, b.Connects())
		assert.NotEmpty(t, h.LastError)
	})
}

// The first accepts are the first contact with the broker (the SDK connects lazily): one that finds
// the entity missing, or not session-enabled, ends Run unless RetryStartupErrors is set.
func TestSessionStartupErrors(t *testing.T) {
	t.Run("entity not found", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := newSessionBroker(t, nil)
			b.Fail(retrytest.OpAccept, 1, &azservicebus.Error{Code: azservicebus.CodeNotFound})
			sc := newSessionConsumer(t, b, okHandler, nil, nil, &retry.SessionOptions{MaxConcurrentSessions: 1})
			err := sc.Run(t.Context())
			assert.ErrorIs(t, err, retry.ErrEntityNotFound)
			assert.Equal(t, retry.StateStopped, sc.Health().State)
		})
	})
	t.Run("not session-enabled", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := newBroker(t, nil, nil) // a plain queue
			sc := newSessionConsumer(t, b, okHandler, nil, nil, &retry.SessionOptions{MaxConcurrentSessions: 2})
			err := sc.Run(t.Context())
			require.Error(t, err)
			assert.Contains(t, err.Error(), "session-enabled")
		})
	})
	t.Run("retried when asked", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := newSessionBroker(t, nil)
			sendSession(t, b, "s", 1)
			b.Fail(retrytest.OpAccept, 1, &azservicebus.Error{Code: azservicebus.CodeNotFound})
			sc := newSessionConsumer(t, b, okHandler, nil, &retry.Options{RetryStartupErrors: true, ReconnectDelays: []time.Duration{time.Second}},
				&retry.SessionOptions{MaxConcurrentSessions: 1})
			stop := runSessionConsumer(t, sc)
			waitFor(t, b, func() bool { return len(b.Completed()) == 1 })
			require.NoError(t, stop())
			assert.Equal(t, uint64(1), sc.Health().ConnectFailures+sc.Health().ReceiveFailures)
		})
	})
	t.Run("after an answer, reconnected", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := newSessionBroker(t, nil)
			sendSession(t, b, "a", 1)
			// Two workers: one is always accepting, so the failure reaches a worker's accept (a dry
			// session's ask for a waiting one, which only a consumer whose every worker is busy
			// makes, keeps its session instead).
			sc := newSessionConsumer(t, b, okHandler, nil, &retry.Options{ReconnectDelays: []time.Duration{time.Second}},
				&retry.SessionOptions{MaxConcurrentSessions: 2, SessionIdleTimeout: time.Second})
			stop := runSessionConsumer(t, sc)
			waitFor(t, b, func() bool { return len(b.Completed()) == 1 })
			b.Fail(retrytest.OpAccept, 1, &azservicebus.Error{Code: azservicebus.CodeNotFound})
			sendSession(t, b, "b", 1)
			waitFor(t, b, func() bool { return len(b.Completed()) == 2 })
			require.NoError(t, stop())
			assert.Equal(t, 2, b.Connects())
		})
	})
}
