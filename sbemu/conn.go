package sbemu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/sbretry/retry/sbemu/internal/wire"
)

// Connection limits the emulator advertises in its open frame.
const (
	// maxFrameSize is the largest frame the emulator accepts. 64 KiB matches
	// what the SDK asks for and makes large messages exercise multi-frame
	// transfers.
	maxFrameSize = 64 * 1024
	// minFrameSize is the smallest max-frame-size AMQP allows a peer to ask for.
	// A client asking for less is raised to it rather than refused, so a
	// quirky client still gets a working connection.
	minFrameSize = 512
	// channelMax is the highest session channel number the emulator accepts.
	// It is advertised in the open reply; the SDK opens a fresh session per
	// CBS put-token and per link set, so channels are reused but never run
	// out in practice.
	channelMax = 4095
	// handshakeTimeout bounds the protocol-header, SASL and open exchange.
	// A client that connects and then says nothing would otherwise hold a
	// goroutine until the idle timeout, which only applies after open.
	handshakeTimeout = 30 * time.Second
)

// conn is one client connection. Its reader goroutine (serve) owns frame
// dispatch; a writer goroutine owns the socket's write side; each link that
// sends to the client owns one delivery goroutine. All of them stop when
// done is closed and are awaited before serve returns.
type conn struct {
	// Fields above mu are set before the reader starts (or during the
	// handshake, before any other goroutine exists) and are read-only after.
	em  *Emulator
	id  uint64 // broker lock owner for everything received on this connection
	nc  net.Conn
	br  *bufio.Reader
	log *slog.Logger
	dbg bool // frame logging enabled

	// out is the writer goroutine's queue; writerDone is closed when writeLoop
	// returns; teardown waits for it (at most two seconds) before closing
	// the socket so a final close frame can still go out.
	out        *outbound
	writerDone chan struct{}

	// Negotiated in the open exchange.
	peerMaxFrame uint32        // largest frame the client accepts
	heartbeat    time.Duration // how often to send empty frames
	containerID  string        // client's container id, for logs

	// overLimit is set at accept when the connection exceeds
	// Limits.MaxConnections: it is closed right after the open exchange.
	overLimit bool
	// partialBytes sums the multi-frame messages being assembled on every
	// link; stopAfterFrame ends the read loop after the current frame (a
	// limit closed the connection). Both reader goroutine only.
	partialBytes   int
	stopAfterFrame bool

	// Lifecycle: done means "stop producing frames", kill means "the socket
	// is gone, stop waiting on it" (it also ends a hang early); ctx is the
	// parent of every link context, so canceling it unblocks every delivery
	// goroutine's broker receive. wg counts the delivery goroutines and,
	// under StrictAuth, the token-expiry watch (token_expiry.go); the writer
	// is tracked by writerDone.
	ctx    context.Context // canceled when the connection ends
	cancel context.CancelFunc
	done   chan struct{} // closed when serve starts tearing down
	kill   chan struct{} // closed by abort
	once   sync.Once     // guards done
	kOnce  sync.Once     // guards kill
	wg     sync.WaitGroup

	// mu guards the maps below and failErr, the first write error the
	// writer saw (later errors are its consequences and are not recorded).
	// Code holding mu never takes a session's mutex.
	mu         sync.Mutex
	sessions   map[uint16]*session // by channel (the emulator reuses the client's number)
	authorized map[string]grant    // lower-case entity path -> what its token grants (strict mode)
	ending     map[uint16]bool     // channels whose session the emulator ended, awaiting the client's end
	failErr    error

	// authChanged (capacity 1) wakes watchTokenExpiry after a put-token.
	authChanged chan struct{}
}

func newConn(e *Emulator, id uint64, nc net.Conn) *conn {
	// The 64 KiB read buffer holds one maximum-size frame, so ReadFrame can
	// usually fill a frame with a single read from the socket.
	ctx, cancel := context.WithCancel(context.Background())
	log := e.log.With("conn", id, "remote", nc.RemoteAddr().String())
	return &conn{
		em:          e,
		id:          id,
		nc:          nc,
		br:          bufio.NewReaderSize(nc, 64*1024),
		log:         log,
		dbg:         log.Enabled(ctx, slog.LevelDebug),
		out:         newOutbound(),
		writerDone:  make(chan struct{}),
		ctx:         ctx,
		cancel:      cancel,
		done:        make(chan struct{}),
		kill:        make(chan struct{}),
		sessions:    make(map[uint16]*session),
		authorized:  make(map[string]grant),
		authChanged: make(chan struct{}, 1),
		ending:      make(map[uint16]bool),
	}
}

// serve runs the connection to completion: handshake, frame loop, teardown.
func (c *conn) serve() {
	c.log.Info("sbemu: connection accepted")
	// teardown must know whether the writer exists: before it started there
	// is nobody to close writerDone, and waiting for it would hang forever.
	writerStarted := false
	defer func() { c.teardown(writerStarted) }()

	if err := c.handshake(); err != nil {
		c.log.Info("sbemu: handshake failed", "err", err)
		return
	}
	writerStarted = true
	go c.writeLoop()
	if c.em.cfg.StrictAuth {
		// Counted in c.wg, so teardown waits for it like for the delivery
		// goroutines; it ends with c.ctx.
		c.wg.Add(1)
		go c.watchTokenExpiry()
	}
	if c.overLimit {
		c.closeWithError(condResourceLimit, limitError("connection", c.em.cfg.Limits.MaxConnections))
		return
	}

	if err := c.readLoop(); err != nil && !isClosedErr(err) {
		c.log.Info("sbemu: connection ended", "err", err)
	}
}

// abort closes the socket at once, without a close frame, as a crashed broker
// or a network failure would. serve notices and tears the connection down.
// Safe to call from any goroutine and more than once: closing the socket
// makes the reader's blocked Read fail, which is how serve notices.
func (c *conn) abort() {
	c.kOnce.Do(func() { close(c.kill) })
	_ = c.nc.Close()
}

// fail records the first I/O error and aborts the connection.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.failErr == nil {
		c.failErr = err
	}
	c.mu.Unlock()
	c.abort()
}

// teardown stops every goroutine of the connection and hands its locked
// messages back to the broker.
// It runs on the reader goroutine after the read loop has returned, so no
// client frame can start new work meanwhile. ReleaseOwner runs only after
// c.wg.Wait, when no delivery goroutine can still take or release a
// message under this connection's owner id.
func (c *conn) teardown(writerStarted bool) {
	c.once.Do(func() { close(c.done) })
	c.cancel()
	if writerStarted {
		// Let the writer flush a final close frame, but never wait long.
		t := time.NewTimer(2 * time.Second)
		select {
		case <-c.writerDone:
		case <-t.C:
		}
		t.Stop()
	}
	_ = c.nc.Close()
	if writerStarted {
		// With the socket closed, a writer stuck in a write returns at once.
		<-c.writerDone
	}
	c.mu.Lock()
	sessions := make([]*session, 0, len(c.sessions))
	for _, s := range c.sessions {
		sessions = append(sessions, s)
	}
	c.sessions = map[uint16]*session{}
	c.mu.Unlock()
	for _, s := range sessions {
		s.shutdown()
	}
	c.wg.Wait()
	if !c.em.cfg.KeepLocksOnDisconnect {
		c.em.broker.ReleaseOwner(c.id)
	}
	c.log.Info("sbemu: connection closed")
}

// handshake exchanges protocol headers, runs SASL when the client asks for
// it and answers the client's open frame.
func (c *conn) handshake() error {
	_ = c.nc.SetDeadline(time.Now().Add(handshakeTimeout))
	defer func() { _ = c.nc.SetDeadline(time.Time{}) }()

	proto, err := wire.ReadProtocolHeader(c.br)
	if err != nil {
		return fmt.Errorf("reading protocol header: %w", err)
	}
	if !c.em.faults.WaitHang(c.kill) {
		return errConnKilled
	}
	// The hang check above also stalls new handshakes, as a broker that has
	// stopped responding would.
	if proto == wire.ProtoSASL {
		if err := c.negotiateSASL(); err != nil {
			return err
		}
		if proto, err = wire.ReadProtocolHeader(c.br); err != nil {
			return fmt.Errorf("reading protocol header after SASL: %w", err)
		}
	}
	// AMQP 1.0 section 2.2: a server that does not support the requested
	// protocol answers with the header it does support and closes the socket.
	if proto != wire.ProtoAMQP {
		_ = wire.WriteProtocolHeader(c.nc, wire.ProtoAMQP)
		return fmt.Errorf("unsupported protocol id %d", proto)
	}
	if err := wire.WriteProtocolHeader(c.nc, wire.ProtoAMQP); err != nil {
		return fmt.Errorf("writing protocol header: %w", err)
	}

	f, err := wire.ReadFrame(c.br, maxFrameSize)
	if err != nil {
		return fmt.Errorf("reading open: %w", err)
	}
	c.logFrame("rx", f)
	open, ok := f.Body.(*wire.Open)
	if !ok || f.Type != wire.FrameAMQP {
		return fmt.Errorf("expected open, got %T", f.Body)
	}
	c.containerID = open.ContainerID
	c.peerMaxFrame = open.MaxFrameSize
	if c.peerMaxFrame == 0 || c.peerMaxFrame > maxFrameSize {
		// Never send frames larger than we accept ourselves; it keeps the
		// per-frame overhead estimate honest and memory use flat.
		c.peerMaxFrame = maxFrameSize
	}
	if c.peerMaxFrame < minFrameSize {
		c.peerMaxFrame = minFrameSize
	}
	// AMQP 1.0 section 2.4.5: the peer closes the connection if it hears
	// nothing for its idle-timeout; sending an empty frame at half of it
	// leaves room for scheduling and network delay.
	if open.IdleTimeout > 0 {
		c.heartbeat = time.Duration(open.IdleTimeout) * time.Millisecond / 2
	}

	reply := &wire.Open{
		ContainerID:  fmt.Sprintf("sbemu-%d", c.id),
		Hostname:     open.Hostname,
		MaxFrameSize: maxFrameSize,
		ChannelMax:   channelMax,
	}
	if idle := c.em.cfg.IdleTimeout; idle > 0 {
		// Advertise half our real limit so a client heartbeating at half the
		// advertised value has a wide margin.
		reply.IdleTimeout = uint32(idle / 2 / time.Millisecond)
	}
	if err := c.writeDirect(wire.Frame{Type: wire.FrameAMQP, Body: reply}); err != nil {
		return fmt.Errorf("writing open: %w", err)
	}
	c.log.Info("sbemu: connection open", "container", open.ContainerID, "maxFrame", c.peerMaxFrame, "heartbeat", c.heartbeat)
	return nil
}

// writeDirect writes one frame straight to the socket; only the handshake
// uses it, before the writer goroutine exists.
func (c *conn) writeDirect(f wire.Frame) error {
	c.logFrame("tx", f)
	return wire.WriteFrame(c.nc, f)
}

// readLoop reads and dispatches frames until the peer closes the connection,
// an I/O or protocol error occurs, or the emulator aborts it.
func (c *conn) readLoop() error {
	idle := c.em.cfg.IdleTimeout
	for {
		if idle > 0 {
			// The deadline is re-armed per frame, heartbeats included, so only a
			// client that sends nothing at all for idle is disconnected.
			_ = c.nc.SetReadDeadline(time.Now().Add(idle))
		}
		f, err := wire.ReadFrame(c.br, maxFrameSize)
		if err != nil {
			return err
		}
		if !c.em.faults.WaitHang(c.kill) {
			return errConnKilled
		}
		c.logFrame("rx", f)
		// A frame read during a hang was held by waitHang above and is handled
		// now, as if it had been delayed in the network.
		if f.Type != wire.FrameAMQP {
			c.closeWithError(condFramingError, "unexpected SASL frame after open")
			return errors.New("sbemu: SASL frame after open")
		}
		stop, err := c.dispatch(f)
		if err != nil {
			return err
		}
		if stop || c.stopAfterFrame {
			return nil
		}
	}
}

// dispatch handles one AMQP frame; stop reports a graceful close.
func (c *conn) dispatch(f wire.Frame) (stop bool, err error) {
	switch body := f.Body.(type) {
	case nil:
		return false, nil // heartbeat
	case *wire.Begin:
		return false, c.handleBegin(f.Channel, body)
	// AMQP 1.0 section 2.4.3: answer a close with a close, then stop reading;
	// the writer flushes the reply during teardown.
	case *wire.Close:
		if body.Error != nil {
			c.log.Info("sbemu: client closed connection with error", "condition", body.Error.Condition, "description", body.Error.Description)
		}
		c.send(0, &wire.Close{})
		return true, nil
	case *wire.Open:
		c.closeWithError(condIllegalState, "connection already open")
		return false, errors.New("sbemu: second open frame")
	}

	s := c.session(f.Channel)
	if s == nil {
		if c.takeEnding(f.Channel, f.Body) {
			return false, nil // in flight before the client saw the emulator's end
		}
		c.closeWithError(condIllegalState, fmt.Sprintf("frame %T on unknown channel %d", f.Body, f.Channel))
		return false, fmt.Errorf("sbemu: %T on unknown channel %d", f.Body, f.Channel)
	}
	switch body := f.Body.(type) {
	case *wire.Attach:
		s.handleAttach(body)
	case *wire.Flow:
		s.handleFlow(body)
	case *wire.Transfer:
		s.handleTransfer(body)
	case *wire.Disposition:
		s.handleDisposition(body)
	case *wire.Detach:
		s.handleDetach(body)
	case *wire.End:
		c.handleEnd(s, body)
	default:
		c.closeWithError(condNotImplemented, fmt.Sprintf("unexpected frame %T", f.Body))
		return false, fmt.Errorf("sbemu: unexpected frame %T", f.Body)
	}
	return false, nil
}

// handleBegin creates a session on the client's channel and answers it.
func (c *conn) handleBegin(ch uint16, b *wire.Begin) error {
	// A begin with remote-channel set answers a begin we sent; the emulator
	// only ever responds to client-initiated sessions.
	if b.RemoteChannel != nil {
		c.closeWithError(condIllegalState, "begin with remote-channel: the emulator never begins sessions")
		return errors.New("sbemu: unsolicited begin reply")
	}
	if ch > channelMax {
		c.closeWithError(condFramingError, fmt.Sprintf("channel %d exceeds channel-max %d", ch, channelMax))
		return fmt.Errorf("sbemu: channel %d out of range", ch)
	}
	c.mu.Lock()
	if _, exists := c.sessions[ch]; exists {
		c.mu.Unlock()
		c.closeWithError(condIllegalState, fmt.Sprintf("channel %d already has a session", ch))
		return fmt.Errorf("sbemu: duplicate begin on channel %d", ch)
	}
	if limit := c.em.cfg.Limits.MaxSessionsPerConnection; len(c.sessions) >= limit {
		// Refused the way AMQP peers refuse a connection (an open followed at
		// once by a close with the error): a begin, then an end carrying the
		// error. The client's end then frees the channel, which takeEnding
		// expects.
		c.ending[ch] = true
		c.mu.Unlock()
		remote := ch
		c.send(ch, &wire.Begin{RemoteChannel: &remote, IncomingWindow: 0, OutgoingWindow: 0, HandleMax: 0})
		c.send(ch, &wire.End{Error: &wire.Error{Condition: condResourceLimit, Description: limitError("sessions per connection", limit)}})
		c.log.Info("sbemu: refusing session", "channel", ch, "limit", limit)
		return nil
	}
	s := newSession(c, ch, b)
	c.sessions[ch] = s
	c.mu.Unlock()

	// The reply goes out under s.mu so a flow or transfer for the session
	// cannot be queued before the begin that announces it.
	remote := ch
	s.mu.Lock()
	s.sendLocked(&wire.Begin{
		RemoteChannel:  &remote,
		NextOutgoingID: s.nextOutgoingID,
		IncomingWindow: sessionWindow,
		OutgoingWindow: sessionWindow,
		HandleMax:      handleMax,
	})
	s.mu.Unlock()
	return nil
}

// handleEnd ends a session at the client's request.
func (c *conn) handleEnd(s *session, e *wire.End) {
	if e.Error != nil {
		s.log.Info("sbemu: client ended session with error", "condition", e.Error.Condition, "description", e.Error.Description)
	}
	c.mu.Lock()
	delete(c.sessions, s.channel)
	c.mu.Unlock()
	s.shutdown()
	c.send(s.channel, &wire.End{})
}

// endSession ends a session from the emulator's side with an error.
func (c *conn) endSession(s *session, cond wire.Symbol, desc string) {
	s.log.Info("sbemu: ending session", "condition", cond, "description", desc)
	c.mu.Lock()
	delete(c.sessions, s.channel)
	// Frames the client sent before it saw our end must not be mistaken for
	// frames on an unknown channel (which would close the connection).
	c.ending[s.channel] = true
	c.mu.Unlock()
	s.shutdown()
	c.send(s.channel, &wire.End{Error: &wire.Error{Condition: cond, Description: desc}})
}

// takeEnding reports whether a frame on a channel without a session
// belongs to a session the emulator ended; the client's end frame closes
// that window.
func (c *conn) takeEnding(ch uint16, body any) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ending[ch] {
		return false
	}
	if _, ok := body.(*wire.End); ok {
		delete(c.ending, ch)
	}
	return true
}

// session returns the session on channel ch, or nil.
func (c *conn) session(ch uint16) *session {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sessions[ch]
}

// allSessions returns a snapshot of the live sessions.
func (c *conn) allSessions() []*session {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*session, 0, len(c.sessions))
	for _, s := range c.sessions {
		out = append(out, s)
	}
	return out
}

// send encodes a frame for channel ch and queues it for the writer.
// Encoding happens on the caller's goroutine, so the writer only copies
// bytes; the caller's locks (a session's mu) therefore also fix the order
// in which frames reach the socket.
func (c *conn) send(ch uint16, body any) {
	f := wire.Frame{Type: wire.FrameAMQP, Channel: ch, Body: body}
	buf, err := wire.AppendFrame(nil, f)
	if err != nil {
		// Only a bug in the emulator can produce an unencodable frame;
		// dropping the connection surfaces it instead of hanging the client.
		c.log.Error("sbemu: encoding frame", "type", fmt.Sprintf("%T", body), "err", err)
		c.abort()
		return
	}
	c.logFrame("tx", f)
	c.out.push(buf)
}

// closeWithError sends a close frame carrying an AMQP error; the caller then
// ends the read loop.
func (c *conn) closeWithError(cond wire.Symbol, desc string) {
	c.log.Info("sbemu: closing connection", "condition", cond, "description", desc)
	c.send(0, &wire.Close{Error: &wire.Error{Condition: cond, Description: desc}})
}

// logFrame logs a frame at debug level. Payloads and SASL responses are
// never logged: they can carry tokens and passwords.
func (c *conn) logFrame(dir string, f wire.Frame) {
	if !c.dbg {
		return
	}
	attrs := []any{"dir", dir, "channel", f.Channel, "type", frameName(f.Body)}
	switch b := f.Body.(type) {
	case *wire.Attach:
		attrs = append(attrs, "name", b.Name, "handle", b.Handle, "role", bool(b.Role), "source", sourceAddr(b.Source), "target", targetAddr(b.Target))
	case *wire.Flow:
		attrs = append(attrs, "handle", optU32(b.Handle), "deliveryCount", optU32(b.DeliveryCount), "linkCredit", optU32(b.LinkCredit), "drain", b.Drain, "echo", b.Echo, "incomingWindow", b.IncomingWindow, "nextIncomingID", optU32(b.NextIncomingID), "nextOutgoingID", b.NextOutgoingID)
	case *wire.Transfer:
		attrs = append(attrs, "handle", b.Handle, "deliveryID", optU32(b.DeliveryID), "more", b.More, "bytes", len(b.Payload))
	case *wire.Disposition:
		attrs = append(attrs, "role", bool(b.Role), "first", b.First, "last", optU32(b.Last), "settled", b.Settled, "state", frameName(b.State))
	case *wire.Detach:
		attrs = append(attrs, "handle", b.Handle, "closed", b.Closed, "error", errText(b.Error))
	case *wire.SASLInit:
		attrs = append(attrs, "mechanism", b.Mechanism) // never the initial response
	}
	c.log.Debug("sbemu: frame", attrs...)
}

// frameName is the short type name of a performative for logs.
func frameName(v any) string {
	if v == nil {
		return "empty"
	}
	return strings.TrimPrefix(fmt.Sprintf("%T", v), "*wire.")
}

// optU32 renders an optional uint32 field for logs: nil stays nil rather
// than becoming a misleading 0.
func optU32(p *uint32) any {
	if p == nil {
		return nil
	}
	return *p
}

// errText renders an AMQP error for a log attribute; "" when absent.
func errText(e *wire.Error) string {
	if e == nil {
		return ""
	}
	return string(e.Condition) + ": " + e.Description
}

// sourceAddr and targetAddr return a terminus address, "" for a nil
// terminus, which a refused attach reply legitimately has.
func sourceAddr(s *wire.Source) string {
	if s == nil {
		return ""
	}
	return s.Address
}

func targetAddr(t *wire.Target) string {
	if t == nil {
		return ""
	}
	return t.Address
}

// errConnKilled reports that the emulator aborted the connection.
var errConnKilled = errors.New("sbemu: connection aborted")

// isClosedErr reports errors that just mean "the other side went away".
func isClosedErr(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, errConnKilled) ||
		// io.ErrUnexpectedEOF: the client vanished in the middle of a frame.
		errors.Is(err, io.ErrUnexpectedEOF)
}
