package retryotel

import (
	"context"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/redact"
	"github.com/sbretry/retry/sessionstate"
)

// statusLimit bounds the error text put in a span status. Error texts are redacted like the core's logs.
const statusLimit = 1024

// delivery is the telemetry state of one delivery, from OnStart to OnProcessed. Today the processor
// runs one delivery's hooks one after another on one goroutine, but retry.Hooks does not promise it
// (a settle the consumer abandons may one day report from elsewhere), so the mutable fields are guarded.
type delivery struct {
	mu   sync.Mutex
	ctx  context.Context // carries span
	span trace.Span
	dest destination
	// source is where the delivery's retry chain started (the envelope's Source).
	source destination
	// session is the message's session id ([AttrSessionID]), empty on an entity without sessions.
	session string
	// started is true when OnStart ran: the handler was about to run.
	started bool
	// origin is the chain's creation context, written into the retry copy.
	origin trace.SpanContext
	// copyID and copyAttempt describe the retry copy OnRetryCopy saw, for the schedule span.
	copyID       string
	copyAttempt  int
	scheduledFor time.Time
	// injected is the creation context written into the retry copy (the process span's), which the
	// schedule span links to.
	injected trace.SpanContext
}

type deliveryKey struct{}

// deliveryFrom returns the delivery state OnStart put into ctx, if any.
func deliveryFrom(ctx context.Context) *delivery {
	if ctx == nil {
		return nil
	}
	d, _ := ctx.Value(deliveryKey{}).(*delivery)
	return d
}

// onStart starts the process span of a delivery. Its parent is the ambient context (or, with
// ParentFromMessage, the message's); it links to the message's creation context and, on a retry copy,
// to the chain's origin. See "Consumer spans" in
// https://opentelemetry.io/docs/specs/semconv/messaging/messaging-spans/.
func (in *Instrumentation) onStart(p retry.StartParams) context.Context {
	ctx := p.Context
	if ctx == nil {
		ctx = context.Background()
	}
	if p.Rerun > 0 && p.Message != nil {
		// A further attempt in the same delivery (an immediate retry, a retry held in place): it stays
		// in the delivery's process span, which OnProcessed ends once.
		if v, ok := in.live.Load(p.Message); ok {
			d := v.(*delivery)
			return context.WithValue(d.ctx, deliveryKey{}, d)
		}
	}
	d := in.startDelivery(ctx, p.Message, p.Envelope, p.EntityPath, time.Time{})
	d.started = true
	if p.Message != nil {
		in.live.Store(p.Message, d)
	}
	if d.session != "" {
		in.sessions.Store(sessionKey{entity: p.EntityPath, id: d.session}, d)
	}
	return context.WithValue(d.ctx, deliveryKey{}, d)
}

// startDelivery starts the process span; a zero start means now.
func (in *Instrumentation) startDelivery(ctx context.Context, msg *azservicebus.ReceivedMessage, env envelope.Envelope, entity string, start time.Time) *delivery {
	d := &delivery{dest: parseEntity(entity), source: chainSource(env, entity), session: sessionOf(ctx, msg)}
	var props map[string]any
	if msg != nil {
		props = msg.ApplicationProperties
	}
	inc := in.extract(props)
	// Baggage is the producer's request-scoped data (a tenant, a feature flag): it travels to the handler
	// whether the message's context becomes the parent or only a link.
	if bag := baggage.FromContext(inc.ctx); bag.Len() > 0 {
		ctx = baggage.ContextWithBaggage(ctx, bag)
	}
	// By default the parent stays the ambient context (the consumer's, usually none), so a delivery
	// processed inside another span is not torn out of it; the message's context is a link either way.
	if in.parentMsg && inc.creation.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, inc.creation)
	}

	// Links are fixed at span start (samplers see them), so they are decided here from the properties
	// alone. The origin is what this delivery passes on to its retry copy.
	var links []trace.Link
	switch {
	case inc.creation.IsValid() && env.Attempt > 1 && inc.origin.IsValid():
		// A copy written by this package: traceparent is the previous attempt.
		links = append(links, trace.Link{SpanContext: inc.creation, Attributes: []attribute.KeyValue{
			AttrLink.String(LinkPreviousAttempt), AttrAttempt.Int(env.Attempt - 1),
		}})
		if !inc.origin.Equal(inc.creation) {
			links = append(links, trace.Link{SpanContext: inc.origin, Attributes: []attribute.KeyValue{AttrLink.String(LinkCreation)}})
		}
		d.origin = inc.origin
	case inc.creation.IsValid():
		// A first delivery from a traced producer (or a copy written without this package).
		links = append(links, trace.Link{SpanContext: inc.creation, Attributes: []attribute.KeyValue{AttrLink.String(LinkCreation)}})
		d.origin = inc.creation
	case inc.origin.IsValid():
		// A copy whose traceparent was lost (rewritten by a tool, say): the origin still ties it in.
		links = append(links, trace.Link{SpanContext: inc.origin, Attributes: []attribute.KeyValue{AttrLink.String(LinkCreation)}})
		d.origin = inc.origin
	}

	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(links...),
		trace.WithAttributes(in.processAttributes(msg, env, d.dest, d.source)...),
		trace.WithAttributes(d.sessionAttrs()...),
	}
	if !start.IsZero() {
		opts = append(opts, trace.WithTimestamp(start))
	}
	d.ctx, d.span = in.tracer.Start(ctx, d.dest.spanName(opProcess), opts...)
	if !d.origin.IsValid() {
		// A chain with no traced producer starts here: later attempts link back to this span.
		d.origin = d.span.SpanContext()
	}
	return d
}

// processAttributes are the process span's attributes known at its start. The conventions want the
// destination and operation ones at span creation, for samplers.
func (in *Instrumentation) processAttributes(msg *azservicebus.ReceivedMessage, env envelope.Envelope, dest, src destination) []attribute.KeyValue {
	kv := make([]attribute.KeyValue, 0, 18)
	kv = append(kv,
		semconv.MessagingSystemServiceBus,
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName(opProcess),
	)
	kv = append(kv, in.metrics.entityAttrs(dest, src)...)
	if msg != nil {
		if msg.MessageID != "" {
			kv = append(kv, semconv.MessagingMessageID(msg.MessageID))
		}
		if msg.CorrelationID != nil && *msg.CorrelationID != "" {
			kv = append(kv, semconv.MessagingMessageConversationID(*msg.CorrelationID))
		}
		// Conditionally required "if delivery count is available and is bigger than 0".
		if msg.DeliveryCount > 0 {
			kv = append(kv, semconv.MessagingServiceBusMessageDeliveryCount(int(msg.DeliveryCount)))
		}
		if msg.EnqueuedTime != nil {
			// "The UTC epoch seconds at which the message has been accepted and stored in the entity."
			kv = append(kv, semconv.MessagingServiceBusMessageEnqueuedTimeKey.Int64(msg.EnqueuedTime.Unix()))
		}
	}
	if env.Attempt > 0 {
		kv = append(kv, AttrAttempt.Int(env.Attempt))
	}
	if env.Source != "" || env.FirstSequenceNumber >= 0 || env.OriginalMessageID != "" {
		kv = append(kv, AttrChainID.String(env.ChainID()))
	}
	if env.CorrelationID != "" {
		kv = append(kv, AttrCorrelationID.String(env.CorrelationID))
	}
	return kv
}

// onRetryCopy writes the process span's context into the retry copy, so attempt n+1 links to attempt
// n, and remembers the copy for the schedule span.
func (in *Instrumentation) onRetryCopy(p retry.RetryCopyParams) {
	d := deliveryFrom(p.Context)
	if d == nil || p.Copy == nil {
		return
	}
	if p.Copy.ApplicationProperties == nil {
		p.Copy.ApplicationProperties = map[string]any{}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if in.inject(d.ctx, p.Copy.ApplicationProperties, d.origin) {
		d.injected = d.span.SpanContext()
	}
	if p.Copy.MessageID != nil {
		d.copyID = *p.Copy.MessageID
	}
	d.copyAttempt, d.scheduledFor = p.Attempt, p.ScheduledFor
}

// deliveryFor finds the delivery a settle or processed hook belongs to, starting a process span for a
// delivery whose OnStart never ran (a message dead-lettered for malformed retry properties).
func (in *Instrumentation) deliveryFor(ctx context.Context, msg *azservicebus.ReceivedMessage, env envelope.Envelope, entity string, start time.Time) *delivery {
	if d := deliveryFrom(ctx); d != nil {
		return d
	}
	if msg != nil {
		if v, ok := in.orphans.Load(msg); ok {
			return v.(*delivery)
		}
	}
	if ctx == nil {
		ctx = context.Background()
	}
	d := in.startDelivery(ctx, msg, env, entity, start)
	if msg != nil {
		in.orphans.Store(msg, d)
	}
	return d
}

// onSettle records one broker call as a child span of the process span. The hook reports after the
// call, so the span is placed by explicit timestamps: it ends now and lasts the reported Duration
// (measured on the processor's clock; the span's own times are on the tracer's, like the process span).
// Settle operations ("complete", "dead_letter", "defer") have operation type settle and the Service Bus
// disposition status, on the entity the message was received from. The schedule of a retry copy is a
// send operation named "schedule" on the entity the copy goes to (see copyDestination); it links to
// the creation context written into the copy, as the conventions ask: 'The "Send" span SHOULD always
// link to the creation context that was injected into a message either from a "Create" span or as a
// custom creation context' (https://opentelemetry.io/docs/specs/semconv/messaging/messaging-spans/),
// and it counts in messaging.client.sent.messages. All are CLIENT spans: 'send: PRODUCER if the
// context of the "Send" span is used as creation context, otherwise CLIENT', and the process span's
// context is the copy's creation context.
//
// A session consumer that reports a durable hold's wake-up (issue 29, item 12) gives, besides the defer
// of the held message, the wake-up's schedule (a "schedule" span of the held attempt, the wake-up's
// MessageID in RetryMessageID) and, once the wake-up came back and was handled, its complete. A wake-up
// is no delivery (it never reaches the handler, and no OnStart or OnProcessed reports it), so its
// complete is a span of its own, a child of the context the hook passes, with no process span around
// it.
func (in *Instrumentation) onSettle(p retry.SettleParams) {
	end := time.Now()
	start := end.Add(-p.Duration)
	var parent context.Context
	var dest, src destination
	var session, copyID string
	var copyAttempt int
	var scheduledFor time.Time
	var injected trace.SpanContext
	if _, wake := sessionstate.IsWakeUp(p.Message); wake && deliveryFrom(p.Context) == nil {
		parent, dest = orBackground(p.Context), parseEntity(p.EntityPath)
		src, session = dest, sessionOf(p.Context, p.Message)
	} else {
		d := in.deliveryFor(p.Context, p.Message, p.Envelope, p.EntityPath, start)
		// Copy what the span needs under the lock and create the span outside it.
		d.mu.Lock()
		parent, dest, src, session = d.ctx, d.dest, d.source, d.session
		copyID, copyAttempt, scheduledFor, injected = d.copyID, d.copyAttempt, d.scheduledFor, d.injected
		d.mu.Unlock()
	}
	// The message a schedule sent: the hook's RetryMessageID, which for a retry copy is the id
	// OnRetryCopy saw, and for a wake-up the wake-up's (OnRetryCopy then saw the held message, whose
	// deferral carries the trace context).
	scheduled := p.RetryMessageID
	if scheduled == "" {
		scheduled = copyID
	}

	var op string
	var opType attribute.KeyValue
	var extra []attribute.KeyValue
	var links []trace.Link
	switch p.Operation {
	case retry.SettleSchedule:
		op, opType = opSchedule, semconv.MessagingOperationTypeSend
		dest = in.copyDestination(dest, p.EntityPath)
		if scheduled != "" {
			extra = append(extra, semconv.MessagingMessageID(scheduled))
		}
		if copyAttempt > 0 {
			extra = append(extra, AttrAttempt.Int(copyAttempt-1))
		}
		if !scheduledFor.IsZero() {
			extra = append(extra, AttrRetryScheduledFor.String(scheduledFor.UTC().Format(time.RFC3339Nano)))
		}
		// The link is to the creation context written into the message scheduled, so only when
		// OnRetryCopy wrote it into that message.
		if injected.IsValid() && (copyID == "" || copyID == scheduled) {
			var la []attribute.KeyValue
			if scheduled != "" {
				la = append(la, semconv.MessagingMessageID(scheduled))
			}
			links = append(links, trace.Link{SpanContext: injected, Attributes: la})
		}
	case retry.SettleComplete:
		op, opType = opComplete, semconv.MessagingOperationTypeSettle
		extra = append(extra, semconv.MessagingServiceBusDispositionStatusComplete)
	case retry.SettleDeadLetter:
		op, opType = opDeadLetter, semconv.MessagingOperationTypeSettle
		extra = append(extra, semconv.MessagingServiceBusDispositionStatusDeadLetter)
	case retry.SettleDefer:
		// A session consumer's durable hold defers the message: "defer" is one of the conventions'
		// Service Bus settlement operations, and messaging.servicebus.disposition_status is
		// "Conditionally Required if and only if messaging.operation is settle", its values complete,
		// abandon, dead_letter and defer (https://opentelemetry.io/docs/specs/semconv/messaging/azure-messaging/).
		op, opType = opDefer, semconv.MessagingOperationTypeSettle
		extra = append(extra, semconv.MessagingServiceBusDispositionStatusDefer)
	default:
		op = p.Operation // a future operation of the core: reported under its own name
	}
	// A settle acts on the received message; a schedule sends the copy, whose id OnRetryCopy recorded.
	if p.Operation != retry.SettleSchedule && p.Message != nil && p.Message.MessageID != "" {
		extra = append(extra, semconv.MessagingMessageID(p.Message.MessageID))
	}
	if session != "" {
		extra = append(extra, AttrSessionID.String(session))
	}
	// common goes on the span and the metrics; extra (per message) on the span only.
	common := append([]attribute.KeyValue{semconv.MessagingSystemServiceBus, semconv.MessagingOperationName(op)}, in.metrics.entityAttrs(dest, src)...)
	if p.Err != nil {
		common = append(common, semconv.ErrorTypeKey.String(errorType(p.Err)))
	}
	withType := common
	if opType.Valid() {
		withType = append(common[:len(common):len(common)], opType)
	}
	_, span := in.tracer.Start(parent, dest.spanName(op),
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(start),
		trace.WithLinks(links...),
		trace.WithAttributes(withType...),
		trace.WithAttributes(extra...),
	)
	if p.Err != nil {
		span.SetStatus(codes.Error, statusText(p.Err))
	}
	span.End(trace.WithTimestamp(end))
	in.metrics.recordOperation(parent, p.Duration, withType)
	if p.Operation == retry.SettleSchedule {
		// messaging.client.sent.messages has no messaging.operation.type among its attributes.
		in.metrics.recordSent(parent, common)
	}
}

// copyDestination is where the retry copy of a delivery received from dest (entity) is scheduled to:
// the retry queue [Instrumentation.Connector] learned for entity; else, for a queue, the queue itself
// (the core's queue connectors schedule the copy back to the queue it came from); else (a subscription,
// whose copies go to a retry queue this package was not told about) unknown, so that the schedule is
// not attributed to the topic, where the copy never goes.
func (in *Instrumentation) copyDestination(dest destination, entity string) destination {
	if entity != "" {
		if q, ok := in.retryQueues.Load(entity); ok {
			return parseEntity(q.(string))
		}
	}
	if dest.subscription != "" {
		return destination{}
	}
	return dest
}

// onProcessed puts the outcome on the process span and records the delivery's metrics. It returns the
// function that ends the span, which the composed hook calls after the user's OnProcessed.
func (in *Instrumentation) onProcessed(p retry.ProcessedParams) (end func()) {
	d := deliveryFrom(p.Context)
	if d == nil && p.Message != nil {
		if v, ok := in.orphans.LoadAndDelete(p.Message); ok {
			d = v.(*delivery)
		}
	}
	if p.Message != nil {
		in.live.CompareAndDelete(p.Message, d)
	}
	if d != nil && d.session != "" {
		in.sessions.CompareAndDelete(sessionKey{entity: p.EntityPath, id: d.session}, d)
	}
	if d == nil {
		d = in.startDelivery(orBackground(p.Context), p.Message, p.Envelope, p.EntityPath, time.Now().Add(-p.Duration))
	}
	d.mu.Lock()
	if d.dest == (destination{}) && p.EntityPath != "" {
		// A delivery first seen by OnSettle, which does not say the entity.
		d.dest = parseEntity(p.EntityPath)
		d.source = chainSource(p.Envelope, p.EntityPath)
		d.span.SetName(d.dest.spanName(opProcess))
		d.span.SetAttributes(d.dest.attrs()...)
		d.span.SetAttributes(d.source.sourceAttrs()...)
	}
	dest, src, span, started := d.dest, d.source, d.span, d.started
	d.mu.Unlock()

	// The outcome is known only now; attributes set after the start are still exported with the span,
	// they are just invisible to head samplers, which the conventions accept for non-sampling ones.
	res := p.Result
	kv := []attribute.KeyValue{
		AttrOutcome.String(res.Outcome.String()),
		AttrInherited.Bool(res.Inherited),
		AttrPossibleDuplicate.Bool(res.PossibleDuplicate),
	}
	if res.Attempt > 0 {
		kv = append(kv, AttrAttempt.Int(res.Attempt))
	}
	if res.RetryMessageID != "" {
		kv = append(kv, AttrRetryMessageID.String(res.RetryMessageID))
	}
	// "Is it going to be retried, and when?": the due time and the copy's sequence number (what an
	// operator cancels it by), also when the copy was scheduled but the original could not be completed.
	if res.Policy != "" {
		kv = append(kv, AttrPolicy.String(res.Policy))
	}
	if res.ImmediateRetries > 0 {
		kv = append(kv, AttrImmediateRetries.Int(res.ImmediateRetries))
	}
	if res.Outcome == retry.OutcomeRetryScheduled || res.Outcome == retry.OutcomeHeld || res.PossibleDuplicate {
		kv = append(kv,
			AttrRetryScheduledFor.String(res.ScheduledFor.UTC().Format(time.RFC3339Nano)),
			AttrRetryDelay.Float64(res.Delay.Seconds()),
			AttrRetrySequenceNumber.Int64(res.SequenceNumber),
		)
	}
	if res.DeadLetterReason != "" {
		kv = append(kv, AttrDeadLetterReason.String(res.DeadLetterReason))
	}
	// The processing failed when the handler did, and also when it succeeded but the message could not
	// be settled (the broker redelivers it).
	failure := res.HandlerErr
	if failure == nil {
		failure = res.SettleErr
	}
	errType := ""
	if failure != nil {
		errType = errorType(failure)
		kv = append(kv, semconv.ErrorTypeKey.String(errType))
		span.SetStatus(codes.Error, statusText(failure))
	}
	span.SetAttributes(kv...)
	// The metrics are recorded in the span's context, so an exemplar-aware SDK links them to the trace.
	in.metrics.recordProcessed(d.ctx, p, dest, src, errType, started)
	return func() { span.End() }
}

// sessionOf is the session id of a delivery: the one the session consumer puts in the handler's context
// (retry.SessionIDFromContext), else the message's own SessionID (a message of a session-enabled entity
// that a queue consumer with Options.AllowReorder receives). Empty means none.
func sessionOf(ctx context.Context, msg *azservicebus.ReceivedMessage) string {
	if ctx != nil {
		if id, ok := retry.SessionIDFromContext(ctx); ok {
			return id
		}
	}
	if msg != nil && msg.SessionID != nil {
		return *msg.SessionID
	}
	return ""
}

// sessionAttrs is [AttrSessionID] for a delivery of a session, else nothing. session is set once, at
// the delivery's start, so it is read without the lock.
func (d *delivery) sessionAttrs() []attribute.KeyValue {
	if d.session == "" {
		return nil
	}
	return []attribute.KeyValue{AttrSessionID.String(d.session)}
}

func orBackground(ctx context.Context) context.Context {
	if ctx == nil {
		return context.Background()
	}
	return ctx
}

// statusText is err's text for a span status: redacted (a connection string in an error must not reach
// a tracing backend) and bounded.
func statusText(err error) string {
	s := redact.String(err.Error())
	if len(s) > statusLimit {
		cut := statusLimit
		for cut > 0 && s[cut]&0xC0 == 0x80 {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}
