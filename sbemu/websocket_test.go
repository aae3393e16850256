package sbemu

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// dialWebSocket opens em's WebSocket endpoint with github.com/coder/websocket, as the SDK's live test
// does, and returns the connection as a byte stream; the caller closes it.
func dialWebSocket(ctx context.Context, t *testing.T, em *Emulator) (net.Conn, error) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: em.AdminRootCAs(), ServerName: adminServerName},
		ForceAttemptHTTP2: false,
	}}
	c, resp, err := websocket.Dial(ctx, strings.TrimSuffix(em.AdminEndpoint(), "/")+websocketPath, &websocket.DialOptions{
		HTTPClient: client, Subprotocols: []string{websocketSubprotocol},
	})
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("handshake answered %d: %w", resp.StatusCode, err)
		}
		return nil, err
	}
	assert.Equal(t, websocketSubprotocol, c.Subprotocol())
	return websocket.NetConn(context.WithoutCancel(ctx), c, websocket.MessageBinary), nil
}

// rawHandshake sends a WebSocket opening handshake to em's endpoint by hand, with header changing the
// valid one, and returns the HTTP status of the answer: the way to send the malformed handshakes a
// WebSocket library will not.
func rawHandshake(t *testing.T, em *Emulator, header http.Header) int {
	t.Helper()
	addr := strings.TrimSuffix(strings.TrimPrefix(em.AdminEndpoint(), "https://"), "/")
	nc, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: em.AdminRootCAs(), ServerName: adminServerName, NextProtos: []string{"http/1.1"}})
	require.NoError(t, err)
	defer nc.Close()
	var key [16]byte
	_, _ = rand.Read(key[:])
	req, err := http.NewRequest(http.MethodGet, "https://"+addr+websocketPath, nil)
	require.NoError(t, err)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", base64.StdEncoding.EncodeToString(key[:]))
	req.Header.Set("Sec-WebSocket-Protocol", websocketSubprotocol)
	for k, v := range header {
		req.Header[k] = v
	}
	require.NoError(t, req.Write(nc))
	require.NoError(t, nc.SetReadDeadline(time.Now().Add(testTimeout)))
	resp, err := http.ReadResponse(bufio.NewReader(nc), req)
	require.NoError(t, err)
	return resp.StatusCode
}

// TestSDKOverWebSockets: the SDK, given a NewWebSocketConn that dials the URL it is handed, sends and
// receives through the emulator's WebSocket endpoint on the administration API's port, as through
// Service Bus's (the SDK's live test TestNewClientWithWebsockets).
func TestSDKOverWebSockets(t *testing.T) {
	em := startEmulator(t, Config{StrictAuth: true})
	var dialled []string
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), &azservicebus.ClientOptions{
		NewWebSocketConn: func(ctx context.Context, args azservicebus.NewWebSocketConnArgs) (net.Conn, error) {
			dialled = append(dialled, args.Host)
			return dialWebSocket(ctx, t, em)
		},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close(context.Background()) })
	sendText(t, newSender(t, client, "queue"), "over websockets")
	r := newReceiver(t, client, "queue", nil)
	msg := receiveOne(t, r)
	assert.Equal(t, "over websockets", string(msg.Body))
	require.NoError(t, r.CompleteMessage(ctxT(t), msg, nil))
	require.NotEmpty(t, dialled)
	assert.True(t, strings.HasSuffix(dialled[0], websocketPath), "the SDK dials %s", dialled[0])
}

// TestWebSocketHandshakes: a handshake that is not for AMQP over WebSockets is refused; an upgraded
// connection carries the AMQP bytes both ways (the emulator answers a SASL protocol header with its
// own).
func TestWebSocketHandshakes(t *testing.T) {
	em := startEmulator(t, Config{})
	for name, tc := range map[string]struct {
		header http.Header
		want   int
	}{
		"another subprotocol": {http.Header{"Sec-Websocket-Protocol": {"mqtt"}}, http.StatusBadRequest},
		"another version":     {http.Header{"Sec-Websocket-Version": {"8"}}, http.StatusBadRequest},
		"a short key":         {http.Header{"Sec-Websocket-Key": {"c2hvcnQ="}}, http.StatusBadRequest},
		"no upgrade":          {http.Header{"Upgrade": {"h2c"}}, http.StatusUpgradeRequired},
	} {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.want, rawHandshake(t, em, tc.header))
		})
	}

	nc, err := dialWebSocket(ctxT(t), t, em)
	require.NoError(t, err)
	defer nc.Close()
	sasl := []byte{'A', 'M', 'Q', 'P', 3, 1, 0, 0}
	_, err = nc.Write(sasl)
	require.NoError(t, err)
	require.NoError(t, nc.SetReadDeadline(time.Now().Add(testTimeout)))
	got := make([]byte, len(sasl))
	_, err = io.ReadFull(nc, got)
	require.NoError(t, err)
	assert.Equal(t, sasl, got)
}
