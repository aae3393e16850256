package retry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
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

func TestHealthHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		c, err := retry.NewConsumer(b.Connector(), okHandler, &retry.Options{Logger: discardLogger()})
		require.NoError(t, err)
		get := func(ready bool) (int, map[string]any) {
			rec := httptest.NewRecorder()
			healthHandlerFor(c, ready).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
			var body map[string]any
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
			assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
			return rec.Code, body
		}
		code, body := get(true)
		assert.Equal(t, http.StatusServiceUnavailable, code, "not ready before Run")
		assert.Equal(t, "idle", body["state"])
		stop := runConsumer(t, c)
		synctest.Wait()
		code, body = get(true)
		assert.Equal(t, http.StatusOK, code)
		assert.Equal(t, "running", body["state"])
		sendN(b, 1)
		synctest.Wait()
		_, body = get(false)
		assert.Equal(t, float64(1), body["completed"])
		require.NoError(t, stop())
		code, _ = get(false)
		assert.Equal(t, http.StatusServiceUnavailable, code, "a stopped consumer is not live")
	})
}

// From the moment Run's context ends the consumer is draining: not ready (readiness 503) while its
// handlers finish, still live (liveness 200) until Run returns, then stopped.
func TestHealthWhileDraining(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		started, release := make(chan struct{}), make(chan struct{})
		var states []retry.State
		c, err := retry.NewConsumer(b.Connector(), func(context.Context, *azservicebus.ReceivedMessage) error {
			close(started)
			<-release // finishes within the grace period
			return nil
		}, &retry.Options{ShutdownGrace: time.Minute, Logger: discardLogger(), Hooks: retry.Hooks{
			OnStateChange: func(p retry.StateChangeParams) { states = append(states, p.To) },
		}})
		require.NoError(t, err)
		probe := func(ready bool) (int, string) {
			rec := httptest.NewRecorder()
			healthHandlerFor(c, ready).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
			var body struct{ State string }
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
			return rec.Code, body.State
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		sendN(b, 1)
		<-started
		require.True(t, c.Health().Ready())

		cancel()
		synctest.Wait() // Run's context has ended; the handler still runs
		h := c.Health()
		assert.Equal(t, retry.StateDraining, h.State)
		assert.Equal(t, "draining", h.State.String())
		assert.False(t, h.Ready())
		code, state := probe(true)
		assert.Equal(t, http.StatusServiceUnavailable, code, "readiness while draining")
		assert.Equal(t, "draining", state)
		code, _ = probe(false)
		assert.Equal(t, http.StatusOK, code, "liveness while draining")

		close(release)
		require.NoError(t, <-done)
		assert.Equal(t, retry.StateStopped, c.Health().State)
		code, _ = probe(false)
		assert.Equal(t, http.StatusServiceUnavailable, code)
		assert.Len(t, b.Completed(), 1, "the handler in flight finished and was completed")
		assert.Equal(t, []retry.State{retry.StateConnecting, retry.StateRunning, retry.StateDraining, retry.StateStopped}, states)
	})
}

// healthHandlerFor is the readiness handler (ready) or the liveness handler.
func healthHandlerFor(c *retry.Consumer, ready bool) http.Handler {
	if ready {
		return retry.ReadinessHandler(c)
	}
	return retry.LivenessHandler(c)
}

// A connection whose settings cannot be read is reported, not skipped in silence: one warning in
// Health naming the entity and the error, and a warning in the log.
func TestUnreadableSettingsAreAWarning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t, nil, nil)
		var logs bytes.Buffer
		connect := func(ctx context.Context) (*retry.Connection, error) {
			conn, err := b.Connector()(ctx)
			if conn != nil {
				conn.EntityPath = "orders"
				conn.Settings = func(context.Context, time.Duration) ([]string, error) {
					return nil, errors.New("administration API at https://ns.example/ unreachable")
				}
			}
			return conn, err
		}
		c, err := retry.NewConsumer(connect, okHandler, &retry.Options{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		require.NoError(t, err)
		stop := runConsumer(t, c)
		synctest.Wait()
		ws := c.Health().Warnings
		require.NoError(t, stop())
		require.Len(t, ws, 1)
		assert.True(t, strings.HasPrefix(ws[0], "orders: settings not checked"), ws[0])
		assert.Contains(t, ws[0], "https://ns.example/")
		assert.Contains(t, logs.String(), "level=WARN")
		assert.Contains(t, logs.String(), "entity=orders")
		assert.Contains(t, logs.String(), "https://ns.example/")
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

// serveHealth asks h and decodes its document.
func serveHealth(t *testing.T, h http.Handler) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	var body map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	return rec.Code, body
}

// The session consumer's readiness, through the same handlers as the queue consumer's, is 200 only
// while it runs; liveness until it has stopped.
func TestSessionHealthHandlers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 3)
		sc := newSessionConsumer(t, b, okHandler, nil, nil, nil)
		ready, live := retry.ReadinessHandler(sc), retry.LivenessHandler(sc)

		code, body := serveHealth(t, ready)
		assert.Equal(t, http.StatusServiceUnavailable, code, "idle")
		assert.Equal(t, "idle", body["state"])
		stop := runSessionConsumer(t, sc)
		waitFor(t, b, func() bool { return len(b.Completed()) == 3 })
		synctest.Wait() // the consumer counts a completion after the broker recorded it
		code, body = serveHealth(t, ready)
		assert.Equal(t, http.StatusOK, code)
		assert.Equal(t, "running", body["state"])
		assert.Equal(t, float64(3), body["completed"])
		require.NoError(t, stop())
		code, _ = serveHealth(t, ready)
		assert.Equal(t, http.StatusServiceUnavailable, code)
		code, body = serveHealth(t, live)
		assert.Equal(t, http.StatusServiceUnavailable, code)
		assert.Equal(t, "stopped", body["state"])
	})
	t.Run("nil consumer", func(t *testing.T) {
		code, body := serveHealth(t, retry.ReadinessHandler((*retry.SessionConsumer)(nil)))
		assert.Equal(t, http.StatusServiceUnavailable, code)
		assert.Equal(t, "idle", body["state"])
	})
}
