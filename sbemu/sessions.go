package sbemu

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/Azure/go-amqp"

	"github.com/sbretry/retry/sbemu/broker"
	"github.com/sbretry/retry/sbemu/internal/wire"
)

// Session receivers on the wire (the broker side is broker/session.go), as
// azservicebus v1.11.0 session_receiver.go newLink sends them:
//
//   - The receive link's source carries the filter
//     "com.microsoft:session-filter" (descriptor 0x00000137000000C) whose
//     value is the session id, or null for "the next available session".
//     For next-available the attach properties may carry
//     "com.microsoft:timeout" (uint, milliseconds: how long to wait).
//   - The attach reply's source carries the same filter with the granted
//     session id (the SDK fails the link if it differs from the one it
//     asked for), and its properties "com.microsoft:locked-until-utc": the
//     lock expiry in .NET ticks (long).
//   - A session locked elsewhere: the attach is refused with
//     com.microsoft:session-cannot-be-locked (fatal for the SDK); no
//     session within the timeout: com.microsoft:timeout, which the SDK
//     reports as CodeTimeout (internal/errors.go TransformError).
//   - A receiver without the filter on a session-aware entity: amqp:not-allowed
//     with Service Bus's text, which the live test
//     TestSessionReceiver_nonSessionReceiver checks.
//   - $management: com.microsoft:renew-session-lock {"session-id"} ->
//     {"expiration": timestamp}; get-session-state {"session-id"} ->
//     {"session-state": binary or null}; set-session-state {"session-id",
//     "session-state": binary or null}; get-message-sessions {"skip",
//     "top", "last-updated-time"} -> {"skip", "sessions-ids": string[]}
//     (internal/mgmt.go), listing the sessions with messages or a state
//     when last-updated-time is DateTime.MaxValue and the sessions whose
//     state was set after it otherwise. All but the listing act on a
//     session locked by a receiver of the same connection.
const (
	sessionFilterName   = "com.microsoft:session-filter"
	sessionFilterCode   = uint64(0x00000137000000C)
	propLockedUntilUTC  = "com.microsoft:locked-until-utc"
	propTimeout         = "com.microsoft:timeout"
	opRenewSessionLock  = "com.microsoft:renew-session-lock"
	opGetSessionState   = "com.microsoft:get-session-state"
	opSetSessionState   = "com.microsoft:set-session-state"
	opGetMessageSession = "com.microsoft:get-message-sessions"

	condSessionCannotBeLocked wire.Symbol = "com.microsoft:session-cannot-be-locked"
	condSessionLockLost       wire.Symbol = "com.microsoft:session-lock-lost"
	condTimeout               wire.Symbol = "com.microsoft:timeout"

	// defaultAcceptTimeout is how long accept-next-session waits without
	// com.microsoft:timeout: Service Bus's default operation timeout.
	defaultAcceptTimeout = time.Minute
	// maxAcceptTimeout bounds the wait a client may ask for.
	maxAcceptTimeout = 10 * time.Minute

	// nonSessionReceiverText is Service Bus's description for a receiver
	// without a session filter on a session-aware entity.
	nonSessionReceiverText = "It is not possible for an entity that requires sessions to create a non-sessionful message receiver."
	// sessionReceiverText is the reverse case.
	sessionReceiverText = "It is not possible for an entity that does not require sessions to create a sessionful message receiver."
)

// epochTicks is 1970-01-01 in .NET ticks (100 ns since 0001-01-01).
const epochTicks = int64(621355968000000000)

// toTicks converts t to .NET ticks, as the SDK's ticksToUnixTime reads them.
func toTicks(t time.Time) int64 {
	return epochTicks + t.UnixMilli()*10000
}

// sessionFilter reads the session filter of a receiver's source: present
// says whether there is one, id is nil for "next available".
func sessionFilter(src *wire.Source) (id *string, present bool, err error) {
	if src == nil {
		return nil, false, nil
	}
	v, ok := src.Filter.Get(wire.Symbol(sessionFilterName))
	if !ok {
		return nil, false, nil
	}
	switch d := v.(type) {
	case wire.Described:
		v = d.Value
	case *wire.Described:
		v = d.Value
	}
	switch v := v.(type) {
	case nil:
		return nil, true, nil
	case string:
		return &v, true, broker.CheckSessionID(v)
	}
	return nil, true, fmt.Errorf("%s must be a string or null, not %T", sessionFilterName, v)
}

// acceptTimeout reads com.microsoft:timeout from the attach properties.
func acceptTimeout(a *wire.Attach) time.Duration {
	v, ok := a.Properties.Get(wire.Symbol(propTimeout))
	if !ok {
		return defaultAcceptTimeout
	}
	ms, ok := asInt64(v)
	if !ok || ms <= 0 {
		return defaultAcceptTimeout
	}
	return min(time.Duration(ms)*time.Millisecond, maxAcceptTimeout)
}

// attachSession handles a receive link's session filter. It reports true
// when it took over the attach (refused it, or will complete it once a
// session is locked); false lets a receiver without sessions attach as
// usual.
func (s *session) attachSession(l *link) bool {
	a := l.attach
	id, present, err := sessionFilter(a.Source)
	q := l.queue
	switch {
	case err != nil:
		s.refuseAttach(a, l.outHandle, condNotAllowed, "sbemu: "+err.Error())
		return true
	case !q.RequiresSession() && present:
		s.refuseAttach(a, l.outHandle, condNotAllowed, sessionReceiverText)
		return true
	case !q.RequiresSession():
		return false
	case !present:
		s.refuseAttach(a, l.outHandle, condNotAllowed, nonSessionReceiverText)
		return true
	case id != nil:
		lock, _, err := q.AcceptSession(*id, s.c.id)
		if err != nil {
			cond, desc := sessionErrorCondition(err)
			s.refuseAttach(a, l.outHandle, cond, desc)
			return true
		}
		l.sessionLock = lock
		s.completeAttach(l)
		return true
	}
	// Next available: waiting must not block the reader, so it happens on
	// a goroutine the connection waits for; l.ctx ends it at teardown.
	timeout := acceptTimeout(a)
	c := s.c
	s.mu.Lock()
	if s.pending == nil {
		s.pending = map[uint32]bool{}
	}
	s.pending[a.Handle] = true
	s.mu.Unlock()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		lock, _, err := q.AcceptNextSession(l.ctx, c.id, timeout)
		s.mu.Lock()
		delete(s.pending, a.Handle)
		s.mu.Unlock()
		if err != nil {
			if l.ctx.Err() == nil {
				cond, desc := sessionErrorCondition(err)
				s.refuseAttach(a, l.outHandle, cond, desc)
			}
			return
		}
		l.sessionLock = lock
		s.completeAttach(l)
	}()
	return true
}

// decorateSessionAttach adds the granted session id and lock expiry to a
// session receiver's attach reply.
func decorateSessionAttach(reply *wire.Attach, l *link) {
	src := &wire.Source{}
	if l.attach.Source != nil {
		c := *l.attach.Source
		src = &c
	}
	filter := &wire.Map{}
	if src.Filter != nil {
		filter.Entries = append(filter.Entries, src.Filter.Entries...)
	}
	filter.Set(wire.Symbol(sessionFilterName), grantedSessionFilter(l.attach.Source, l.sessionLock.SessionID()))
	src.Filter = filter
	reply.Source = src
	props := &wire.Map{}
	props.Set(wire.Symbol(propLockedUntilUTC), toTicks(l.sessionLock.LockedUntil()))
	reply.Properties = props
}

// grantedSessionFilter is the session filter value of an attach reply,
// granting id, in the form the client asked in. The Go SDK sends the
// filter described (sessionFilterCode) and reads either form back; the
// JavaScript SDK (@azure/service-bus 7.9.5, MessageSession.createRheaLink)
// sends a plain string or null and compares the reply's value with ===
// against the session id it asked for, so a described value there reads
// as "the session may be locked by another receiver", and for the next
// available session as no session at all. Service Bus echoes the client's
// form.
func grantedSessionFilter(asked *wire.Source, id string) any {
	if asked != nil {
		if v, ok := asked.Filter.Get(wire.Symbol(sessionFilterName)); ok {
			switch v.(type) {
			case wire.Described, *wire.Described:
			default:
				return id
			}
		}
	}
	return wire.Described{Descriptor: sessionFilterCode, Value: id}
}

// sessionErrorCondition maps a session error to its AMQP condition.
func sessionErrorCondition(err error) (wire.Symbol, string) {
	desc := "sbemu: " + err.Error()
	switch {
	case errors.Is(err, broker.ErrSessionCannotBeLocked):
		return condSessionCannotBeLocked, desc
	case errors.Is(err, broker.ErrSessionLockLost):
		return condSessionLockLost, desc
	case errors.Is(err, broker.ErrSessionTimeout):
		return condTimeout, desc
	case errors.Is(err, broker.ErrSessionRequired), errors.Is(err, broker.ErrInvalidSessionID):
		return condNotAllowed, desc
	case errors.Is(err, broker.ErrUnknownQueue):
		return condNotFound, desc
	case errors.Is(err, broker.ErrEntityDisabled):
		return condEntityDisabled, disabledDescription(err)
	}
	return condInternalError, desc
}

// deliveryFailure is the detach condition and description for a receive
// link whose source failed.
func deliveryFailure(err error) (wire.Symbol, string) {
	switch {
	case errors.Is(err, broker.ErrSessionLockLost):
		return condSessionLockLost, "sbemu: " + err.Error()
	case errors.Is(err, broker.ErrEntityDisabled):
		return condEntityDisabled, disabledDescription(err)
	}
	return condInternalError, "sbemu: " + err.Error()
}

// receive takes the next message for the link: from its session when it
// is a session receiver.
func (s *queueSource) receive(ctx context.Context) (*broker.Delivery, error) {
	if s.session != nil {
		return s.session.Receive(ctx, broker.PeekLock)
	}
	return s.q.Receive(ctx, broker.PeekLock, s.owner)
}

// tryReceive is the non-blocking receive.
func (s *queueSource) tryReceive() (*broker.Delivery, bool) {
	if s.session != nil {
		return s.session.TryReceive(broker.PeekLock)
	}
	return s.q.TryReceive(broker.PeekLock, s.owner)
}

// handleSessionManagement answers the session operations; ok is false for
// any other operation.
func (l *link) handleSessionManagement(op string, q *broker.Queue, body map[string]any) (*amqp.Message, bool) {
	switch op {
	case opRenewSessionLock:
		id, reply := requestSessionID(body)
		if reply != nil {
			return reply, true
		}
		until, err := q.RenewSessionLock(id, l.s.c.id)
		if err != nil {
			return sessionErrorReply(err), true
		}
		return rpcReply(statusOK, "OK", map[string]any{"expiration": until}), true
	case opGetSessionState:
		id, reply := requestSessionID(body)
		if reply != nil {
			return reply, true
		}
		state, err := q.SessionState(id, l.s.c.id)
		if err != nil {
			return sessionErrorReply(err), true
		}
		var v any // null without state
		if state != nil {
			v = state
		}
		return rpcReply(statusOK, "OK", map[string]any{"session-state": v}), true
	case opSetSessionState:
		id, reply := requestSessionID(body)
		if reply != nil {
			return reply, true
		}
		var state []byte
		switch v := body["session-state"].(type) {
		case nil:
		case []byte:
			// The SDK's SetSessionState(nil) clears the state; it arrives
			// as empty binary, so empty clears too.
			if len(v) > 0 {
				state = v
			}
		default:
			return rpcReply(statusBadRequest, fmt.Sprintf("sbemu: session-state must be binary or null, not %T", v), nil), true
		}
		if err := q.SetSessionState(id, l.s.c.id, state); err != nil {
			return sessionErrorReply(err), true
		}
		return rpcReply(statusOK, "OK", nil), true
	case opGetMessageSession:
		skip, _ := asInt64(body["skip"])
		top, _ := asInt64(body["top"])
		if skip < 0 || top < 0 || skip > 1<<31 || top > 1<<31 {
			return rpcReply(statusBadRequest, "sbemu: get-message-sessions needs non-negative skip and top", nil), true
		}
		var ids []string
		var err error
		switch after, all, bad := lastUpdatedTime(body["last-updated-time"]); {
		case bad:
			return rpcReply(statusBadRequest, "sbemu: get-message-sessions needs last-updated-time as a timestamp", nil), true
		case all:
			ids, err = q.Sessions(int(skip), int(top))
		default:
			ids, err = q.SessionsUpdatedAfter(after, int(skip), int(top))
		}
		if err != nil {
			return sessionErrorReply(err), true
		}
		if len(ids) == 0 {
			return rpcReply(statusNoContent, "No sessions", nil), true
		}
		return rpcReply(statusOK, "OK", map[string]any{"skip": int32(skip), "sessions-ids": ids}), true
	}
	return nil, false
}

// dotNetMaxTime is .NET's DateTime.MaxValue, 9999-12-31T23:59:59.9999999Z.
var dotNetMaxTime = time.Date(9999, time.December, 31, 23, 59, 59, 999999900, time.UTC)

// lastUpdatedTime reads get-message-sessions' "last-updated-time", which
// chooses between its two modes: DateTime.MaxValue (the Go SDK sends year
// 10000, which the service's decoder clamps to it) lists every session
// with messages or a state (all); any earlier time lists the sessions whose
// state was set after it (azservicebus v1.11.0 internal/mgmt.go,
// GetMessageSessions). An absent or null time also means all; a value that
// is not a timestamp is bad.
func lastUpdatedTime(v any) (after time.Time, all, bad bool) {
	switch t := v.(type) {
	case nil:
		return time.Time{}, true, false
	case time.Time:
		return t, !t.Before(dotNetMaxTime), false
	}
	return time.Time{}, false, true
}

// requestSessionID reads "session-id"; a bad one gives a 400 reply.
func requestSessionID(body map[string]any) (string, *amqp.Message) {
	id, ok := body["session-id"].(string)
	if !ok {
		return "", rpcReply(statusBadRequest, "sbemu: the request needs \"session-id\" as a string", nil)
	}
	if err := broker.CheckSessionID(id); err != nil {
		return "", rpcReply(statusBadRequest, "sbemu: "+err.Error(), nil)
	}
	return id, nil
}

// sessionErrorReply maps session errors to management replies: 410 with
// errorCondition com.microsoft:session-lock-lost for a lost lock (the SDK
// maps 410 to CodeLockLost), 400 for a session operation on an entity
// without sessions, else as [brokerErrorReply].
func sessionErrorReply(err error) *amqp.Message {
	var reply *amqp.Message
	switch {
	case errors.Is(err, broker.ErrSessionLockLost):
		reply = rpcReply(statusGone, "sbemu: "+err.Error(), nil)
	case errors.Is(err, broker.ErrSessionRequired), errors.Is(err, broker.ErrInvalidSessionID):
		reply = rpcReply(statusBadRequest, "sbemu: "+err.Error(), nil)
	default:
		return brokerErrorReply(err)
	}
	cond, _ := sessionErrorCondition(err)
	reply.ApplicationProperties["errorCondition"] = amqp.Symbol(cond)
	return reply
}

// sessionOfLink returns the session id held by the receive link named
// name on this connection, if it is a session receiver.
func (c *conn) sessionOfLink(name string) (string, bool) {
	for _, s := range c.allSessions() {
		s.mu.Lock()
		for _, l := range s.links {
			if l.name == name && l.sessionLock != nil {
				id := l.sessionLock.SessionID()
				s.mu.Unlock()
				return id, true
			}
		}
		s.mu.Unlock()
	}
	return "", false
}
