package retryotel

import (
	"context"
	"errors"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
)

// Connector returns a [retry.Connector] that builds its connections with connect and instruments what
// the hooks cannot see:
//
//   - lock renewals: each RenewMessageLock call becomes a "renew_message_lock <entity>" CLIENT span
//     (a child of the delivery's process span while the delivery is between OnStart and OnProcessed,
//     a root span for a message received ahead of its handler) and a
//     messaging.client.operation.duration measurement. The core renews locks on a context of its own
//     and reports renewals to no hook, so they are seen only here. A renewal the consumer cancels
//     itself (the message settled meanwhile, a shutdown) is not recorded as an error.
//   - where retry copies go: for a connection on a subscription whose [retry.Connection.Sources] is the
//     one retry queue (what [retry.Namespace.Subscription] and the other subscription connectors
//     build), the copies of both entities' deliveries are scheduled to that queue, and the "schedule"
//     span and the sent-messages metric name it. Without this wrapper a subscription's schedule carries
//     no destination rather than the topic's.
//   - the server: unless [Options].ServerAddress is set, server.address and server.port come from the
//     connection's [retry.Connection].Address, which the built-in connectors set.
//
// Use it in place of the connector: retry.NewConsumer(inst.Connector(connect), handler, opts), with
// opts.Hooks from [Instrumentation.Hooks]. Everything else about the connection is passed through; the
// wrapped receivers' other methods, Close included, are the connector's own.
func (in *Instrumentation) Connector(connect retry.Connector) retry.Connector {
	return func(ctx context.Context) (*retry.Connection, error) {
		conn, err := connect(ctx)
		if err != nil || conn == nil {
			return conn, err
		}
		c := *conn
		in.metrics.learnServer(c.Address)
		if parseEntity(c.EntityPath).subscription != "" && len(c.Sources) == 1 && c.Sources[0].EntityPath != "" {
			q := c.Sources[0].EntityPath
			in.retryQueues.Store(c.EntityPath, q)
			in.retryQueues.Store(q, q)
		}
		if c.Receiver != nil {
			c.Receiver = in.renewing(c.Receiver, c.EntityPath)
		}
		if len(c.Sources) > 0 {
			c.Sources = append([]retry.Source(nil), c.Sources...)
			for i, s := range c.Sources {
				if s.Receiver != nil {
					c.Sources[i].Receiver = in.renewing(s.Receiver, s.EntityPath)
				}
			}
		}
		return &c, nil
	}
}

// renewingReceiver is a [retry.Receiver] whose lock renewals are traced and timed.
type renewingReceiver struct {
	retry.Receiver
	in     *Instrumentation
	entity string
}

var _ retry.Receiver = (*renewingReceiver)(nil)

// renewing wraps r, a receiver of entity, so that its lock renewals are recorded. A receiver of one
// session (one with a SessionID method) stays one: the consumer refuses a session entity by that
// method unless Options.AllowReorder is set, and the wrapper must not hide it.
func (in *Instrumentation) renewing(r retry.Receiver, entity string) retry.Receiver {
	rr := &renewingReceiver{Receiver: r, in: in, entity: entity}
	if s, ok := r.(interface{ SessionID() string }); ok {
		return &renewingSessionHolder{renewingReceiver: rr, session: s}
	}
	return rr
}

// renewingSessionHolder is a renewingReceiver of one session, which reports its session id.
type renewingSessionHolder struct {
	*renewingReceiver
	session interface{ SessionID() string }
}

// SessionID returns the id of the session the wrapped receiver holds.
func (r *renewingSessionHolder) SessionID() string { return r.session.SessionID() }

// RenewMessageLock renews msg's lock through the wrapped receiver and records the call.
func (r *renewingReceiver) RenewMessageLock(ctx context.Context, msg *azservicebus.ReceivedMessage, options *azservicebus.RenewMessageLockOptions) error {
	// The delivery is looked up before the call: the renewal belongs to the delivery it was made for,
	// even if the delivery ends while the call is in flight.
	d, _ := r.in.live.Load(msg)
	start := time.Now()
	err := r.Receiver.RenewMessageLock(ctx, msg, options)
	dl, _ := d.(*delivery)
	r.in.renewed(dl, msg, r.entity, start, time.Now(), callFailure(ctx, err))
	return err
}

// renewed records one lock renewal of msg, received from entity. messaging.operation.type is left
// out: renew_message_lock is a "receiver operation" name of the Service Bus conventions, but none of
// the operation types (create, send, receive, process, settle) describes it, and the attribute is
// "Conditionally Required If applicable".
// d is the delivery msg belongs to, nil for a message whose handling has not started (received ahead);
// err is the call's failure, nil also for a call its caller cancelled (see callFailure).
func (in *Instrumentation) renewed(d *delivery, msg *azservicebus.ReceivedMessage, entity string, start, end time.Time, err error) {
	parent := context.Background()
	dest, src := parseEntity(entity), parseEntity(entity)
	if s, ok := msg.ApplicationProperties[envelope.PropSource].(string); ok && s != "" {
		src = parseEntity(s)
	}
	var extra []attribute.KeyValue
	if d != nil {
		d.mu.Lock()
		parent, src = d.ctx, d.source
		d.mu.Unlock()
		extra = append(extra, d.sessionAttrs()...)
	}
	if msg.MessageID != "" {
		extra = append(extra, semconv.MessagingMessageID(msg.MessageID))
	}
	in.recordRenewal(parent, opRenewLock, dest, src, extra, start, end, err)
}

// callFailure is the error a call the consumer made on ctx in the background (a lock renewal, a
// receive of deferred messages) is recorded with: err, or nil when the call ended because ctx was
// cancelled. The consumer cancels its own renewals (a message settled, a session released when idle, a
// shutdown), and a call it abandoned did not fail: recording it as an error
// would show a failed dependency where nothing went wrong. The conventions leave this to the
// instrumentation: 'Instrumentations that have additional context about a specific request MAY use
// this context to set the span status more precisely', and 'Errors that were retried or handled
// (allowing an operation to complete gracefully) SHOULD NOT be recorded on spans or metrics that
// describe this operation' (https://opentelemetry.io/docs/specs/semconv/general/recording-errors/).
// A context.Canceled that the caller did not cause, and a deadline (the core's per-call timeout), are
// failures.
func callFailure(ctx context.Context, err error) error {
	if err != nil && errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return err
}

// recordRenewal records one lock renewal (op: a message's or a session's) of a lock on dest, for a
// chain that started on src, made from start to end: a CLIENT span, a child of parent, with the
// conventions' attributes and extra (per message or session: on the span only), and a
// messaging.client.operation.duration measurement.
func (in *Instrumentation) recordRenewal(parent context.Context, op string, dest, src destination, extra []attribute.KeyValue, start, end time.Time, err error) {
	common := append([]attribute.KeyValue{semconv.MessagingSystemServiceBus, semconv.MessagingOperationName(op)}, in.metrics.entityAttrs(dest, src)...)
	if err != nil {
		common = append(common, semconv.ErrorTypeKey.String(errorType(err)))
	}
	_, span := in.tracer.Start(parent, dest.spanName(op),
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(start),
		trace.WithAttributes(common...),
		trace.WithAttributes(extra...),
	)
	if err != nil {
		span.SetStatus(codes.Error, statusText(err))
	}
	span.End(trace.WithTimestamp(end))
	in.metrics.recordOperation(parent, end.Sub(start), common)
}
