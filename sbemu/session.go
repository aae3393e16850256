package sbemu

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"

	"github.com/sbretry/retry/sbemu/broker"
	"github.com/sbretry/retry/sbemu/internal/wire"
)

// Session flow-control settings.
const (
	// sessionWindow is the incoming window the emulator advertises. It is
	// re-advertised whenever half of it has been used, so a client can send
	// any number of transfers without stalling.
	// 5000 keeps flow frames rare (one per 2500 transfers) while staying far
	// below the 2^31 limit of serial-number arithmetic on transfer ids.
	sessionWindow = 5000
	// handleMax is the highest link handle the emulator accepts per session.
	// The SDK uses a handful of handles per session, so the value only
	// matters for clients that misbehave: a larger handle ends the session
	// with amqp:session:handle-in-use (see handleAttach).
	handleMax = 4095
)

// errSessionEnded reports an operation on a session that has ended.
var errSessionEnded = errors.New("sbemu: session ended")

// errLinkDetached reports a send on a link that has been detached.
var errLinkDetached = errors.New("sbemu: link detached")

// session is one AMQP session. The emulator uses the client's channel number
// for its own half of the session too. mu guards every field below it; the
// encoded frames are pushed to the connection's outbound queue while mu is
// held, so the transfer ids and flow state on the wire are always consistent
// with the frames already sent.
type session struct {
	c       *conn
	channel uint16
	log     *slog.Logger

	// Lock order: s.mu before link.mu (see forceDetach and drainNow); c.mu is
	// never taken while s.mu is held.
	mu sync.Mutex

	// Incoming direction (client to emulator).
	nextIncomingID uint32 // transfer id expected next
	incomingUsed   uint32 // transfers received since the window was last advertised

	// Outgoing direction (emulator to client).
	// nextOutgoingID is the transfer id of the next transfer frame we send
	// (AMQP 1.0 section 2.5.6); remoteIncomingWindow is how many more transfer
	// frames the client will accept, recomputed from every client flow and
	// decremented per frame (not per message) in transmit. nextDeliveryID
	// numbers messages and is independent of transfer ids, which count frames.
	nextOutgoingID       uint32
	remoteIncomingWindow uint32
	windowGrew           chan struct{} // closed and replaced when the client opens its window
	nextDeliveryID       uint32
	unsettled            map[uint32]*sentDelivery // peek-lock deliveries awaiting the client's disposition

	// Client handles key links because every frame from the client names the
	// client's handle; our own handles are only written, never looked up.
	links   map[uint32]*link // by the client's handle
	handles map[uint32]bool  // the emulator's handles in use
	// pending holds the client handles of session receivers still waiting
	// for a session (sessions.go); they count against MaxLinksPerSession.
	pending map[uint32]bool
	ended   bool
}

// sentDelivery remembers which lock a delivery id refers to, so the client's
// disposition can be applied to the right broker message.
type sentDelivery struct {
	// link identifies the sending link so its deliveries can be forgotten on
	// detach; queue and token address the broker lock (the token in RFC 4122
	// order, not the .NET order used on the wire).
	link  *link
	queue *broker.Queue
	token [16]byte
}

func newSession(c *conn, ch uint16, b *wire.Begin) *session {
	// Our incoming side starts at the client's next-outgoing-id and our
	// outgoing window at the client's incoming-window, as section 2.5.5
	// prescribes for the begin exchange; our own transfer ids start at 0.
	return &session{
		c:                    c,
		channel:              ch,
		log:                  c.log.With("channel", ch),
		nextIncomingID:       b.NextOutgoingID,
		remoteIncomingWindow: b.IncomingWindow,
		windowGrew:           make(chan struct{}),
		unsettled:            make(map[uint32]*sentDelivery),
		links:                make(map[uint32]*link),
		handles:              make(map[uint32]bool),
	}
}

// sendLocked queues a frame on this session's channel; s.mu must be held so
// the frame is ordered with respect to transfers.
func (s *session) sendLocked(body any) {
	s.c.send(s.channel, body)
}

// send queues a non-transfer frame that carries no session state
// (attach, detach, disposition).
// Use sendLocked instead when the frame must be ordered with state
// changed under the same critical section.
func (s *session) send(body any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sendLocked(body)
}

// flowLocked fills in the session fields of a flow frame and queues it.
// Every flow re-advertises the full incoming window, so the count of
// transfers since the last advertisement starts again. s.mu must be held.
func (s *session) flowLocked(f *wire.Flow) {
	next := s.nextIncomingID
	f.NextIncomingID = &next
	f.IncomingWindow = sessionWindow
	f.NextOutgoingID = s.nextOutgoingID
	f.OutgoingWindow = sessionWindow
	// After this flow the client may send sessionWindow more transfers, so
	// the count towards the next re-advertisement restarts.
	s.incomingUsed = 0
	s.sendLocked(f)
}

// windowFrom computes "peer's count + peer's window - our count" for the
// session window and for link credit. The counts are RFC 1982 serial
// numbers that wrap at 2^32, so their difference is taken as a signed
// 32-bit value: normally zero or negative (the peer has not seen all that
// was sent yet), which shrinks the window. The result is clamped to
// [0, 2^32-1], so a peer that advertises "unlimited" (2^32-1) keeps it.
func windowFrom(window, peerCount, ourCount uint32) uint32 {
	w := int64(window) + int64(int32(peerCount-ourCount))
	switch {
	case w < 0:
		return 0
	case w > math.MaxUint32:
		return math.MaxUint32
	}
	return uint32(w)
}

// allocateHandleLocked returns the lowest free output handle; s.mu must be
// held.
func (s *session) allocateHandleLocked() uint32 {
	// Termination: handleMax bounds the client's handles and each link takes
	// one of ours, so a free handle exists below handleMax+1.
	for h := uint32(0); ; h++ {
		if !s.handles[h] {
			s.handles[h] = true
			return h
		}
	}
}

// handleFlow updates the outgoing window from a client flow frame and hands
// link-level flow to the link.
func (s *session) handleFlow(f *wire.Flow) {
	s.mu.Lock()
	// remote-incoming-window = next-incoming-id(flow) + incoming-window(flow)
	//                          - next-outgoing-id(endpoint); an absent
	// next-incoming-id means the initial outgoing id, 0.
	var base uint32
	if f.NextIncomingID != nil {
		base = *f.NextIncomingID
	}
	s.remoteIncomingWindow = windowFrom(f.IncomingWindow, base, s.nextOutgoingID)
	// Wake every delivery goroutine blocked in waitWindowLocked, even when
	// the window did not grow: each re-checks its own condition.
	close(s.windowGrew)
	s.windowGrew = make(chan struct{})
	var l *link
	if f.Handle != nil {
		l = s.links[*f.Handle]
	} else if f.Echo {
		// A session-only flow with echo asks for our session state (section
		// 2.7.4); a link flow's echo is answered by the link with its own state.
		s.flowLocked(&wire.Flow{})
	}
	s.mu.Unlock()

	if f.Handle != nil {
		if l == nil {
			s.log.Debug("sbemu: flow for unknown handle", "handle", *f.Handle)
			return
		}
		l.handleFlow(f)
	}
}

// handleTransfer accounts a transfer against the incoming window and passes
// it to its link.
func (s *session) handleTransfer(t *wire.Transfer) {
	s.mu.Lock()
	// Every transfer frame counts, also continuation frames of a multi-frame
	// delivery and frames for unknown handles, because the client counted
	// them against our window too.
	s.nextIncomingID++
	s.incomingUsed++
	l := s.links[t.Handle]
	// Re-advertising at half use keeps a fast sender from ever reaching a
	// zero window: without it the SDK stalls after sessionWindow transfers.
	if s.incomingUsed >= sessionWindow/2 {
		s.flowLocked(&wire.Flow{})
	}
	s.mu.Unlock()
	if l == nil {
		s.log.Debug("sbemu: transfer for unknown handle", "handle", t.Handle)
		return
	}
	l.handleTransfer(t)
}

// handleDetach ends a link at the client's request, or completes a detach
// the emulator started.
func (s *session) handleDetach(d *wire.Detach) {
	s.mu.Lock()
	l := s.links[d.Handle]
	if l != nil {
		delete(s.links, d.Handle)
		delete(s.handles, l.outHandle)
		s.forgetDeliveriesLocked(l)
	}
	s.mu.Unlock()
	if l != nil {
		// A half-assembled message dies with its link; its bytes no longer
		// count against the connection.
		l.dropPartial()
	}
	if l == nil {
		s.log.Debug("sbemu: detach for unknown handle", "handle", d.Handle)
		return
	}
	if d.Error != nil {
		l.log.Info("sbemu: client detached link with error", "condition", d.Error.Condition, "description", d.Error.Description)
	}
	// If the emulator detached first (forceDetach), the client's detach is
	// the reply and needs no answer; otherwise the client expects one.
	alreadySent := l.stop()
	// A session receiver's session is free, and its unsettled messages
	// back in it, by the time the client reads the reply ("The lock is
	// released when you call the close related methods on the receiver",
	// message-sessions.md), so a receiver accepting the session right after
	// a Close returned gets it. The delivery goroutine's own release, when
	// it ends, then finds nothing to do.
	if l.sessionLock != nil {
		l.sessionLock.Release()
	}
	if !alreadySent {
		s.send(&wire.Detach{Handle: l.outHandle, Closed: true})
	}
	l.log.Debug("sbemu: link detached")
}

// forgetDeliveriesLocked drops the delivery-id bookkeeping of a detached
// link. The broker keeps the locks: the SDK settles such messages through
// the management link by lock token. s.mu must be held.
func (s *session) forgetDeliveriesLocked(l *link) {
	for id, d := range s.unsettled {
		if d.link == l {
			delete(s.unsettled, id)
		}
	}
}

// shutdown stops every link of the session (the connection or the session
// is ending) and wakes goroutines waiting for window.
func (s *session) shutdown() {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended = true
	links := make([]*link, 0, len(s.links))
	for _, l := range s.links {
		links = append(links, l)
	}
	// Dropping the links and unsettled deliveries makes every activeLocked
	// check fail from now on, so no further frame is queued for this
	// session; the locks stay in the broker until the connection ends or
	// they expire.
	s.links = map[uint32]*link{}
	s.unsettled = map[uint32]*sentDelivery{}
	close(s.windowGrew)
	s.windowGrew = make(chan struct{})
	s.mu.Unlock()
	for _, l := range links {
		l.stop()
		// shutdown runs on the reader goroutine (client end, session error,
		// connection teardown), which owns the assembly state.
		l.dropPartial()
	}
}

// transmit sends one message on link l as one or more transfer frames,
// waiting for the client's session window as needed. A non-nil track is
// recorded under the new delivery id before the first frame is queued, so
// the client's disposition always finds it.
func (s *session) transmit(ctx context.Context, l *link, payload, tag []byte, settled bool, track *sentDelivery) error {
	// peerMaxFrame is at least minFrameSize (512), so maxChunk is positive.
	maxChunk := int(s.c.peerMaxFrame) - transferOverhead
	first := true
	// The loop runs at least once so an empty payload still produces one
	// transfer. Each frame waits for window separately: a large message can
	// span a window re-advertisement by the client.
	limit := s.c.em.cfg.Limits.MaxOutgoingBytesPerConnection
	for first || len(payload) > 0 {
		// Back-pressure before the session window: a client that grants
		// more than it reads makes this transfer wait, not the queue grow.
		if err := s.c.out.waitRoom(ctx, s.c.done, limit); err != nil {
			return err
		}
		if err := s.waitWindowLocked(ctx); err != nil {
			return err
		}
		// s.mu is held from here.
		// Checked per frame: once either side has detached the link, a frame for
		// its handle would be a protocol error on the client.
		if !l.activeLocked() {
			s.mu.Unlock()
			return errLinkDetached
		}
		chunk := payload
		if len(chunk) > maxChunk {
			chunk = chunk[:maxChunk]
		}
		payload = payload[len(chunk):]
		t := &wire.Transfer{
			Handle:  l.outHandle,
			More:    len(payload) > 0,
			Payload: chunk,
		}
		if first {
			id := s.nextDeliveryID
			s.nextDeliveryID++
			// Delivery-id, message-format and delivery-tag go only on the first
			// frame of a delivery (section 2.7.5); go-amqp cannot route a first frame
			// that lacks them. Format 0 is a plain AMQP message.
			format := uint32(0)
			t.DeliveryID = &id
			t.DeliveryTag = tag
			t.MessageFormat = &format
			if track != nil {
				s.unsettled[id] = track
			}
		}
		if settled {
			t.Settled = &settled
		}
		s.sendLocked(t)
		s.nextOutgoingID++
		s.remoteIncomingWindow--
		// Releasing s.mu between frames lets disposition and flow handling
		// (and other links of the session) interleave with a long
		// multi-frame send.
		s.mu.Unlock()
		first = false
	}
	return nil
}

// transferOverhead bounds the bytes of a transfer frame that are not
// payload: the 8-byte frame header plus the encoded performative with a
// 16-byte delivery tag, which needs well under 100 bytes.
const transferOverhead = 256

// waitWindowLocked blocks until the client's incoming window has room and
// returns with s.mu held; on error s.mu is not held.
func (s *session) waitWindowLocked(ctx context.Context) error {
	for {
		s.mu.Lock()
		if s.ended {
			s.mu.Unlock()
			return errSessionEnded
		}
		if s.remoteIncomingWindow > 0 {
			return nil
		}
		// The channel is read under s.mu, so a flow arriving after the unlock
		// closes exactly this channel and the wakeup cannot be missed.
		grew := s.windowGrew
		s.mu.Unlock()
		select {
		case <-grew:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
