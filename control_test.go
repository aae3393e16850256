package retry_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/outage"
)

func TestControlHandler(t *testing.T) {
	c, err := retry.NewConsumer(newBroker(t, nil, nil).Connector(), okHandler, &retry.Options{Logger: discardLogger()})
	require.NoError(t, err)
	h := retry.ControlHandler(c, &retry.ControlOptions{Token: "s3cret"})
	do := func(method, body, contentType, auth string) (int, map[string]any) {
		t.Helper()
		req := httptest.NewRequest(method, "/control", strings.NewReader(body))
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
		var out map[string]any
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out), rec.Body.String())
		return rec.Code, out
	}
	const auth = "Bearer s3cret"

	code, out := do(http.MethodGet, "", "", auth)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "closed", out["state"])

	code, out = do(http.MethodPost, `{"action":"pause","reason":"migrating billing"}`, "application/json", auth)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "open", out["state"])
	assert.Equal(t, true, out["manual"])
	assert.Equal(t, "migrating billing", out["reason"])
	assert.True(t, c.Health().Outage.Manual)

	code, out = do(http.MethodPost, `{"action":"resume"}`, "application/json; charset=utf-8", "bearer s3cret")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "closed", out["state"])

	for _, tc := range []struct {
		name, method, body, contentType, auth string
		code                                  int
	}{
		{"no token", http.MethodGet, "", "", "", http.StatusUnauthorized},
		{"wrong token", http.MethodPost, `{"action":"pause"}`, "application/json", "Bearer nope", http.StatusUnauthorized},
		{"a form post (cross-site)", http.MethodPost, "action=pause", "application/x-www-form-urlencoded", auth, http.StatusUnsupportedMediaType},
		{"no content type", http.MethodPost, `{"action":"pause"}`, "", auth, http.StatusUnsupportedMediaType},
		{"unknown action", http.MethodPost, `{"action":"drop"}`, "application/json", auth, http.StatusBadRequest},
		{"unknown field", http.MethodPost, `{"action":"pause","until":"never"}`, "application/json", auth, http.StatusBadRequest},
		{"trailing data", http.MethodPost, `{"action":"pause"} {"action":"resume"}`, "application/json", auth, http.StatusBadRequest},
		{"not JSON", http.MethodPost, `pause`, "application/json", auth, http.StatusBadRequest},
		{"resume with a reason", http.MethodPost, `{"action":"resume","reason":"x"}`, "application/json", auth, http.StatusBadRequest},
		{"oversized", http.MethodPost, `{"action":"pause","reason":"` + strings.Repeat("x", 8<<10) + `"}`, "application/json", auth, http.StatusBadRequest},
		{"DELETE", http.MethodDelete, "", "", auth, http.StatusMethodNotAllowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := do(tc.method, tc.body, tc.contentType, tc.auth)
			assert.Equal(t, tc.code, code)
			assert.NotEmpty(t, out["error"])
			assert.Equal(t, outage.Closed, c.Health().Outage.State, "nothing changed")
		})
	}
}

func TestHealthDocumentShowsTheOutage(t *testing.T) {
	c, err := retry.NewConsumer(newBroker(t, nil, nil).Connector(), okHandler, &retry.Options{Logger: discardLogger()})
	require.NoError(t, err)
	c.Pause("deploy")
	rec := httptest.NewRecorder()
	retry.LivenessHandler(c).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/live", nil))
	var body struct {
		Outage struct {
			State  string `json:"state"`
			Manual bool   `json:"manual"`
			Reason string `json:"reason"`
		} `json:"outage"`
		Held uint64 `json:"held"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	assert.Equal(t, "open", body.Outage.State)
	assert.True(t, body.Outage.Manual)
	assert.Equal(t, "deploy", body.Outage.Reason)
}

// Without a token, the control handler answers only loopback Host names and AllowedHosts: a page
// whose name was rebound to this machine (same-origin for the browser) cannot pause the consumer. Each
// pause and resume is logged with the caller's address and stated operator.
func TestControlHandlerWithoutTokenAnswersLoopbackOnly(t *testing.T) {
	var logs bytes.Buffer
	c, err := retry.NewConsumer(newBroker(t, nil, nil).Connector(), okHandler, &retry.Options{Logger: slog.New(slog.NewJSONHandler(&lockedWriter{w: &logs}, nil))})
	require.NoError(t, err)
	h := retry.ControlHandler(c, &retry.ControlOptions{AllowedHosts: []string{"ops.internal"}})
	post := func(host, body string) int {
		req := httptest.NewRequest(http.MethodPost, "http://"+host+"/control", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Sbretry-Operator", "alice")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	assert.Equal(t, http.StatusMisdirectedRequest, post("rebound.attacker.example:8080", `{"action":"pause"}`))
	assert.Equal(t, outage.Closed, c.Health().Outage.State, "a rebound page cannot pause")
	assert.Equal(t, http.StatusOK, post("127.0.0.1:8080", `{"action":"pause","reason":"deploy"}`))
	assert.Equal(t, outage.Open, c.Health().Outage.State)
	assert.Equal(t, http.StatusOK, post("ops.internal:8080", `{"action":"resume"}`))
	assert.Equal(t, outage.Closed, c.Health().Outage.State)
	out := logs.String()
	assert.Contains(t, out, `"msg":"control: pause","action":"pause","reason":"deploy","remote_addr":"192.0.2.1:1234","operator":"\"alice\"","token":false`)
	assert.Contains(t, out, `"msg":"control: resume"`)

	// With a token, the token is the guard, whatever the Host.
	h = retry.ControlHandler(c, &retry.ControlOptions{Token: "s3cret"})
	req := httptest.NewRequest(http.MethodPost, "http://anywhere.example/control", strings.NewReader(`{"action":"pause"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer s3cret")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	assert.Equal(t, http.StatusOK, rec.Code)
}

// The control handler pauses and resumes a session consumer as it does a queue consumer.
func TestControlHandlerPausesASessionConsumer(t *testing.T) {
	b := newSessionBroker(t, nil)
	sc := newSessionConsumer(t, b, okHandler, nil, nil, nil)
	h := retry.ControlHandler(sc, nil)
	post := func(body string) int {
		req := httptest.NewRequest(http.MethodPost, "http://localhost/control", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	require.Equal(t, http.StatusOK, post(`{"action":"pause","reason":"maintenance"}`))
	assert.Equal(t, outage.Open, sc.Health().Outage.State)
	assert.Equal(t, "maintenance", sc.Health().Outage.Reason)
	require.Equal(t, http.StatusOK, post(`{"action":"resume"}`))
	assert.Equal(t, outage.Closed, sc.Health().Outage.State)
}
