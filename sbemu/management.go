package sbemu

import (
	"errors"
	"fmt"
	"time"

	"github.com/Azure/go-amqp"

	"github.com/sbretry/retry/sbemu/broker"
)

// Management operations the emulator implements (the SDK's internal/mgmt.go).
const (
	opScheduleMessage      = "com.microsoft:schedule-message"
	opCancelScheduled      = "com.microsoft:cancel-scheduled-message"
	opRenewLock            = "com.microsoft:renew-lock"
	opPeekMessage          = "com.microsoft:peek-message"
	opUpdateDisposition    = "com.microsoft:update-disposition"
	statusOK               = 200
	statusNoContent        = 204
	statusBadRequest       = 400
	statusNotFound         = 404
	statusGone             = 410 // lock lost; the SDK maps it to CodeLockLost
	statusEntityTooLarge   = 413
	statusInternalError    = 500
	statusNotImplemented   = 501
	dispositionCompleted   = "completed"
	dispositionAbandoned   = "abandoned"
	dispositionSuspended   = "suspended"
	dispositionDeferred    = "defered" // sic, as the SDK spells it
	annotationScheduleTime = broker.AnnotationScheduledEnqueueTime
)

// handleManagement answers one "<entity>/$management" request. Unknown
// operations get 501 rather than silence, so the SDK fails fast instead of
// waiting for a reply that never comes.
func (l *link) handleManagement(req *amqp.Message) *amqp.Message {
	op, _ := req.ApplicationProperties["operation"].(string)
	body, _ := req.Value.(map[string]any)
	q := l.queue
	if status, ok := l.s.c.em.faults.TakeManagementRejection(op); ok {
		return rpcReply(int32(status), "sbemu: injected management failure", nil)
	}
	// Scheduling is sending; every other operation acts on messages or
	// sessions a receiver holds, which needs Listen (rights.go).
	need := rightListen
	if op == opScheduleMessage || op == opCancelScheduled {
		need = rightSend
	}
	if granted, _ := l.s.c.rightsFor(l.path); !granted.has(need) {
		return rpcReply(401, missingClaim(need, q.Name()), nil)
	}
	switch op {
	case opScheduleMessage:
		return scheduleMessages(q, body)
	case opCancelScheduled:
		return cancelScheduled(q, body)
	case opRenewLock:
		return renewLocks(q, body)
	case opPeekMessage:
		return l.peekMessages(q, req, body)
	case opUpdateDisposition:
		return updateDisposition(q, body)
	case opReceiveBySequenceNumber:
		return l.receiveBySequenceNumber(q, req, body)
	default:
		if reply, ok := l.handleSessionManagement(op, q, body); ok {
			return reply
		}
		l.log.Info("sbemu: unsupported management operation", "operation", op)
		return rpcReply(statusNotImplemented, fmt.Sprintf("sbemu: operation %q is not supported", op), nil)
	}
}

// scheduleMessages implements com.microsoft:schedule-message: body
// {"messages": [{"message-id", "message": <encoded message>}]}, each with
// x-opt-scheduled-enqueue-time. The reply's "sequence-numbers" must be an
// AMQP array of long, which go-amqp produces for []int64.
func scheduleMessages(q *broker.Queue, body map[string]any) *amqp.Message {
	entries, ok := body["messages"].([]any)
	if !ok || len(entries) == 0 {
		return rpcReply(statusBadRequest, "sbemu: schedule-message needs a non-empty \"messages\" list", nil)
	}
	seqs := make([]int64, 0, len(entries))
	for _, raw := range entries {
		entry, _ := raw.(map[string]any)
		encoded, ok := entry["message"].([]byte)
		if !ok {
			return rpcReply(statusBadRequest, "sbemu: schedule-message entry without binary \"message\"", nil)
		}
		var m amqp.Message
		if err := m.UnmarshalBinary(encoded); err != nil {
			return rpcReply(statusBadRequest, "sbemu: undecodable scheduled message: "+err.Error(), nil)
		}
		// A missing or zero time makes the broker enqueue at once, which is
		// what Service Bus does for a time that is not in the future.
		at, _ := m.Annotations[annotationScheduleTime].(time.Time)
		seq, err := q.ScheduleOwned(&m, len(encoded), at) // m was decoded for this call only
		if err != nil {
			return brokerErrorReply(err)
		}
		seqs = append(seqs, seq)
	}
	return rpcReply(statusOK, "OK", map[string]any{"sequence-numbers": seqs})
}

// cancelScheduled implements com.microsoft:cancel-scheduled-message.
func cancelScheduled(q *broker.Queue, body map[string]any) *amqp.Message {
	// go-amqp decodes an AMQP array of long as []int64; the SDK always sends
	// that shape, so anything else is a malformed request.
	seqs, ok := body["sequence-numbers"].([]int64)
	if !ok {
		return rpcReply(statusBadRequest, "sbemu: cancel-scheduled-message needs \"sequence-numbers\" as an array of long", nil)
	}
	if err := q.CancelScheduled(seqs...); err != nil {
		return brokerErrorReply(err)
	}
	return rpcReply(statusOK, "OK", nil)
}

// renewLocks implements com.microsoft:renew-lock: {"lock-tokens": uuid[]}
// answered with {"expirations": timestamp[]}, or 410 when a lock is lost.
func renewLocks(q *broker.Queue, body map[string]any) *amqp.Message {
	tokens, ok := lockTokens(body["lock-tokens"])
	if !ok {
		return rpcReply(statusBadRequest, "sbemu: renew-lock needs \"lock-tokens\" as an array of uuid", nil)
	}
	until, err := q.RenewLock(tokens...)
	if err != nil {
		return brokerErrorReply(err)
	}
	return rpcReply(statusOK, "OK", map[string]any{"expirations": until})
}

// peekMessages implements com.microsoft:peek-message: 204 when nothing is
// at or after from-sequence-number, else {"messages": [{"message": bin}]}.
// A session receiver's peek shows only its session's messages: the .NET
// SDK's live test SessionReceiverLiveTests.RoundRobinSessions peeks from
// sequence number 1 on an entity holding three sessions and expects every
// peeked message to carry the receiver's session id, and the Python SDK
// sends the receiver's "session-id" with the request (the Go SDK names
// only its receive link; see sessionOfRequest).
func (l *link) peekMessages(q *broker.Queue, req *amqp.Message, body map[string]any) *amqp.Message {
	from, ok1 := asInt64(body["from-sequence-number"])
	count, ok2 := asInt64(body["message-count"])
	if !ok1 || !ok2 {
		return rpcReply(statusBadRequest, "sbemu: peek-message needs from-sequence-number and message-count", nil)
	}
	if limit := l.s.c.em.cfg.Limits.MaxPeekCount; count > int64(limit) {
		return rpcReply(statusBadRequest, fmt.Sprintf("sbemu: message-count %d: %s", count, limitError("peek count", limit)), nil)
	}
	var peeked []*broker.Delivery
	if id, ok := l.sessionOfRequest(q, req); ok {
		peeked = q.PeekSession(id, from, int(count))
	} else {
		peeked = q.Peek(from, int(count))
	}
	if len(peeked) == 0 {
		return rpcReply(statusNoContent, "No messages", nil)
	}
	out := make([]any, 0, len(peeked))
	replyBytes := 0
	for _, d := range peeked {
		// As in queueSource.wrap: the SDK only fills some fields of a received
		// message when it has a properties section.
		if d.Message.Properties == nil {
			d.Message.Properties = &amqp.MessageProperties{}
		}
		encoded, err := marshalDelivery(d.Message)
		if err != nil {
			l.log.Error("sbemu: encoding peeked message", "seq", d.SequenceNumber, "err", err)
			return rpcReply(statusInternalError, "sbemu: encoding peeked message: "+err.Error(), nil)
		}
		// A peek may return fewer messages than asked for; the SDK simply
		// peeks again from the next sequence number. Cutting the reply keeps
		// a peek of large messages from building a reply of hundreds of MiB.
		if replyBytes += len(encoded); replyBytes > maxPeekReplyBytes && len(out) > 0 {
			break
		}
		out = append(out, map[string]any{"message": encoded})
	}
	return rpcReply(statusOK, "OK", map[string]any{"messages": out})
}

// updateDisposition implements com.microsoft:update-disposition, which the
// SDK uses to settle by lock token when the receive link is gone.
func updateDisposition(q *broker.Queue, body map[string]any) *amqp.Message {
	status, _ := body["disposition-status"].(string)
	tokens, ok := lockTokens(body["lock-tokens"])
	if !ok || len(tokens) == 0 {
		return rpcReply(statusBadRequest, "sbemu: update-disposition needs \"lock-tokens\"", nil)
	}
	// The tokens are settled one by one and the first failure is reported;
	// earlier tokens stay settled.
	props, _ := body["properties-to-modify"].(map[string]any)
	for _, token := range tokens {
		var err error
		switch status {
		case dispositionCompleted:
			err = q.Complete(token)
		case dispositionAbandoned:
			err = q.Abandon(token, modifiedProperties(props))
		case dispositionSuspended:
			reason, _ := body["deadletter-reason"].(string)
			desc, _ := body["deadletter-description"].(string)
			err = q.DeadLetter(token, reason, desc, props)
		case dispositionDeferred:
			err = q.Defer(token, modifiedProperties(props))
		default:
			return rpcReply(statusBadRequest, fmt.Sprintf("sbemu: unknown disposition-status %q", status), nil)
		}
		if err != nil {
			return brokerErrorReply(err)
		}
	}
	return rpcReply(statusOK, "OK", nil)
}

// modifiedProperties converts update-disposition's properties-to-modify
// to the map [broker.Queue.Abandon] and [broker.Queue.Defer] merge; nil
// when there are none.
func modifiedProperties(props map[string]any) map[any]any {
	if len(props) == 0 {
		return nil
	}
	ann := make(map[any]any, len(props))
	for k, v := range props {
		ann[k] = v
	}
	return ann
}

// brokerErrorReply maps broker errors to management status codes the SDK
// classifies correctly: 410 -> CodeLockLost, 404 -> CodeNotFound.
func brokerErrorReply(err error) *amqp.Message {
	switch {
	case errors.Is(err, broker.ErrLockLost):
		return rpcReply(statusGone, lockLostDescription+" sbemu: "+err.Error(), nil)
	case errors.Is(err, broker.ErrNotFound), errors.Is(err, broker.ErrUnknownQueue):
		return rpcReply(statusNotFound, "sbemu: "+err.Error(), nil)
	case errors.Is(err, broker.ErrMessageTooLarge):
		return rpcReply(statusEntityTooLarge, "sbemu: "+err.Error(), nil)
	case errors.Is(err, broker.ErrPropertiesTooLarge):
		return rpcReply(statusBadRequest, "sbemu: "+err.Error(), nil)
	case errors.Is(err, broker.ErrNotSupported):
		return rpcReply(statusBadRequest, "sbemu: "+err.Error(), nil)
	case errors.Is(err, broker.ErrEntityDisabled):
		reply := rpcReply(statusBadRequest, disabledDescription(err), nil)
		reply.ApplicationProperties[managementErrorConditionKey] = amqp.Symbol(condEntityDisabled)
		return reply
	default:
		return rpcReply(statusInternalError, "sbemu: "+err.Error(), nil)
	}
}

// lockTokens reads an array of uuid (go-amqp decodes it as []amqp.UUID).
func lockTokens(v any) ([][16]byte, bool) {
	switch v := v.(type) {
	case []amqp.UUID:
		out := make([][16]byte, len(v))
		for i, u := range v {
			out[i] = [16]byte(u)
		}
		return out, true
	// A list of uuid, from clients that send a list instead of an array.
	case []any:
		out := make([][16]byte, 0, len(v))
		for _, e := range v {
			u, ok := e.(amqp.UUID)
			if !ok {
				return nil, false
			}
			out = append(out, [16]byte(u))
		}
		return out, true
	}
	return nil, false
}

// asInt64 accepts any AMQP integer type.
func asInt64(v any) (int64, bool) {
	switch v := v.(type) {
	case int64:
		return v, true
	case int32:
		return int64(v), true
	case int16:
		return int64(v), true
	case int8:
		return int64(v), true
	case uint32:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint8:
		return int64(v), true
	// May wrap for values above MaxInt64; counts and sequence numbers the
	// SDK sends are far below that.
	case uint64:
		return int64(v), true
	case int:
		return int64(v), true
	}
	return 0, false
}
