package sbemu

import (
	"context"
	"net/http"
	"strings"

	"github.com/coder/websocket"
)

// AMQP over WebSockets, as Service Bus serves it: the SDK's NewWebSocketConn dials
// wss://<namespace>/$servicebus/websocket with the "amqp" subprotocol, and the AMQP connection then runs
// inside binary WebSocket messages. The WebSocket protocol itself (RFC 6455: the handshake, masking,
// fragments, control frames, closing) is github.com/coder/websocket's, a maintained library, which the
// SDK's own live test uses on the client side; the emulator only checks the path and the subprotocol and
// hands the upgraded connection to its AMQP server as a net.Conn.

const (
	// websocketPath is where Service Bus serves AMQP over WebSockets.
	websocketPath = "/$servicebus/websocket"
	// websocketSubprotocol is the subprotocol the SDK asks for.
	websocketSubprotocol = "amqp"
)

// isWebSocketPath reports whether r asks for the WebSocket endpoint.
func isWebSocketPath(r *http.Request) bool {
	return strings.EqualFold(r.URL.Path, websocketPath)
}

// serveWebSocket answers the opening handshake and hands the upgraded connection to the emulator. A
// request that does not offer the "amqp" subprotocol gets 400; the library answers other handshake
// faults (not a GET: 405; no Upgrade: 426; another protocol version or a malformed key: 400).
func (a *adminServer) serveWebSocket(w http.ResponseWriter, r *http.Request) {
	if !offersSubprotocol(r, websocketSubprotocol) {
		http.Error(w, "sbemu: "+websocketPath+" serves AMQP over WebSockets: the subprotocol must be \"amqp\"", http.StatusBadRequest)
		return
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		Subprotocols: []string{websocketSubprotocol},
		// AMQP clients send no Origin; a browser's JavaScript SDK does, from its page's origin. The
		// connection authenticates with its SAS token over CBS, not with cookies, so any origin may
		// connect.
		OriginPatterns: []string{"*"},
	})
	if err != nil {
		return // Accept has answered the request
	}
	a.e.log.Debug("sbemu: WebSocket upgraded", "remote", r.RemoteAddr)
	// The connection lives until the AMQP server or the client closes it, not for the request.
	a.e.admit(websocket.NetConn(context.WithoutCancel(r.Context()), c, websocket.MessageBinary))
}

// offersSubprotocol reports whether r's Sec-WebSocket-Protocol lists name, ignoring case.
func offersSubprotocol(r *http.Request, name string) bool {
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(p), name) {
				return true
			}
		}
	}
	return false
}
