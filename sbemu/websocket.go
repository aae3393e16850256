package sbemu

import (
	"bufio"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// AMQP over WebSockets, the door clients take when only port 443 is open.
//
// Service Bus serves AMQP over WebSockets at wss://<namespace>/$servicebus/websocket
// with the subprotocol "amqp", on the host and port of its HTTPS API; the
// Go SDK dials that URL when ClientOptions.NewWebSocketConn is set
// (azservicebus v1.11.0 internal/namespace.go, getWSSHostURI +
// "$servicebus/websocket") and its live test TestNewClientWithWebsockets
// does so with github.com/coder/websocket. The emulator serves the same
// path on its administration API's HTTPS port (admin.go) and speaks RFC
// 6455 itself: the opening handshake (section 4.2), then binary messages,
// whose payloads form the AMQP byte stream in both directions, answered
// pings and the closing handshake (section 5.5). The upgrade needs no
// Authorization header: the AMQP connection presents its tokens on "$cbs"
// as any other does. The connection is then served like a TCP one
// ([Emulator.admit]): limits, faults and [Emulator.Close] apply.

const (
	// websocketPath is where Service Bus serves AMQP over WebSockets.
	websocketPath = "/$servicebus/websocket"
	// websocketSubprotocol is the subprotocol the SDK asks for.
	websocketSubprotocol = "amqp"
	// websocketGUID is RFC 6455's magic string for Sec-WebSocket-Accept.
	websocketGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
)

// WebSocket opcodes (RFC 6455 section 5.2).
const (
	wsContinuation = 0x0
	wsText         = 0x1
	wsBinary       = 0x2
	wsClose        = 0x8
	wsPing         = 0x9
	wsPong         = 0xA
)

// WebSocket close codes (RFC 6455 section 7.4.1).
const (
	wsCloseNormal      = 1000
	wsCloseProtocol    = 1002
	wsCloseUnsupported = 1003
)

// isWebSocketPath reports whether r asks for the WebSocket endpoint.
func isWebSocketPath(r *http.Request) bool {
	return strings.EqualFold(r.URL.Path, websocketPath)
}

// serveWebSocket answers the opening handshake and hands the upgraded
// connection to the emulator. A request that is not a valid WebSocket
// handshake for the "amqp" subprotocol gets 400 (426 for another protocol
// version, with the version the emulator speaks).
func (a *adminServer) serveWebSocket(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Sec-WebSocket-Key")
	switch decoded, err := base64.StdEncoding.DecodeString(key); {
	case r.Method != http.MethodGet:
		http.Error(w, "sbemu: a WebSocket handshake is a GET", http.StatusMethodNotAllowed)
		return
	case !headerHasToken(r.Header, "Connection", "upgrade") || !headerHasToken(r.Header, "Upgrade", "websocket"):
		http.Error(w, "sbemu: "+websocketPath+" serves AMQP over WebSockets only (Upgrade: websocket)", http.StatusBadRequest)
		return
	case r.Header.Get("Sec-WebSocket-Version") != "13":
		w.Header().Set("Sec-WebSocket-Version", "13")
		http.Error(w, "sbemu: WebSocket version 13 only", http.StatusUpgradeRequired)
		return
	case err != nil || len(decoded) != 16:
		http.Error(w, "sbemu: Sec-WebSocket-Key must be 16 bytes in base64", http.StatusBadRequest)
		return
	case !headerHasToken(r.Header, "Sec-WebSocket-Protocol", websocketSubprotocol):
		http.Error(w, "sbemu: the WebSocket subprotocol must be \"amqp\"", http.StatusBadRequest)
		return
	}
	nc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// HTTP/2 cannot be hijacked; WebSocket clients use HTTP/1.1.
		http.Error(w, "sbemu: WebSockets need HTTP/1.1", http.StatusBadRequest)
		return
	}
	sum := sha1.Sum([]byte(key + websocketGUID))
	_ = nc.SetWriteDeadline(time.Now().Add(handshakeTimeout))
	_, err = fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\nSec-WebSocket-Protocol: %s\r\n\r\n",
		base64.StdEncoding.EncodeToString(sum[:]), websocketSubprotocol)
	if err == nil {
		err = brw.Flush()
	}
	_ = nc.SetWriteDeadline(time.Time{})
	if err != nil {
		_ = nc.Close()
		return
	}
	a.e.log.Debug("sbemu: WebSocket upgraded", "remote", nc.RemoteAddr().String())
	a.e.admit(newWSConn(nc, brw.Reader))
}

// headerHasToken reports whether a comma-separated header holds token,
// ignoring case.
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// wsConn is a server-side WebSocket connection as a byte stream: Read
// returns the payloads of the client's data frames in order, Write sends
// each call as one binary message. Reads come from one goroutine at a time
// (the connection's reader); writes may come from any, and are serialised
// with the pongs and close frames Read sends.
type wsConn struct {
	nc net.Conn
	br *bufio.Reader // holds what the client sent after its handshake

	// Read side; only Read touches it.
	remaining uint64 // payload bytes left in the current data frame
	mask      [4]byte
	maskAt    int
	readErr   error // sticky: once the stream ended, it stays ended

	wmu        sync.Mutex
	closeSent  bool
	closedOnce sync.Once
}

func newWSConn(nc net.Conn, br *bufio.Reader) *wsConn {
	return &wsConn{nc: nc, br: br}
}

// errWSProtocol reports a frame RFC 6455 forbids.
var errWSProtocol = errors.New("sbemu: WebSocket protocol error")

// Read reads payload bytes of data frames, answering control frames on
// the way; a close frame or a protocol error ends the stream.
func (c *wsConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for c.remaining == 0 {
		if c.readErr != nil {
			return 0, c.readErr
		}
		if err := c.nextFrame(); err != nil {
			c.readErr = err
			return 0, err
		}
	}
	n := len(p)
	if uint64(n) > c.remaining {
		n = int(c.remaining)
	}
	n, err := c.br.Read(p[:n])
	for i := range n {
		p[i] ^= c.mask[c.maskAt&3]
		c.maskAt++
	}
	c.remaining -= uint64(n)
	if errors.Is(err, io.EOF) && c.remaining > 0 {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		c.readErr = err
	}
	return n, err
}

// nextFrame reads frame headers until one starts data, handling control
// frames (ping, pong, close) itself.
func (c *wsConn) nextFrame() error {
	for {
		var hdr [2]byte
		if _, err := io.ReadFull(c.br, hdr[:]); err != nil {
			return err
		}
		fin, rsv, op := hdr[0]&0x80 != 0, hdr[0]&0x70, hdr[0]&0x0F
		masked, length := hdr[1]&0x80 != 0, uint64(hdr[1]&0x7F)
		switch length {
		case 126:
			var ext [2]byte
			if _, err := io.ReadFull(c.br, ext[:]); err != nil {
				return err
			}
			length = uint64(binary.BigEndian.Uint16(ext[:]))
		case 127:
			var ext [8]byte
			if _, err := io.ReadFull(c.br, ext[:]); err != nil {
				return err
			}
			length = binary.BigEndian.Uint64(ext[:])
			if length>>63 != 0 {
				return c.fail(wsCloseProtocol, "frame length with its top bit set")
			}
		}
		// Section 5.1: every client frame is masked; section 5.2: no
		// extension was negotiated, so the reserved bits are zero.
		if !masked {
			return c.fail(wsCloseProtocol, "unmasked client frame")
		}
		if rsv != 0 {
			return c.fail(wsCloseProtocol, "reserved bits set")
		}
		if _, err := io.ReadFull(c.br, c.mask[:]); err != nil {
			return err
		}
		c.maskAt = 0
		switch op {
		case wsBinary, wsContinuation:
			c.remaining = length
			if length > 0 {
				return nil
			}
			continue // an empty data frame carries nothing
		case wsText:
			return c.fail(wsCloseUnsupported, "text frame: AMQP travels in binary messages")
		case wsClose, wsPing, wsPong:
			// Section 5.5: control frames are never fragmented and carry at
			// most 125 bytes.
			if !fin || length > 125 {
				return c.fail(wsCloseProtocol, "fragmented or oversized control frame")
			}
			payload := make([]byte, length)
			if _, err := io.ReadFull(c.br, payload); err != nil {
				return err
			}
			for i := range payload {
				payload[i] ^= c.mask[i&3]
			}
			switch op {
			case wsPing:
				if err := c.writeFrame(wsPong, payload); err != nil {
					return err
				}
			case wsClose:
				// Echo the status code, as section 5.5.1 asks, then end.
				code := []byte(nil)
				if len(payload) >= 2 {
					code = payload[:2]
				}
				_ = c.writeClose(code)
				return io.EOF
			}
		default:
			return c.fail(wsCloseProtocol, fmt.Sprintf("unknown opcode %#x", op))
		}
	}
}

// fail sends a close frame with code and reports a protocol error.
func (c *wsConn) fail(code uint16, why string) error {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], code)
	_ = c.writeClose(b[:])
	return fmt.Errorf("%w: %s", errWSProtocol, why)
}

// Write sends p as one binary message.
func (c *wsConn) Write(p []byte) (int, error) {
	if err := c.writeFrame(wsBinary, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// writeFrame sends one unmasked final frame (servers never mask, section
// 5.1).
func (c *wsConn) writeFrame(op byte, payload []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closeSent {
		return net.ErrClosed
	}
	return c.writeFrameLocked(op, payload)
}

func (c *wsConn) writeFrameLocked(op byte, payload []byte) error {
	hdr := make([]byte, 2, 10)
	hdr[0] = 0x80 | op
	switch n := len(payload); {
	case n < 126:
		hdr[1] = byte(n)
	case n <= 0xFFFF:
		hdr[1] = 126
		hdr = binary.BigEndian.AppendUint16(hdr, uint16(n))
	default:
		hdr[1] = 127
		hdr = binary.BigEndian.AppendUint64(hdr, uint64(n))
	}
	bufs := net.Buffers{hdr, payload}
	_, err := bufs.WriteTo(c.nc)
	return err
}

// writeClose sends the close frame once; nothing is written after it.
func (c *wsConn) writeClose(payload []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closeSent {
		return nil
	}
	c.closeSent = true
	return c.writeFrameLocked(wsClose, payload)
}

// Close sends a normal close frame, bounded by a short deadline, and
// closes the socket.
func (c *wsConn) Close() error {
	var err error
	c.closedOnce.Do(func() {
		_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
		var b [2]byte
		binary.BigEndian.PutUint16(b[:], wsCloseNormal)
		_ = c.writeClose(b[:])
		err = c.nc.Close()
	})
	return err
}

func (c *wsConn) LocalAddr() net.Addr                { return c.nc.LocalAddr() }
func (c *wsConn) RemoteAddr() net.Addr               { return c.nc.RemoteAddr() }
func (c *wsConn) SetDeadline(t time.Time) error      { return c.nc.SetDeadline(t) }
func (c *wsConn) SetReadDeadline(t time.Time) error  { return c.nc.SetReadDeadline(t) }
func (c *wsConn) SetWriteDeadline(t time.Time) error { return c.nc.SetWriteDeadline(t) }
