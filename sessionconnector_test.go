package retry_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
)

const testConnStr = "Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=k;SharedAccessKey=secret;UseDevelopmentEmulator=true"

// fakeCredential is a token credential that is never asked for a token here.
type fakeCredential struct{}

func (fakeCredential) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{}, nil
}

func TestSessionConnectorsRefuseBadArguments(t *testing.T) {
	cases := map[string]struct {
		build func() (retry.SessionConnector, error)
		field string // empty: any invalid-options error
	}{
		"empty queue": {func() (retry.SessionConnector, error) {
			return retry.NewNamespace(testConnStr, nil).SessionQueue("")
		}, "queue"},
		"bad connection string": {func() (retry.SessionConnector, error) {
			return retry.NewNamespace("not a connection string", nil).SessionQueue("q")
		}, ""},
		"send rights": {func() (retry.SessionConnector, error) {
			return retry.NewNamespace(testConnStr, &retry.ConnectOptions{SendConnectionString: testConnStr}).SessionQueue("q")
		}, "ConnectOptions.SendConnectionString"},
		"settings check": {func() (retry.SessionConnector, error) {
			return retry.NewNamespace(testConnStr, &retry.ConnectOptions{CheckSettings: true}).SessionQueue("q")
		}, "ConnectOptions.CheckSettings"},
		"receiver options": {func() (retry.SessionConnector, error) {
			return retry.NewNamespace(testConnStr, &retry.ConnectOptions{Receiver: &azservicebus.ReceiverOptions{}}).SessionQueue("q")
		}, "ConnectOptions.Receiver"},
		"empty topic": {func() (retry.SessionConnector, error) {
			return retry.NewNamespace(testConnStr, nil).SessionSubscription("", "sub")
		}, "topic"},
		"empty subscription": {func() (retry.SessionConnector, error) {
			return retry.NewNamespace(testConnStr, nil).SessionSubscription("t", "")
		}, "subscription"},
		"credential without namespace": {func() (retry.SessionConnector, error) {
			return retry.NewNamespaceCredential("", fakeCredential{}, nil).SessionQueue("q")
		}, "namespace"},
		"nil credential": {func() (retry.SessionConnector, error) {
			return retry.NewNamespaceCredential("ns.servicebus.windows.net", nil, nil).SessionSubscription("t", "s")
		}, "credential"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			connect, err := tc.build()
			assert.Nil(t, connect)
			require.ErrorIs(t, err, retry.ErrInvalidOptions)
			assert.NotContains(t, err.Error(), "secret")
			if tc.field != "" {
				var oe *retry.OptionError
				require.ErrorAs(t, err, &oe)
				assert.Equal(t, tc.field, oe.Field)
			}
		})
	}
}

// What is wrong with a Namespace (its connection string, its namespace name or credential) is returned
// by every connector taken from it, queue and subscription, plain and session alike, and never the key.
func TestNamespaceErrorReachesEveryConnector(t *testing.T) {
	const badKey = "Endpoint=sb://;SharedAccessKeyName=k;SharedAccessKey=topsecret" // no host
	for name, ns := range map[string]*retry.Namespace{
		"malformed connection string":  retry.NewNamespace(badKey, nil),
		"bad send connection string":   retry.NewNamespace(testConnStr, &retry.ConnectOptions{SendConnectionString: badKey}),
		"credential without namespace": retry.NewNamespaceCredential("", fakeCredential{}, nil),
		"nil credential":               retry.NewNamespaceCredential("ns.servicebus.windows.net", nil, nil),
	} {
		t.Run(name, func(t *testing.T) {
			q, err := ns.Queue("q")
			assert.Nil(t, q)
			require.Error(t, err)
			assert.NotContains(t, err.Error(), "topsecret")
			s, err := ns.Subscription("t", "s", "t-s-retry")
			assert.Nil(t, s)
			require.Error(t, err)
			sq, err := ns.SessionQueue("q")
			assert.Nil(t, sq)
			require.Error(t, err)
			ss, err := ns.SessionSubscription("t", "s")
			assert.Nil(t, ss)
			require.Error(t, err)
		})
	}
}

// The built-in connectors name their entity and build a connection without touching the network
// (the SDK connects lazily); the accept is what talks to the broker.
func TestSessionConnectorsNameTheirEntity(t *testing.T) {
	q, err := retry.NewNamespace(testConnStr, nil).SessionQueue("orders")
	require.NoError(t, err)
	sub, err := retry.NewNamespace(testConnStr, nil).SessionSubscription("events", "billing")
	require.NoError(t, err)
	for want, connect := range map[string]retry.SessionConnector{"orders": q, "events/Subscriptions/billing": sub} {
		conn, err := connect(t.Context())
		require.NoError(t, err)
		assert.Equal(t, want, conn.EntityPath)
		assert.Equal(t, "127.0.0.1:5672", conn.Address)
		require.NotNil(t, conn.AcceptNext)
		require.NoError(t, conn.Close(t.Context()))
	}
}

// retrytest's connector: a closed connection accepts nothing more and gives its sessions up.
func TestRetrytestSessionConnectorClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newSessionBroker(t, nil)
		sendSession(t, b, "s", 1)
		conn, err := b.SessionConnector()(t.Context())
		require.NoError(t, err)
		assert.Equal(t, "queue", conn.EntityPath)
		recv, err := conn.AcceptNext(t.Context())
		require.NoError(t, err)
		assert.Equal(t, "s", recv.SessionID())
		assert.False(t, recv.LockedUntil().IsZero())
		require.NoError(t, conn.Close(t.Context()))
		assert.True(t, b.Sessions()[0].LockedUntil.IsZero(), "closing the connection released the session")
		_, err = conn.AcceptNext(t.Context())
		var sbErr *azservicebus.Error
		require.ErrorAs(t, err, &sbErr)
		assert.Equal(t, azservicebus.CodeClosed, sbErr.Code)

		// With no session available, an accept times out with CodeTimeout.
		conn2, err := b.SessionConnector()(t.Context())
		require.NoError(t, err)
		defer conn2.Close(t.Context())
		recv2, err := conn2.AcceptNext(t.Context())
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		_, err = conn2.AcceptNext(ctx)
		require.ErrorAs(t, err, &sbErr)
		assert.Equal(t, azservicebus.CodeTimeout, sbErr.Code)
		require.NoError(t, recv2.Close(t.Context()))
	})
}
