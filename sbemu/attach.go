package sbemu

import (
	"fmt"
	"strings"

	"github.com/sbretry/retry/sbemu/broker"
	"github.com/sbretry/retry/sbemu/internal/wire"
)

// Node addresses with special meaning.
const (
	// cbsNode is matched case-insensitively and is connection-wide;
	// managementSuffix follows an entity path and addresses that entity's
	// request/response node.
	cbsNode          = "$cbs"
	managementSuffix = "/$management"
)

// linkKind says what a link carries and in which direction.
type linkKind int

const (
	// kindQueueIn: the client sends messages to a queue.
	kindQueueIn linkKind = iota
	// kindQueueOut: the client receives messages from a queue (or its DLQ).
	kindQueueOut
	// kindRequestIn: the client sends requests to "$cbs" or "<entity>/$management".
	kindRequestIn
	// kindReplyOut: the client receives replies from "$cbs" or "<entity>/$management".
	kindReplyOut
)

// String names the kind for logs.
func (k linkKind) String() string {
	switch k {
	case kindQueueIn:
		return "queue-in"
	case kindQueueOut:
		return "queue-out"
	case kindRequestIn:
		return "request-in"
	case kindReplyOut:
		return "reply-out"
	}
	return fmt.Sprintf("linkKind(%d)", int(k))
}

// entityPath reduces a terminus address to an entity path: the SDK sends
// plain paths ("orders", "orders/$management"), other clients sometimes
// send full URLs ("amqp://host/orders").
func entityPath(addr string) string {
	if i := strings.Index(addr, "://"); i >= 0 {
		rest := addr[i+3:]
		if j := strings.IndexByte(rest, '/'); j >= 0 {
			addr = rest[j+1:]
		} else {
			addr = ""
		}
	}
	return strings.TrimPrefix(addr, "/")
}

// cbsLinkOpen reports whether a link to "$cbs" in the direction role
// (the client's role) is attached on the connection. Service Bus allows
// one sender and one receiver on "$cbs" per connection: the Go SDK
// serialises its claims for that reason ("You're not allowed to have
// multiple $cbs links open in a single connection", azservicebus v1.11.0
// internal/namespace.go) and answers amqp:not-allowed on the $cbs attach
// by resetting the connection (internal/cbs.go, NegotiateClaim), which its
// live test TestAMQPLinksCBSLinkStillOpen checks. Attaches are handled on
// the connection's reader goroutine, so two cannot race past this check.
func (c *conn) cbsLinkOpen(role wire.Role) bool {
	for _, s := range c.allSessions() {
		s.mu.Lock()
		for _, l := range s.links {
			if l.node == cbsNode && l.attach.Role == role {
				s.mu.Unlock()
				return true
			}
		}
		s.mu.Unlock()
	}
	return false
}

// handleAttach answers a client's attach: it resolves the address to a
// queue or a request/response node, echoes the requested settle modes and
// starts the link. Unknown entities are refused the AMQP way: an attach
// reply with a nil terminus followed by a detach carrying amqp:not-found.
func (s *session) handleAttach(a *wire.Attach) {
	// The entity is named by the terminus the emulator plays: the target
	// when the client sends, the source when it receives.
	clientSends := a.Role == wire.RoleSender
	var addr string
	if clientSends {
		addr = targetAddr(a.Target)
	} else {
		addr = sourceAddr(a.Source)
	}
	path := entityPath(addr)

	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	if _, dup := s.links[a.Handle]; dup || s.pending[a.Handle] || a.Handle > handleMax {
		s.mu.Unlock()
		// A session error: the handle cannot be answered on without
		// confusing the link that owns it.
		s.c.endSession(s, condHandleInUse, fmt.Sprintf("sbemu: handle %d is in use or above handle-max %d", a.Handle, handleMax))
		return
	}
	// The handle is reserved before resolve runs outside the lock, so a
	// concurrent attach cannot take it; refuseAttach gives it back.
	out := s.allocateHandleLocked()
	tooMany := len(s.links)+len(s.pending) >= s.c.em.cfg.Limits.MaxLinksPerSession
	s.mu.Unlock()
	if tooMany {
		limit := s.c.em.cfg.Limits.MaxLinksPerSession
		s.log.Info("sbemu: refusing attach", "address", path, "condition", condResourceLimit, "limit", limit)
		s.refuseAttach(a, out, condResourceLimit, limitError("links per session", limit))
		return
	}

	l := newLink(s, a, out, path)
	cond, desc := l.resolve(clientSends)
	if cond != "" {
		s.log.Info("sbemu: refusing attach", "address", path, "condition", cond)
		s.refuseAttach(a, out, cond, desc)
		return
	}
	// A receiver on a session-aware entity attaches once it has a session
	// lock, which may mean waiting for one (sessions.go).
	if l.kind == kindQueueOut && s.attachSession(l) {
		return
	}
	s.completeAttach(l)
}

// completeAttach sends the attach reply of a resolved link, registers it
// and starts it.
func (s *session) completeAttach(l *link) {
	a, out := l.attach, l.outHandle
	clientSends := a.Role == wire.RoleSender
	// The SDK checks that the reply echoes the settle modes it asked for
	// and fails the link otherwise; source and target must be non-nil for
	// the same reason.
	reply := &wire.Attach{
		Name:          a.Name,
		Handle:        out,
		Role:          !a.Role,
		SndSettleMode: a.SndSettleMode,
		RcvSettleMode: a.RcvSettleMode,
		Source:        a.Source,
		Target:        a.Target,
	}
	if reply.Source == nil {
		reply.Source = &wire.Source{}
	}
	if reply.Target == nil {
		reply.Target = &wire.Target{}
	}
	if clientSends {
		if l.queue != nil {
			// Announcing max-message-size lets the SDK refuse an oversized message
			// before sending it.
			max := uint64(l.maxSize)
			reply.MaxMessageSize = &max
		}
	} else {
		// Section 2.7.3: the sending end must announce its initial
		// delivery count; the emulator's sender side always starts at 0.
		zero := uint32(0)
		reply.InitialDeliveryCount = &zero
		if l.sessionLock != nil {
			decorateSessionAttach(reply, l)
		}
	}

	s.mu.Lock()
	// The session can end while resolve ran unlocked (or a session
	// receiver waited for a session); registering the link then would leak
	// its handle and goroutine. A second attach on the same handle while
	// one waited is refused the same way.
	if _, dup := s.links[a.Handle]; s.ended || dup {
		s.mu.Unlock()
		if l.sessionLock != nil {
			l.sessionLock.Release()
		}
		return
	}
	s.links[a.Handle] = l
	s.sendLocked(reply)
	if clientSends {
		// A client sender can send nothing until it has credit, so credit goes
		// out right behind the attach reply, under the same lock.
		l.grantCreditLocked()
	}
	s.mu.Unlock()
	l.log.Debug("sbemu: link attached", "kind", l.kind.String())

	if !clientSends {
		// Started only after registration, so the delivery goroutine's first
		// activeLocked check sees the link.
		l.startDelivering()
	}
}

// refuseAttach answers an attach that cannot be served and releases the
// output handle out again.
func (s *session) refuseAttach(a *wire.Attach, out uint32, cond wire.Symbol, desc string) {
	reply := &wire.Attach{
		Name:          a.Name,
		Handle:        out,
		Role:          !a.Role,
		SndSettleMode: a.SndSettleMode,
		RcvSettleMode: a.RcvSettleMode,
	}
	// The terminus the client asked us to play stays nil: that is how AMQP
	// says "not attached, a detach with the reason follows".
	if a.Role == wire.RoleSender {
		reply.Source = a.Source
	} else {
		reply.Target = a.Target
		zero := uint32(0)
		reply.InitialDeliveryCount = &zero
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		// A session receiver that waited for a session: nothing may be
		// sent on a session the client has ended.
		return
	}
	s.sendLocked(reply)
	s.sendLocked(&wire.Detach{Handle: out, Closed: true, Error: &wire.Error{Condition: cond, Description: desc}})
	delete(s.handles, out)
}

// resolve binds the link to its queue or node. It returns a non-empty
// condition when the attach must be refused.
func (l *link) resolve(clientSends bool) (wire.Symbol, string) {
	b := l.s.c.em.broker
	lower := strings.ToLower(l.path)
	switch {
	case lower == cbsNode:
		if l.s.c.cbsLinkOpen(l.attach.Role) {
			return condNotAllowed, "sbemu: a $cbs link in this direction is already open on this connection; Service Bus allows one sender and one receiver on $cbs per connection"
		}
		l.node = cbsNode
	case strings.HasSuffix(lower, managementSuffix):
		entity := l.path[:len(l.path)-len(managementSuffix)]
		q, ok := b.Queue(entity)
		if !ok {
			return condNotFound, fmt.Sprintf("sbemu: the messaging entity %q could not be found", entity)
		}
		l.node = managementSuffix
		l.queue = q
	default:
		q, ok := b.Queue(l.path)
		if !ok {
			return condNotFound, fmt.Sprintf("sbemu: the messaging entity %q could not be found", l.path)
		}
		l.queue = q
	}
	if l.queue != nil {
		l.maxSize = l.queue.MaxMessageSize()
		// Service Bus delivers from subscriptions and accepts sends at topics;
		// the other directions cannot work, so they are refused at attach
		// rather than failing every later transfer.
		if l.node == "" && !clientSends && l.queue.IsTopic() {
			return condNotAllowed, fmt.Sprintf("sbemu: %q is a topic: receive from one of its subscriptions (%q)", l.path, broker.SubscriptionPath(l.path, "<name>"))
		}
		if l.node == "" && clientSends && l.queue.IsSubscription() {
			return condNotAllowed, fmt.Sprintf("sbemu: %q is a subscription: send to its topic", l.path)
		}
	}
	// $cbs is exempt because it is where the token is presented in the first
	// place. A sender needs Send and a receiver Listen (rights.go); a
	// management link needs a token only, its operations check their own
	// right (management.go).
	if l.node != cbsNode {
		switch {
		case l.node == "" && clientSends:
			l.needs = rightSend
		case l.node == "":
			l.needs = rightListen
		}
		granted, ok := l.s.c.rightsFor(l.path)
		if !ok {
			return condUnauthorized, fmt.Sprintf("sbemu: no valid token for %q on this connection", l.path)
		}
		if !granted.has(l.needs) {
			return condUnauthorized, missingClaim(l.needs, l.path)
		}
	}
	// An entity whose status forbids the link's direction refuses it at
	// attach (broker/status.go); a status that changes later refuses each
	// transfer, receive and completion instead.
	if l.queue != nil && l.node == "" {
		allowed := l.queue.ReceiveAllowed
		if clientSends {
			allowed = l.queue.SendAllowed
		}
		if err := allowed(); err != nil {
			return condEntityDisabled, disabledDescription(err)
		}
	}
	switch {
	case l.node != "" && clientSends:
		l.kind = kindRequestIn
	case l.node != "":
		l.kind = kindReplyOut
		// The SDK gives each reply link a unique target address (for $cbs
		// it looks like "$cbs$$cbs-reply-to-<uuid>") and names it in every
		// request's reply-to, so findReplyLink matches on it.
		l.replyAddr = targetAddr(l.attach.Target)
		l.replies = newReplyOutbox()
	case clientSends:
		l.kind = kindQueueIn
	default:
		l.kind = kindQueueOut
	}
	return "", ""
}
