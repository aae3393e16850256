package sbemu

import (
	"strings"

	"github.com/Azure/go-amqp"
)

// RPC reply application properties: the status code must be an AMQP int
// (int32). The claims-based-security draft names them "status-code" and
// "status-description", which every SDK's CBS client reads; Service Bus's
// management node answers with "statusCode" and "statusDescription"
// instead, and the JavaScript SDK's management client reads only those
// (@azure/service-bus ManagementClient), while the Go SDK accepts either
// (internal/rpc.go). Replies are built with the CBS names and renamed for
// the management node in handleRequest.
const (
	statusCodeKey        = "status-code"
	statusDescriptionKey = "status-description"

	managementStatusCodeKey        = "statusCode"
	managementStatusDescriptionKey = "statusDescription"

	// managementErrorConditionKey names, in a failed management reply, the
	// AMQP error condition behind the status. The JavaScript SDK reads it
	// before falling back to a guess from the status code
	// (@azure/core-amqp requestResponseLink.ts, getCodeDescriptionAndError
	// and onMessageReceived); without it an expired lock's renewal (410)
	// surfaces there as GeneralError instead of MessageLockLost.
	managementErrorConditionKey = "errorCondition"
)

// rpcReply builds a request/response reply; the caller sets the
// correlation id.
func rpcReply(code int32, desc string, value any) *amqp.Message {
	// Properties is non-nil so handleRequest can set the correlation id.
	return &amqp.Message{
		Properties: &amqp.MessageProperties{},
		ApplicationProperties: map[string]any{
			statusCodeKey:        code,
			statusDescriptionKey: desc,
		},
		Value: value,
	}
}

// handleRequest processes one request sent to "$cbs" or
// "<entity>/$management" and queues the reply on the client's reply link.
// The reply's correlation-id is the request's message-id, which is how the
// SDK matches replies to calls.
func (l *link) handleRequest(payload []byte) {
	var req amqp.Message
	if err := req.UnmarshalBinary(payload); err != nil {
		// Without a decodable message-id no reply could be correlated, so the
		// request is dropped and the SDK's own timeout reports it.
		l.log.Info("sbemu: undecodable request", "err", err)
		return
	}
	var resp *amqp.Message
	if l.node == cbsNode {
		resp = l.s.c.handlePutToken(&req)
	} else {
		resp = l.handleManagement(&req)
		props := resp.ApplicationProperties
		props[managementStatusCodeKey], props[managementStatusDescriptionKey] = props[statusCodeKey], props[statusDescriptionKey]
		delete(props, statusCodeKey)
		delete(props, statusDescriptionKey)
		if code, _ := props[managementStatusCodeKey].(int32); code >= 300 {
			if _, set := props[managementErrorConditionKey]; !set {
				props[managementErrorConditionKey] = conditionForStatus(code)
			}
		}
	}
	var replyTo string
	if req.Properties != nil {
		resp.Properties.CorrelationID = req.Properties.MessageID
		if req.Properties.ReplyTo != nil {
			replyTo = *req.Properties.ReplyTo
		}
	}
	// The reply link may live in another session of the connection: the
	// match is on reply-to, not on the request's session.
	out := l.s.c.findReplyLink(replyTo, l)
	if out == nil {
		l.log.Info("sbemu: no reply link for request", "replyTo", replyTo)
		return
	}
	// push never blocks: the reader must not wait for the client to grant
	// credit on the reply link, or the client's flow could never be read.
	// With persistence the reply waits until what the request changed is
	// on disk (see durable.go), on the journal's goroutine.
	if em := l.s.c.em; em.persistent {
		em.broker.AfterSync(func(err error) {
			if err != nil {
				resp = durableFailureReply(resp, err)
			}
			l.pushReply(out, resp)
		})
		return
	}
	l.pushReply(out, resp)
}

// pushReply encodes a reply and queues it on the reply link.
func (l *link) pushReply(out *link, resp *amqp.Message) {
	encoded, err := resp.MarshalBinary()
	if err != nil {
		l.log.Error("sbemu: encoding reply", "err", err)
		return
	}
	out.replies.push(encoded)
}

// findReplyLink finds the link a reply must go to: the connection's reply
// link whose target address is the request's reply-to, or else the reply
// link for the same node in the request's session.
func (c *conn) findReplyLink(replyTo string, req *link) *link {
	var fallback *link
	for _, s := range c.allSessions() {
		s.mu.Lock()
		for _, l := range s.links {
			if l.kind != kindReplyOut || l.replies == nil {
				continue
			}
			if replyTo != "" && l.replyAddr == replyTo {
				s.mu.Unlock()
				return l
			}
			if s == req.s && strings.EqualFold(l.path, req.path) {
				fallback = l
			}
		}
		s.mu.Unlock()
	}
	return fallback
}
