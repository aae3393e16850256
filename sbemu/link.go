package sbemu

import (
	"context"
	"log/slog"
	"sync"

	"github.com/sbretry/retry/sbemu/broker"
	"github.com/sbretry/retry/sbemu/internal/wire"
)

// linkCredit is the credit the emulator grants a client sender, topped up
// whenever half of it has been used.
// 1000 matches the credit the SDK itself grants on its management links;
// it bounds how many messages one client sender can have in flight.
const linkCredit = 1000

// maxAssembledMessage bounds a multi-frame message being reassembled, so a
// misbehaving client cannot make the emulator buffer without limit; queues
// configured for larger messages raise it to twice their limit. The queue
// then rejects anything above its own MaxMessageSize.
const maxAssembledMessage = 16 << 20

// link is one attached link. Which half of its state is used depends on
// kind: *In links receive transfers on the reader goroutine; *Out links
// send through their own delivery goroutine.
type link struct {
	// The fields up to cancel are set in handleAttach before the link is
	// registered in the session and are read-only afterwards.
	s         *session
	attach    *wire.Attach // the client's attach, for its termini and modes
	name      string
	inHandle  uint32 // the client's handle
	outHandle uint32 // the emulator's handle
	path      string // entity path from the address
	log       *slog.Logger

	kind      linkKind
	queue     *broker.Queue // queue links and management nodes
	node      string        // cbsNode or managementSuffix for request/response links
	replyAddr string        // kindReplyOut: the client's reply-to address
	maxSize   int           // queue links: largest message accepted, in bytes
	needs     rights        // what a token must grant for the link to stay attached (rights.go)

	// ctx is derived from the connection's context and canceled by stop or
	// forceDetach; it ends the delivery goroutine and any transfer waiting
	// for session window.
	ctx    context.Context
	cancel context.CancelFunc

	// Receiving side (kindQueueIn, kindRequestIn); reader goroutine only,
	// except credit which the session reads under s.mu.
	// rxDeliveryCount and rxCredit follow section 2.6.7: the emulator is the
	// receiver, the count starts at the client's initial-delivery-count.
	rxDeliveryCount uint32
	rxCredit        uint32
	rxBusy          bool   // a multi-frame delivery is being assembled
	rxDeliveryID    uint32 // delivery id of the message being assembled
	rxSettled       bool   // the client sent it pre-settled
	rxFormat        uint32 // message-format of the message being assembled
	rxBuf           []byte
	rxCounted       int // bytes of rxBuf charged to the connection's partial-message budget

	// Sending side (kindQueueOut, kindReplyOut).
	// mu guards the fields below; it is the innermost lock (taken under s.mu,
	// never the other way round). txDeliveryCount and txCredit are the
	// sender-side delivery-count and link-credit of section 2.6.7; drain is
	// the client's last drain flag.
	mu              sync.Mutex
	txDeliveryCount uint32
	txCredit        uint32
	drain           bool
	wake            chan struct{}      // capacity 1: credit or drain changed
	recvCancel      context.CancelFunc // cancels a blocked broker receive
	detachSent      bool               // the emulator detached the link
	stopped         bool
	replies         *replyOutbox // kindReplyOut only

	// sessionLock is a session receiver's lock (sessions.go), set before
	// the link is registered and read-only afterwards; nil otherwise.
	sessionLock *broker.SessionLock
}

func newLink(s *session, a *wire.Attach, out uint32, path string) *link {
	// wake has capacity 1 so signal never blocks the reader and several
	// signals before the goroutine runs collapse into one wakeup.
	ctx, cancel := context.WithCancel(s.c.ctx)
	l := &link{
		s:         s,
		attach:    a,
		name:      a.Name,
		inHandle:  a.Handle,
		outHandle: out,
		path:      path,
		log:       s.log.With("link", a.Name, "address", path),
		ctx:       ctx,
		cancel:    cancel,
		wake:      make(chan struct{}, 1),
	}
	if a.InitialDeliveryCount != nil {
		l.rxDeliveryCount = *a.InitialDeliveryCount
	}
	return l
}

// preSettled reports whether the client asked for pre-settled transfers
// (snd-settle-mode settled), as receive-and-delete receivers and the SDK's
// reply links do.
func (l *link) preSettled() bool {
	return l.attach.SndSettleMode != nil && *l.attach.SndSettleMode == sndSettled
}

// sndSettled is the sender-settle-mode "settled" (AMQP 1.0 section 2.8.2):
// the sender settles every transfer before sending it.
const sndSettled uint8 = 1

// grantCreditLocked (re)issues full credit to a client sender; s.mu must
// be held.
// Credit is absolute in AMQP (delivery-count plus credit is the limit),
// so re-issuing the full amount both replenishes and resynchronises.
func (l *link) grantCreditLocked() {
	l.rxCredit = linkCredit
	l.flowLocked(l.rxDeliveryCount, l.rxCredit, false)
}

// handleFlow applies a client's link flow. For a link the emulator sends
// on, it recomputes the credit (delivery-count(rcv) + link-credit(rcv) -
// delivery-count(snd)) and wakes the delivery goroutine; drain or zero
// credit also interrupts a blocked broker receive so the goroutine can
// react. An echo request is answered with the link's state.
func (l *link) handleFlow(f *wire.Flow) {
	switch l.kind {
	// On links where the client sends, the client's flow only reports its
	// own state; credit is ours to give, so only echo needs an answer.
	case kindQueueIn, kindRequestIn:
		if f.Echo {
			l.s.mu.Lock()
			l.flowLocked(l.rxDeliveryCount, l.rxCredit, false)
			l.s.mu.Unlock()
		}
		return
	}

	l.mu.Lock()
	if f.LinkCredit != nil {
		var dc uint32 // the initial delivery count the emulator announced
		if f.DeliveryCount != nil {
			dc = *f.DeliveryCount
		}
		// Deliveries we sent that the client had not seen when it wrote this
		// flow are subtracted, so credit is never overspent (section 2.6.7).
		l.txCredit = windowFrom(*f.LinkCredit, dc, l.txDeliveryCount)
	}
	l.drain = f.Drain
	var cancel context.CancelFunc
	if l.txCredit == 0 || l.drain {
		// A delivery goroutine blocked in the broker has no credit to spend the
		// message on (zero credit) or must answer the drain now; canceling its
		// receive makes it return to the credit check without taking a message.
		cancel = l.recvCancel
	}
	echo := f.Echo
	dc, credit := l.txDeliveryCount, l.txCredit
	l.mu.Unlock()

	if cancel != nil {
		cancel()
	}
	l.signal()
	if echo {
		l.s.mu.Lock()
		l.flowLocked(dc, credit, false)
		l.s.mu.Unlock()
	}
}

// signal wakes the delivery goroutine.
func (l *link) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// handleTransfer assembles one frame of a client transfer; when the message
// is complete it is processed and, unless the client pre-settled it,
// answered with a settled disposition. Credit is topped up at half use.
func (l *link) handleTransfer(t *wire.Transfer) {
	if l.kind != kindQueueIn && l.kind != kindRequestIn {
		l.forceDetach(condNotAllowed, "sbemu: transfer on a link the emulator sends on")
		return
	}
	l.s.mu.Lock()
	active := l.activeLocked()
	l.s.mu.Unlock()
	if !active {
		// Sent before the client saw the emulator's detach. Storing it
		// without being able to acknowledge it would make the SDK send it
		// again on its new link: a duplicate. Drop it; the retry delivers.
		return
	}
	// The first frame of a delivery carries its id, settled flag and
	// format (section 2.7.5); continuation frames only add payload.
	if !l.rxBusy {
		if t.DeliveryID == nil {
			l.forceDetach(condNotAllowed, "sbemu: first transfer of a delivery without delivery-id")
			return
		}
		l.rxBusy = true
		l.rxDeliveryID = *t.DeliveryID
		l.rxSettled = false
		l.rxFormat = 0
		if t.MessageFormat != nil {
			l.rxFormat = *t.MessageFormat
		}
		l.rxBuf = nil
	}
	if t.Settled != nil && *t.Settled {
		l.rxSettled = true
	}
	// An aborted delivery (section 2.7.5) is discarded but still used up a
	// delivery count and a credit.
	if t.Aborted {
		l.dropPartial()
		l.countDelivery()
		return
	}
	// The limit is checked while assembling, so an oversized multi-frame
	// message is refused before it is fully buffered.
	if len(l.rxBuf)+len(t.Payload) > max(maxAssembledMessage, 2*l.maxSize) {
		l.dropPartial()
		l.forceDetach(condMessageSizeExceded, "sbemu: message exceeds the emulator's assembly limit")
		return
	}
	if !t.More && l.rxBuf == nil {
		// Single-frame message, the common case: ReadFrame allocated the
		// payload for this frame alone, so it can be used without a copy.
		l.rxBuf = t.Payload
	} else {
		// Only bytes held across frames count towards the connection's
		// partial-message budget.
		c := l.s.c
		c.partialBytes += len(t.Payload)
		l.rxCounted += len(t.Payload)
		if limit := c.em.cfg.Limits.MaxPartialMessageBytesPerConnection; c.partialBytes > limit {
			l.dropPartial()
			c.closeWithError(condResourceLimit, limitError("partial-message bytes per connection", limit))
			// Closing the socket after the close frame ends the read loop; the
			// client may keep sending meanwhile, which is ignored.
			c.stopAfterFrame = true
			return
		}
		l.rxBuf = append(l.rxBuf, t.Payload...)
	}
	if t.More {
		return
	}
	payload, id, settled, format := l.rxBuf, l.rxDeliveryID, l.rxSettled, l.rxFormat
	l.dropPartial()

	var state wire.DeliveryState
	if l.kind == kindQueueIn {
		state = l.acceptTransfer(payload, format)
	} else {
		l.handleRequest(payload)
		state = &wire.Accepted{}
	}
	// Unsettled client transfers get a settled disposition back: the SDK
	// sends in snd-settle-mode mixed with rcv-settle-mode first, so its
	// SendMessage returns once this outcome arrives. With persistence it
	// waits until the message is on disk (see durable.go).
	if !settled {
		if em := l.s.c.em; em.persistent {
			em.broker.AfterSync(func(err error) { l.answerTransfer(id, durableOutcome(state, err)) })
		} else {
			l.answerTransfer(id, state)
		}
	}
	l.countDelivery()
}

// answerTransfer sends the settled disposition of a client's transfer,
// unless the link has gone meanwhile.
func (l *link) answerTransfer(id uint32, state wire.DeliveryState) {
	l.s.mu.Lock()
	if l.activeLocked() {
		l.s.sendLocked(&wire.Disposition{Role: wire.RoleReceiver, First: id, Settled: true, State: state})
	}
	l.s.mu.Unlock()
}

// dropPartial forgets the message being assembled and gives its bytes back
// to the connection's partial-message budget; reader goroutine only.
func (l *link) dropPartial() {
	l.s.c.partialBytes -= l.rxCounted
	l.rxCounted = 0
	l.rxBusy = false
	l.rxBuf = nil
}

// countDelivery advances the link's delivery count after a complete (or
// aborted) delivery and tops up credit when half of it is used.
func (l *link) countDelivery() {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	// rxCredit never goes below zero even if a client oversends; the
	// top-up below then restores the full amount.
	l.rxDeliveryCount++
	if l.rxCredit > 0 {
		l.rxCredit--
	}
	if l.rxCredit <= linkCredit/2 {
		l.grantCreditLocked()
	}
}

// stop ends the link's goroutine (if any); it reports whether the emulator
// had already sent its own detach.
func (l *link) stop() (detachSent bool) {
	l.mu.Lock()
	l.stopped = true
	detachSent = l.detachSent
	l.mu.Unlock()
	// Canceling the context ends the delivery goroutine; removing the
	// link from its session is the caller's job.
	l.cancel()
	return detachSent
}

// forceDetach detaches the link from the emulator's side with an error, as
// Service Bus does on entity updates or idle links. The link stays
// registered until the client's detach arrives, so its handle cannot be
// reused early. Nothing else is sent on the link afterwards: a frame for a
// handle the client has already released would make it end the session.
//
// It may be called from any goroutine (fault injection and token expiry
// call it from outside the reader): a link whose session has ended, or
// that is no longer registered, gets no detach, since a frame for a
// session the client has ended would make it close the connection.
func (l *link) forceDetach(cond wire.Symbol, desc string) {
	l.s.mu.Lock()
	if !l.activeLocked() {
		l.s.mu.Unlock()
		return
	}
	l.mu.Lock()
	l.detachSent = true
	l.mu.Unlock()
	// The detach goes out under s.mu so no later transfer of this link can
	// be queued behind it: transmit checks activeLocked under the same lock.
	l.s.sendLocked(&wire.Detach{Handle: l.outHandle, Closed: true, Error: &wire.Error{Condition: cond, Description: desc}})
	l.s.mu.Unlock()
	l.cancel()
	l.log.Info("sbemu: detached link", "condition", cond)
}

// activeLocked reports whether frames may still be sent for the link: it is
// registered and neither side has detached it. s.mu must be held.
// The registration check catches a link object that lost its handle to a
// newer link with the same client handle after a detach.
func (l *link) activeLocked() bool {
	if l.s.ended || l.s.links[l.inHandle] != l {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.detachSent && !l.stopped
}

// flowLocked sends a link flow frame if the link is still active; s.mu
// must be held.
func (l *link) flowLocked(deliveryCount, credit uint32, drain bool) {
	if !l.activeLocked() {
		return
	}
	handle := l.outHandle
	l.s.flowLocked(&wire.Flow{Handle: &handle, DeliveryCount: &deliveryCount, LinkCredit: &credit, Drain: drain})
}
