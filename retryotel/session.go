package retryotel

import (
	"context"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbretry/retry"
)

// SessionConnector returns a [retry.SessionConnector] that builds its connections with connect, for a
// [retry.SessionConsumer], and instruments what the hooks cannot see:
//
//   - session lock renewals: each RenewSessionLock call of an accepted session becomes a
//     "renew_session_lock <entity>" CLIENT span (a child of the process span of the message being
//     handled in the session, a root span while the session waits for its next message) with
//     [AttrSessionID], and a messaging.client.operation.duration measurement. The core renews session
//     locks on a goroutine of its own and reports renewals to no hook, so they are seen only here.
//   - the receives of deferred messages: a durable hold (retry.SessionOptions.DurableHolds) defers
//     the held message and the messages behind it, and receives each back by its sequence number when
//     it is due; each ReceiveDeferredMessages call becomes a "receive_deferred <entity>" CLIENT span
//     (operation type receive, with messaging.batch.message_count and [AttrSessionID]) and a
//     messaging.client.operation.duration measurement. The message it brings back then gets its own
//     process span from the hooks, linked to the attempt that deferred it when the deferral carried
//     that attempt's trace context.
//   - the server: unless [Options].ServerAddress is set, server.address and server.port come from the
//     connection's [retry.SessionConnection].Address, which the built-in session connectors set.
//
// Use it in place of the connector, with the hooks of [Instrumentation.Hooks], exactly as for a queue
// consumer:
//
//	consumer, err := retry.NewSessionConsumer(inst.SessionConnector(connect), handler,
//		&retry.Options{Hooks: inst.Hooks(retry.Hooks{})}, nil)
//
// The hooks alone already give every delivery its process span (one per message, covering all its
// attempts, since a session consumer retries in place and schedules no copy), the spans of its
// complete and dead-letter calls, [AttrSessionID] on all of them, and the metrics. A renewal finds its
// delivery by the connection's EntityPath and the session id; with an empty EntityPath (the consumer's
// Options.EntityPath then names the entity) renewals are root spans. Everything else about the
// connection is passed through; the receivers' other methods, Close included, are the connector's own.
func (in *Instrumentation) SessionConnector(connect retry.SessionConnector) retry.SessionConnector {
	return func(ctx context.Context) (*retry.SessionConnection, error) {
		conn, err := connect(ctx)
		if err != nil || conn == nil {
			return conn, err
		}
		c := *conn
		in.metrics.learnServer(c.Address)
		if accept := c.AcceptNext; accept != nil {
			entity := c.EntityPath
			c.AcceptNext = func(ctx context.Context) (retry.SessionReceiver, error) {
				r, err := accept(ctx)
				if err != nil || r == nil {
					return r, err
				}
				return &tracedSessionReceiver{SessionReceiver: r, in: in, entity: entity}, nil
			}
		}
		return &c, nil
	}
}

// sessionKey names one session of one entity: session ids are unique only within their entity, and
// one Instrumentation may serve several consumers.
type sessionKey struct {
	entity, id string
}

// tracedSessionReceiver is a [retry.SessionReceiver] whose session lock renewals and receives of
// deferred messages are traced and timed.
type tracedSessionReceiver struct {
	retry.SessionReceiver
	in     *Instrumentation
	entity string
}

var _ retry.SessionReceiver = (*tracedSessionReceiver)(nil)

// RenewSessionLock renews the session lock through the wrapped receiver and records the call.
func (r *tracedSessionReceiver) RenewSessionLock(ctx context.Context, options *azservicebus.RenewSessionLockOptions) error {
	id := r.SessionReceiver.SessionID()
	// As for a message lock: the renewal belongs to the delivery in the session when it was made.
	d, _ := r.in.sessions.Load(sessionKey{entity: r.entity, id: id})
	start := time.Now()
	err := r.SessionReceiver.RenewSessionLock(ctx, options)
	dl, _ := d.(*delivery)
	r.in.sessionRenewed(dl, r.entity, id, start, time.Now(), callFailure(ctx, err))
	return err
}

// sessionRenewed records one renewal of the lock of session id on entity. d is the delivery being
// handled in the session, nil while none is. messaging.operation.type is left out, as for
// renew_message_lock: no operation type describes it.
func (in *Instrumentation) sessionRenewed(d *delivery, entity, id string, start, end time.Time, err error) {
	parent := context.Background()
	dest := parseEntity(entity)
	src := dest
	if d != nil {
		d.mu.Lock()
		parent, src = d.ctx, d.source
		d.mu.Unlock()
	}
	in.recordRenewal(parent, opRenewSessionLock, dest, src, []attribute.KeyValue{AttrSessionID.String(id)}, start, end, err)
}

// ReceiveDeferredMessages receives deferred messages through the wrapped receiver and records the call.
func (r *tracedSessionReceiver) ReceiveDeferredMessages(ctx context.Context, seqs []int64, options *azservicebus.ReceiveDeferredMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	id := r.SessionReceiver.SessionID()
	d, _ := r.in.sessions.Load(sessionKey{entity: r.entity, id: id})
	start := time.Now()
	msgs, err := r.SessionReceiver.ReceiveDeferredMessages(ctx, seqs, options)
	dl, _ := d.(*delivery)
	r.in.deferredReceived(dl, r.entity, id, msgs, start, time.Now(), callFailure(ctx, err))
	return msgs, err
}

// deferredReceived records one receive of deferred messages of session id on entity, which returned
// msgs: a CLIENT span named for the conventions' Service Bus receiver operation receive_deferred, of
// operation type receive, a child of the delivery d being handled in the session (nil while none is,
// as when a wake-up resumes a hold: the span is then a root), and a messaging.client.operation.duration
// measurement. The call is a batch API (it takes a list of sequence numbers), so it carries
// messaging.batch.message_count, as the conventions ask of batching APIs
// (https://opentelemetry.io/docs/specs/semconv/messaging/azure-messaging/), and messaging.message.id
// when it brought back one message. It does not count in messaging.client.consumed.messages: the
// message it brings back is counted there once, as every delivery is, when it has been processed.
func (in *Instrumentation) deferredReceived(d *delivery, entity, id string, msgs []*azservicebus.ReceivedMessage, start, end time.Time, err error) {
	parent := context.Background()
	dest := parseEntity(entity)
	src := dest
	if d != nil {
		d.mu.Lock()
		parent, src = d.ctx, d.source
		d.mu.Unlock()
	}
	common := append([]attribute.KeyValue{semconv.MessagingSystemServiceBus, semconv.MessagingOperationName(opReceiveDeferred)}, in.metrics.entityAttrs(dest, src)...)
	if err != nil {
		common = append(common, semconv.ErrorTypeKey.String(errorType(err)))
	}
	withType := append(common[:len(common):len(common)], semconv.MessagingOperationTypeReceive)
	extra := []attribute.KeyValue{semconv.MessagingBatchMessageCount(len(msgs)), AttrSessionID.String(id)}
	if len(msgs) == 1 && msgs[0] != nil && msgs[0].MessageID != "" {
		extra = append(extra, semconv.MessagingMessageID(msgs[0].MessageID))
	}
	_, span := in.tracer.Start(parent, dest.spanName(opReceiveDeferred),
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(start),
		trace.WithAttributes(withType...),
		trace.WithAttributes(extra...),
	)
	if err != nil {
		span.SetStatus(codes.Error, statusText(err))
	}
	span.End(trace.WithTimestamp(end))
	in.metrics.recordOperation(parent, end.Sub(start), withType)
}
