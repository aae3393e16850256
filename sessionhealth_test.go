package retry_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
)

// serveHealth asks h and decodes its document.
func serveHealth(t *testing.T, h http.Handler) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	var body map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	return rec.Code, body
}

// The session consumer's readiness is 200 only while it runs; liveness until it has stopped.
func TestSessionHealthHandlers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 3)
		sc := newSessionConsumer(t, b, okHandler, nil, nil, nil)
		ready, live := retry.SessionReadinessHandler(sc), retry.SessionLivenessHandler(sc)

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
		code, body := serveHealth(t, retry.SessionReadinessHandler(nil))
		assert.Equal(t, http.StatusServiceUnavailable, code)
		assert.Equal(t, "idle", body["state"])
	})
}
