package sbemu

import (
	"errors"
	"fmt"

	"github.com/Azure/go-amqp"

	"github.com/sbretry/retry/sbemu/broker"
)

// Deferral on the wire (the broker side is broker/defer.go):
//
//   - Defer on the receive link is the modified outcome with
//     undeliverable-here = true and delivery-failed = false (azservicebus
//     messageSettler.go DeferMessage); abandon is modified with
//     undeliverable-here = false. The answer is the same modified state.
//   - Defer by lock token is $management com.microsoft:update-disposition
//     with disposition-status "defered" (sic, internal/mgmt.go).
//   - Receive deferred is $management
//     com.microsoft:receive-by-sequence-number, body {"sequence-numbers":
//     long[], "receiver-settle-mode": uint (1 peek-lock, 0 receive and
//     delete)}; the reply is 200 {"messages": [{"message": binary,
//     "lock-token": uuid}]}. The Go SDK reads the lock token from the
//     message's x-opt-lock-token delivery annotation (message.go
//     newReceivedMessage) and settles such messages only through
//     update-disposition (receiver.go ReceiveDeferredMessages sets
//     settleOnMgmtLink), so both carry it. The Go SDK sends no session id
//     even from a session receiver; the management request names the
//     receive link in associated-link-name, which is how a session
//     receiver's request is limited to its session.
const (
	opReceiveBySequenceNumber = "com.microsoft:receive-by-sequence-number"

	// receiverSettleModeReceiveAndDelete is receiver-settle-mode 0 (the
	// SDK's "backwards" numbering: 0 receive-and-delete, 1 peek-lock).
	receiverSettleModeReceiveAndDelete = 0

	// mgmtLockTokenAnnotation is the delivery annotation the SDK reads a
	// management-delivered message's lock token from.
	mgmtLockTokenAnnotation = "x-opt-lock-token"
)

// receiveBySequenceNumber implements com.microsoft:receive-by-sequence-number.
// The number of sequence numbers is bounded by [Limits.MaxPeekCount]; an
// unknown or not deferred number is answered 404 with errorCondition
// com.microsoft:message-not-found (the Go SDK: CodeNotFound, not retried;
// the JavaScript SDK: MessageNotFound) and receives nothing.
func (l *link) receiveBySequenceNumber(q *broker.Queue, req *amqp.Message, body map[string]any) *amqp.Message {
	seqs, ok := sequenceNumbers(body["sequence-numbers"])
	if !ok || len(seqs) == 0 {
		return rpcReply(statusBadRequest, "sbemu: receive-by-sequence-number needs \"sequence-numbers\" as a non-empty array of long", nil)
	}
	if limit := l.s.c.em.cfg.Limits.MaxPeekCount; len(seqs) > limit {
		return rpcReply(statusBadRequest, fmt.Sprintf("sbemu: %d sequence numbers: %s", len(seqs), limitError("receive-by-sequence-number count (MaxPeekCount)", limit)), nil)
	}
	mode := broker.PeekLock
	if m, ok := asInt64(body["receiver-settle-mode"]); ok && m == receiverSettleModeReceiveAndDelete {
		mode = broker.ReceiveAndDelete
	}
	got, err := l.receiveDeferredFor(q, req, mode, seqs)
	if errors.Is(err, broker.ErrNotFound) {
		reply := rpcReply(statusNotFound, "sbemu: "+err.Error(), nil)
		reply.ApplicationProperties[managementErrorConditionKey] = amqp.Symbol(condMessageNotFound)
		return reply
	}
	if err != nil {
		return sessionErrorReply(err)
	}
	out := make([]any, 0, len(got))
	for _, d := range got {
		// As in peekMessages: the SDK fills some fields only when the
		// message has a properties section.
		if d.Message.Properties == nil {
			d.Message.Properties = &amqp.MessageProperties{}
		}
		entry := map[string]any{}
		if mode == broker.PeekLock {
			token := amqp.UUID(d.LockToken)
			if d.Message.DeliveryAnnotations == nil {
				d.Message.DeliveryAnnotations = amqp.Annotations{}
			}
			d.Message.DeliveryAnnotations[mgmtLockTokenAnnotation] = token
			entry["lock-token"] = token
		}
		encoded, err := marshalDelivery(d.Message)
		if err != nil {
			// The messages are locked (or gone, in receive-and-delete);
			// the locks expire on their own.
			l.log.Error("sbemu: encoding deferred message", "seq", d.SequenceNumber, "err", err)
			return rpcReply(statusInternalError, "sbemu: encoding deferred message: "+err.Error(), nil)
		}
		entry["message"] = encoded
		out = append(out, entry)
	}
	return rpcReply(statusOK, "OK", map[string]any{"messages": out})
}

// receiveDeferredFor receives deferred messages for the receive link the
// request names (sessions.go narrows it to the link's session); without
// one, from the whole entity.
func (l *link) receiveDeferredFor(q *broker.Queue, req *amqp.Message, mode broker.Mode, seqs []int64) ([]*broker.Delivery, error) {
	if !q.RequiresSession() {
		return q.ReceiveDeferred(mode, l.s.c.id, seqs...)
	}
	id, ok := l.sessionOfRequest(q, req)
	if !ok {
		return nil, fmt.Errorf("%w: receive-by-sequence-number on %s needs a session receiver", broker.ErrSessionLockLost, q.Name())
	}
	return q.ReceiveDeferredInSession(mode, l.s.c.id, id, seqs...)
}

// sessionOfRequest is the session a management request on a session-aware
// entity acts in: the body's "session-id" (the Python and .NET SDKs send
// it), else the session of the receive link the request names in
// associated-link-name (all the Go SDK sends). ok is false for an entity
// without sessions and for a request from no session receiver.
func (l *link) sessionOfRequest(q *broker.Queue, req *amqp.Message) (id string, ok bool) {
	if !q.RequiresSession() {
		return "", false
	}
	body, _ := req.Value.(map[string]any)
	if id, ok := body["session-id"].(string); ok {
		return id, true
	}
	name, _ := req.ApplicationProperties["associated-link-name"].(string)
	return l.s.c.sessionOfLink(name)
}

// sequenceNumbers reads an array of long (go-amqp: []int64) or a list of
// integers, from clients that send a list.
func sequenceNumbers(v any) ([]int64, bool) {
	switch v := v.(type) {
	case []int64:
		return v, true
	case []any:
		out := make([]int64, 0, len(v))
		for _, e := range v {
			n, ok := asInt64(e)
			if !ok {
				return nil, false
			}
			out = append(out, n)
		}
		return out, true
	}
	return nil, false
}
