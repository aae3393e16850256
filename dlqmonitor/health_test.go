package dlqmonitor_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/dlqmonitor"
)

// probe calls the readiness handler and returns its status and body.
func probe(t *testing.T, m *dlqmonitor.Monitor) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	dlqmonitor.HealthHandler(m).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ready", nil))
	var body map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	return rec.Code, body
}

// TestHealthCountsFailedReads: failed reads count in the monitor's health
// and make its readiness probe answer 503 with the error, until a poll
// reads every entity again. Before, nothing recorded them: a monitor
// failing on every poll looked like one with nothing to report.
func TestHealthCountsFailedReads(t *testing.T) {
	fake := &fakeAdmin{counts: map[string]int32{"orders": 2, "events/Subscriptions/billing": 0}}
	clock := newStepClock()
	m, err := dlqmonitor.New(fake, []string{"orders", "events/Subscriptions/billing"}, &dlqmonitor.Options{Clock: clock})
	require.NoError(t, err)
	code, _ := probe(t, m)
	assert.Equal(t, http.StatusServiceUnavailable, code, "not ready before the first poll")
	assert.False(t, m.Health().OK())

	m.Poll(context.Background())
	h := m.Health()
	require.True(t, h.OK())
	assert.Equal(t, clock.Now(), h.LastSuccess)
	assert.Equal(t, []dlqmonitor.EntityHealth{{Entity: "orders", Count: 2}, {Entity: "events/Subscriptions/billing"}}, h.Entities)
	code, body := probe(t, m)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "ok", body["status"])

	fake.mu.Lock()
	fake.err = errors.New("x509: certificate signed by unknown authority")
	fake.mu.Unlock()
	m.Poll(context.Background())
	m.Poll(context.Background())
	h = m.Health()
	assert.False(t, h.OK())
	assert.Equal(t, uint64(3), h.Polls)
	assert.Equal(t, uint64(4), h.Failures, "two entities, two polls")
	assert.Equal(t, 2, h.ConsecutiveFailedPolls)
	assert.Contains(t, h.LastError, "reading events/Subscriptions/billing")
	assert.Contains(t, h.LastError, "unknown authority")
	assert.Equal(t, int64(2), h.Entities[0].Count, "the last count read stays")
	assert.Equal(t, 2, h.Entities[0].ConsecutiveFailures)
	code, body = probe(t, m)
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Equal(t, "unavailable", body["status"])
	assert.Contains(t, body["last_error"], "unknown authority")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	m.Poll(ctx)
	assert.Equal(t, uint64(3), m.Health().Polls, "a poll cut short by its context is not counted")

	fake.mu.Lock()
	fake.err = nil
	fake.mu.Unlock()
	m.Poll(context.Background())
	h = m.Health()
	assert.True(t, h.OK())
	assert.Zero(t, h.ConsecutiveFailedPolls)
	assert.Equal(t, uint64(4), h.Failures, "the total stays")
	assert.Empty(t, h.Entities[0].LastError)
	code, _ = probe(t, m)
	assert.Equal(t, http.StatusOK, code)
}

func TestNilMonitorHealthIsNotOK(t *testing.T) {
	var m *dlqmonitor.Monitor
	assert.False(t, m.Health().OK())
}
