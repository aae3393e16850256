package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu"
)

func TestParseAuthRule(t *testing.T) {
	tests := []struct {
		name, in string
		want     sbemu.AuthorizationRule
		wantErr  string
	}{
		{name: "one right", in: "listen-only=k:Listen",
			want: sbemu.AuthorizationRule{KeyName: "listen-only", PrimaryKey: "k", Rights: []sbemu.AccessRight{sbemu.RightListen}}},
		{name: "base64 key and spaced rights", in: "ops=YWJj+/==:manage, Send",
			want: sbemu.AuthorizationRule{KeyName: "ops", PrimaryKey: "YWJj+/==", Rights: []sbemu.AccessRight{sbemu.RightManage, sbemu.RightSend}}},
		{name: "no equals", in: "ops", wantErr: `no "="`},
		{name: "empty name", in: "=k:Send", wantErr: "empty key name"},
		{name: "no rights", in: "ops=k", wantErr: `rule "ops" has no rights`},
		{name: "empty key", in: "ops=:Send", wantErr: `rule "ops" has an empty key`},
		{name: "unknown right", in: "ops=k:Read", wantErr: `rule "ops": unknown access right "Read"`},
		{name: "empty right", in: "ops=k:Send,", wantErr: "empty right"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseAuthRule(tc.in)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestRunRejectsBadAuthRules checks that every bad rule, from a flag or
// from Config.json, is an error with exit status 2 before anything
// listens.
func TestRunRejectsBadAuthRules(t *testing.T) {
	badConfig := filepath.Join(t.TempDir(), "Config.json")
	require.NoError(t, os.WriteFile(badConfig, []byte(`{"UserConfig": {"Namespaces": [{"Name": "ns",
		"AuthorizationRules": [{"KeyName": "ops", "PrimaryKey": "k", "Rights": ["Write"]}]}]}}`), 0o600))
	dupConfig := filepath.Join(t.TempDir(), "Config.json")
	require.NoError(t, os.WriteFile(dupConfig, []byte(`{"UserConfig": {"Namespaces": [{"Name": "ns",
		"AuthorizationRules": [{"KeyName": "ops", "PrimaryKey": "k", "Rights": ["Send"]}]}]}}`), 0o600))
	tests := []struct {
		name     string
		args     []string
		wantText string
	}{
		{"unknown right", []string{"-auth-rule", "ops=k:Write"}, `unknown access right "Write"`},
		{"empty key", []string{"-auth-rule", "ops=:Send"}, "empty key"},
		{"duplicate flag", []string{"-auth-rule", "ops=k:Send", "-auth-rule", "OPS=k2:Listen"}, `key name "OPS" given twice`},
		{"flag names the root key", []string{"-auth-rule", "RootManageSharedAccessKey=k:Send"}, "the key name is taken"},
		{"flag repeats a config rule", []string{"-config", dupConfig, "-auth-rule", "ops=k:Listen"}, "the key name is taken"},
		{"bad config rule", []string{"-config", badConfig}, `AuthorizationRules[0] "ops": unknown access right "Write"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := run(context.Background(), append([]string{"-addr", "127.0.0.1:0", "-strict-auth"}, tc.args...), io.Discard, io.Discard)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantText)
			assert.Equal(t, 2, exitCode(err))
		})
	}
}

// withKey rewrites the key name and key of a connection string printed by
// run.
func withKey(cs, keyName, key string) string {
	parts := strings.Split(cs, ";")
	for i, p := range parts {
		switch {
		case strings.HasPrefix(p, "SharedAccessKeyName="):
			parts[i] = "SharedAccessKeyName=" + keyName
		case strings.HasPrefix(p, "SharedAccessKey="):
			parts[i] = "SharedAccessKey=" + key
		}
	}
	return strings.Join(parts, ";")
}

// TestRunChecksAuthRules serves a listen-only policy from -auth-rule and
// a send-only one from Config.json under -strict-auth, and checks each has
// exactly its rights.
func TestRunChecksAuthRules(t *testing.T) {
	config := filepath.Join(t.TempDir(), "Config.json")
	require.NoError(t, os.WriteFile(config, []byte(`{"UserConfig": {"Namespaces": [{"Name": "ns",
		"Queues": [{"Name": "orders"}],
		"AuthorizationRules": [{"KeyName": "send-only", "PrimaryKey": "c2VuZA==", "Rights": ["Send"]}]}]}}`), 0o600))
	cs := startRun(t, "-strict-auth", "-config", config, "-auth-rule", "listen-only=bGlzdGVu:Listen")
	opts := &azservicebus.ClientOptions{RetryOptions: azservicebus.RetryOptions{MaxRetries: 1, RetryDelay: 10 * time.Millisecond, MaxRetryDelay: 10 * time.Millisecond}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	sendOnly, err := azservicebus.NewClientFromConnectionString(withKey(cs, "send-only", "c2VuZA=="), opts)
	require.NoError(t, err)
	defer func() { _ = sendOnly.Close(ctx) }()
	sender, err := sendOnly.NewSender("orders", nil)
	require.NoError(t, err)
	require.NoError(t, sender.SendMessage(ctx, &azservicebus.Message{Body: []byte("o1")}, nil))
	_, err = mustReceiver(t, sendOnly).PeekMessages(ctx, 1, nil)
	assertUnauthorized(t, err, "Listen")

	listenOnly, err := azservicebus.NewClientFromConnectionString(withKey(cs, "listen-only", "bGlzdGVu"), opts)
	require.NoError(t, err)
	defer func() { _ = listenOnly.Close(ctx) }()
	msgs, err := mustReceiver(t, listenOnly).ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	assert.Equal(t, "o1", string(msgs[0].Body))
	s2, err := listenOnly.NewSender("orders", nil)
	require.NoError(t, err)
	assertUnauthorized(t, s2.SendMessage(ctx, &azservicebus.Message{Body: []byte("o2")}, nil), "Send")

	wrongKey, err := azservicebus.NewClientFromConnectionString(withKey(cs, "listen-only", "d3Jvbmc="), opts)
	require.NoError(t, err)
	defer func() { _ = wrongKey.Close(ctx) }()
	_, err = mustReceiver(t, wrongKey).PeekMessages(ctx, 1, nil)
	require.Error(t, err)
}

func mustReceiver(t *testing.T, c *azservicebus.Client) *azservicebus.Receiver {
	t.Helper()
	r, err := c.NewReceiverForQueue("orders", nil)
	require.NoError(t, err)
	return r
}

// assertUnauthorized checks err is Service Bus's refusal for a missing
// claim.
func assertUnauthorized(t *testing.T, err error, claim string) {
	t.Helper()
	require.Error(t, err)
	var sbErr *azservicebus.Error
	require.True(t, errors.As(err, &sbErr), "%v", err)
	assert.Equal(t, azservicebus.CodeUnauthorizedAccess, sbErr.Code)
	assert.Contains(t, err.Error(), "'"+claim+"' claim(s) are required")
}

// TestRunAcceptUnverifiedJWT reaches the administration API with a bearer
// token, which -strict-auth refuses unless -accept-unverified-jwt is set.
func TestRunAcceptUnverifiedJWT(t *testing.T) {
	for _, tc := range []struct {
		name       string
		args       []string
		wantStatus int
	}{
		{"refused by default", nil, http.StatusUnauthorized},
		{"accepted with the flag", []string{"-accept-unverified-jwt"}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			started := make(chan *sbemu.Emulator, 1)
			testHookStarted = func(em *sbemu.Emulator) { started <- em }
			t.Cleanup(func() { testHookStarted = nil })
			startRun(t, append([]string{"-strict-auth", "-queue", "orders"}, tc.args...)...)
			em := <-started
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, em.AdminEndpoint()+"orders?api-version=2021-05", nil)
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer eyJhbGciOiJub25lIn0.e30.")
			resp, err := em.AdminHTTPClient().Do(req)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			require.NoError(t, resp.Body.Close())
			assert.Equal(t, tc.wantStatus, resp.StatusCode)
		})
	}
}

// TestRunWarnsOfRulesWithoutStrictAuth: rules given without -strict-auth
// are not checked, and the log says so at start.
func TestRunWarnsOfRulesWithoutStrictAuth(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errR, errW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-auth-rule", "ops=k:Send"}, io.Discard, errW)
		_ = errW.Close()
	}()
	logs := bufio.NewScanner(errR)
	var warned bool
	for !warned && logs.Scan() {
		warned = strings.Contains(logs.Text(), "take effect only with -strict-auth")
	}
	assert.True(t, warned, "no warning logged")
	go func() { _, _ = io.Copy(io.Discard, errR) }()
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return after cancellation")
	}
}
