package sbemu

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wsClient is the client end of a WebSocket, as RFC 6455 has a client
// speak: every frame masked. It is what github.com/coder/websocket does
// for the SDK's live test, reduced to binary messages.
type wsClient struct {
	net.Conn
	br   *bufio.Reader
	left int // payload bytes of the current server frame not read yet
}

// dialWebSocket opens em's WebSocket endpoint with the handshake a client
// sends, asking for protocols (the "amqp" subprotocol unless the test says
// otherwise), and returns the connection, which the caller closes, or the
// HTTP status it got.
func dialWebSocket(t *testing.T, em *Emulator, header http.Header) (*wsClient, int) {
	t.Helper()
	addr := strings.TrimSuffix(strings.TrimPrefix(em.AdminEndpoint(), "https://"), "/")
	nc, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: em.AdminRootCAs(), ServerName: adminServerName, NextProtos: []string{"http/1.1"}})
	require.NoError(t, err)
	var key [16]byte
	_, _ = rand.Read(key[:])
	req, err := http.NewRequest(http.MethodGet, "https://"+addr+websocketPath, nil)
	require.NoError(t, err)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", base64.StdEncoding.EncodeToString(key[:]))
	req.Header.Set("Sec-WebSocket-Protocol", "amqp")
	for k, v := range header {
		req.Header[k] = v
	}
	require.NoError(t, req.Write(nc))
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, req)
	require.NoError(t, err)
	if resp.StatusCode != http.StatusSwitchingProtocols {
		_ = nc.Close()
		return nil, resp.StatusCode
	}
	assert.Equal(t, "amqp", resp.Header.Get("Sec-WebSocket-Protocol"))
	assert.NotEmpty(t, resp.Header.Get("Sec-WebSocket-Accept"))
	return &wsClient{Conn: nc, br: br}, resp.StatusCode
}

// frame sends one masked frame.
func (c *wsClient) frame(op byte, fin bool, payload []byte) error {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	hdr := []byte{b0, 0}
	switch n := len(payload); {
	case n < 126:
		hdr[1] = 0x80 | byte(n)
	case n <= 0xFFFF:
		hdr[1] = 0x80 | 126
		hdr = binary.BigEndian.AppendUint16(hdr, uint16(n))
	default:
		hdr[1] = 0x80 | 127
		hdr = binary.BigEndian.AppendUint64(hdr, uint64(n))
	}
	mask := [4]byte{0x12, 0x34, 0x56, 0x78}
	hdr = append(hdr, mask[:]...)
	masked := make([]byte, len(payload))
	for i, b := range payload {
		masked[i] = b ^ mask[i&3]
	}
	_, err := c.Conn.Write(append(hdr, masked...))
	return err
}

// Write sends p as one binary message.
func (c *wsClient) Write(p []byte) (int, error) {
	if err := c.frame(wsBinary, true, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Read returns the payload of the server's binary frames; readControl
// returns the next control frame instead when the test expects one.
func (c *wsClient) Read(p []byte) (int, error) {
	for c.left == 0 {
		op, n, err := c.header()
		if err != nil {
			return 0, err
		}
		if op != wsBinary && op != wsContinuation {
			if _, err := io.CopyN(io.Discard, c.br, int64(n)); err != nil {
				return 0, err
			}
			if op == wsClose {
				return 0, io.EOF
			}
			continue
		}
		c.left = n
	}
	n, err := c.br.Read(p[:min(len(p), c.left)])
	c.left -= n
	return n, err
}

// header reads a server frame header, which is never masked.
func (c *wsClient) header() (op byte, length int, err error) {
	var h [2]byte
	if _, err := io.ReadFull(c.br, h[:]); err != nil {
		return 0, 0, err
	}
	if h[1]&0x80 != 0 {
		return 0, 0, fmt.Errorf("the server masked a frame")
	}
	n := uint64(h[1] & 0x7F)
	switch n {
	case 126:
		var e [2]byte
		_, err = io.ReadFull(c.br, e[:])
		n = uint64(binary.BigEndian.Uint16(e[:]))
	case 127:
		var e [8]byte
		_, err = io.ReadFull(c.br, e[:])
		n = binary.BigEndian.Uint64(e[:])
	}
	return h[0] & 0x0F, int(n), err
}

// readControl reads the next frame, which must be a control frame, and
// returns its opcode and payload.
func (c *wsClient) readControl(t *testing.T) (byte, []byte) {
	t.Helper()
	require.NoError(t, c.Conn.SetReadDeadline(time.Now().Add(testTimeout)))
	op, n, err := c.header()
	require.NoError(t, err)
	payload := make([]byte, n)
	_, err = io.ReadFull(c.br, payload)
	require.NoError(t, err)
	return op, payload
}

// TestSDKOverWebSockets: the SDK, given a NewWebSocketConn that dials the
// URL it is handed, sends and receives through the emulator's WebSocket
// endpoint on the administration API's port, as through Service Bus's
// (the SDK's live test TestNewClientWithWebsockets).
func TestSDKOverWebSockets(t *testing.T) {
	em := startEmulator(t, Config{StrictAuth: true})
	var dialled []string
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), &azservicebus.ClientOptions{
		NewWebSocketConn: func(ctx context.Context, args azservicebus.NewWebSocketConnArgs) (net.Conn, error) {
			dialled = append(dialled, args.Host)
			c, status := dialWebSocket(t, em, nil)
			if c == nil {
				return nil, fmt.Errorf("handshake answered %d", status)
			}
			return c, nil
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

// TestWebSocketHandshakeAndControlFrames: a handshake that is not for
// AMQP over WebSockets is refused; an upgraded connection answers a ping
// with a pong carrying its payload, takes an AMQP protocol header split
// across fragments, and answers a close with a close.
func TestWebSocketHandshakeAndControlFrames(t *testing.T) {
	em := startEmulator(t, Config{})
	for name, tc := range map[string]struct {
		header http.Header
		want   int
	}{
		"another subprotocol": {http.Header{"Sec-Websocket-Protocol": {"mqtt"}}, http.StatusBadRequest},
		"another version":     {http.Header{"Sec-Websocket-Version": {"8"}}, http.StatusUpgradeRequired},
		"a short key":         {http.Header{"Sec-Websocket-Key": {"c2hvcnQ="}}, http.StatusBadRequest},
		"no upgrade":          {http.Header{"Upgrade": {"h2c"}}, http.StatusBadRequest},
	} {
		t.Run(name, func(t *testing.T) {
			_, status := dialWebSocket(t, em, tc.header)
			assert.Equal(t, tc.want, status)
		})
	}

	c, status := dialWebSocket(t, em, nil)
	require.Equal(t, http.StatusSwitchingProtocols, status)
	defer c.Close()
	require.NoError(t, c.frame(wsPing, true, []byte("are you there")))
	op, payload := c.readControl(t)
	assert.Equal(t, byte(wsPong), op)
	assert.Equal(t, "are you there", string(payload))

	// "AMQP" 0 1 0 0 in two fragments: the emulator answers with its own header.
	require.NoError(t, c.frame(wsBinary, false, []byte("AM")))
	require.NoError(t, c.frame(wsContinuation, true, []byte{'Q', 'P', 0, 1, 0, 0}))
	got := make([]byte, 8)
	require.NoError(t, c.Conn.SetReadDeadline(time.Now().Add(testTimeout)))
	_, err := io.ReadFull(c, got)
	require.NoError(t, err)
	assert.Equal(t, []byte{'A', 'M', 'Q', 'P', 0, 1, 0, 0}, got)

	require.NoError(t, c.frame(wsClose, true, []byte{0x03, 0xE8}))
	for {
		op, payload = c.readControl(t)
		if op == wsClose {
			break
		}
	}
	assert.Equal(t, []byte{0x03, 0xE8}, payload, "the close echoes the status code")
}

// fakeNetConn is a net.Conn whose writes go nowhere, for the fuzz test.
type fakeNetConn struct{ net.Conn }

func (fakeNetConn) Write(p []byte) (int, error)       { return len(p), nil }
func (fakeNetConn) Close() error                      { return nil }
func (fakeNetConn) SetWriteDeadline(time.Time) error  { return nil }
func (fakeNetConn) RemoteAddr() net.Addr              { return memAddr{} }
func (fakeNetConn) SetReadDeadline(t time.Time) error { return nil }

// FuzzWebSocketFrames: whatever a client sends after its handshake, the
// server side reads it to an end without panicking or hanging.
func FuzzWebSocketFrames(f *testing.F) {
	masked := func(op byte, payload []byte) []byte {
		out := []byte{0x80 | op, 0x80 | byte(len(payload)), 1, 2, 3, 4}
		for i, b := range payload {
			out = append(out, b^[]byte{1, 2, 3, 4}[i&3])
		}
		return out
	}
	f.Add(masked(wsBinary, []byte("AMQP\x00\x01\x00\x00")))
	f.Add(append(masked(wsPing, []byte("x")), masked(wsClose, []byte{3, 232})...))
	f.Add([]byte{0x82, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 4})
	f.Add([]byte{0x82, 0x7E, 0xFF})
	f.Add([]byte{0x81, 0x81, 0, 0, 0, 0, 'x'})
	f.Add([]byte{0x09, 0x80, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		c := newWSConn(fakeNetConn{}, bufio.NewReader(bytes.NewReader(data)))
		buf := make([]byte, 64)
		total := 0
		for {
			n, err := c.Read(buf)
			total += n
			if err != nil {
				break
			}
			if total > len(data) {
				t.Fatalf("read %d payload bytes from %d bytes of frames", total, len(data))
			}
		}
		_, _ = c.Write([]byte("reply"))
		_ = c.Close()
	})
}
