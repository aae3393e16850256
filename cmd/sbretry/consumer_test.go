package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/outage"
	"github.com/sbretry/retry/retrytest"
)

// controlledConsumer is a consumer (not running: the breaker does not need Run) behind its control
// endpoint on loopback.
func controlledConsumer(t *testing.T, token string) (*retry.Consumer, string) {
	t.Helper()
	b, err := retrytest.New(nil, nil)
	require.NoError(t, err)
	c, err := retry.NewConsumer(b.Connector(), func(context.Context, *azservicebus.ReceivedMessage) error { return nil }, nil)
	require.NoError(t, err)
	srv := httptest.NewServer(retry.ControlHandler(c, &retry.ControlOptions{Token: token}))
	t.Cleanup(srv.Close)
	return c, srv.URL
}

func TestPauseAndResumeAConsumer(t *testing.T) {
	c, u := controlledConsumer(t, "tok")
	auth := []string{"--consumer", u, "--token", "tok"}

	code, out, errOut := cliNoEntity(t, "", append([]string{"outage"}, auth...)...)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "outage breaker closed")

	code, out, errOut = cliNoEntity(t, "", append([]string{"pause", "--reason", "billing migration", "--dry-run"}, auth...)...)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "would pause "+u+": outage breaker closed")
	assert.Equal(t, outage.Closed, c.Health().Outage.State, "a dry run changes nothing")

	code, out, errOut = cliNoEntity(t, "", append([]string{"pause", "--reason", "billing migration"}, auth...)...)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "paused: "+u+": outage breaker open (paused by hand): billing migration")
	st := c.Health().Outage
	assert.True(t, st.Manual)
	assert.Equal(t, "billing migration", st.Reason)

	code, out, errOut = cliNoEntity(t, "", append([]string{"resume", "--json"}, auth...)...)
	require.Equal(t, exitOK, code, errOut)
	var got struct {
		Consumer string        `json:"consumer"`
		Action   string        `json:"action"`
		Before   consumerState `json:"before"`
		After    consumerState `json:"after"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	assert.Equal(t, "resumed", got.Action)
	assert.Equal(t, "open", got.Before.State)
	assert.Equal(t, "closed", got.After.State)
	assert.Equal(t, outage.Closed, c.Health().Outage.State)
}

func TestConsumerCommandsRefuse(t *testing.T) {
	c, u := controlledConsumer(t, "tok")
	// A server that answers 200 to everything but never pauses: success must not be reported.
	liar := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"state":"closed"}`))
	}))
	t.Cleanup(liar.Close)
	var leaked []string
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		leaked = append(leaked, r.Header.Get("Authorization"))
		_, _ = w.Write([]byte(`{"state":"open","manual":true}`))
	}))
	t.Cleanup(plain.Close)
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, plain.URL, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(redirect.Close)
	notControl := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	}))
	t.Cleanup(notControl.Close)
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no consumer", []string{"pause"}, exitUsage, "needs --consumer URL"},
		{"not a URL", []string{"pause", "--consumer", "orders"}, exitUsage, "want an http or https URL"},
		{"a token over plain http elsewhere", []string{"pause", "--consumer", "http://consumer.example:8080/control", "--token", "tok"}, exitUsage, "only over https"},
		{"reason on resume", []string{"resume", "--consumer", u, "--reason", "x"}, exitUsage, "--reason is for pause"},
		{"dry run of outage", []string{"outage", "--consumer", u, "--dry-run"}, exitUsage, "only reads"},
		{"wrong token", []string{"pause", "--consumer", u, "--token", "nope"}, exitError, "missing or wrong bearer token"},
		{"a consumer that does not pause", []string{"pause", "--consumer", liar.URL}, exitError, "not done"},
		{"a redirect is not followed", []string{"pause", "--consumer", redirect.URL, "--token", "tok"}, exitError, "307"},
		{"not a control endpoint", []string{"outage", "--consumer", notControl.URL}, exitError, "is --consumer its ControlHandler?"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := cliNoEntity(t, "", tc.args...)
			assert.Equal(t, tc.code, code, errOut)
			assert.Contains(t, errOut, tc.want)
			assert.NotContains(t, errOut, "nope", "the token is never printed")
		})
	}
	assert.Equal(t, outage.Closed, c.Health().Outage.State)
	assert.Empty(t, leaked, "the token never followed the redirect")
}
