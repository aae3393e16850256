package retryotel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/outage"
)

// Names of the metrics of our own. The semantic-convention ones, messaging.process.duration,
// messaging.client.consumed.messages, messaging.client.sent.messages and
// messaging.client.operation.duration, are created through the
// semconv messagingconv package, so their names, units and descriptions are the spec's
// (https://opentelemetry.io/docs/specs/semconv/messaging/messaging-metrics/).
const (
	// MetricHandlerDuration is how long the handler ran (histogram, s); messaging.process.duration
	// covers the whole delivery, settles included, like the process span.
	MetricHandlerDuration = "sbretry.handler.duration"
	// MetricRetriesScheduled counts retry copies scheduled, by the failed attempt (sbretry.attempt).
	MetricRetriesScheduled = "sbretry.retries.scheduled"
	// MetricDeadLettered counts messages dead-lettered by the processor, by sbretry.dead_letter.reason.
	MetricDeadLettered = "sbretry.dead_lettered"
	// MetricLeftForRedelivery counts deliveries deliberately left unsettled, by error.type when a
	// settle failed.
	MetricLeftForRedelivery = "sbretry.left_for_redelivery"
	// MetricPossibleDuplicates counts retries scheduled whose original could not be completed.
	MetricPossibleDuplicates = "sbretry.possible_duplicates"
	// MetricConsumerState is, per sbretry.consumer.state, the number of consumers in that state (an
	// up-down counter: each consumer contributes 1 to its current state, like hw.status). A consumer is
	// counted from its first state change; idle is never reported.
	MetricConsumerState = "sbretry.consumer.state"
	// MetricHeld counts messages held by the outage breaker (retry.OutcomeHeld): rescheduled at the same
	// attempt for the breaker's next probe.
	MetricHeld = "sbretry.held"
	// MetricDiscarded counts failed messages a retry policy discarded (retry.OutcomeDiscarded), by
	// sbretry.policy.
	MetricDiscarded = "sbretry.discarded"
	// MetricOutageChanges counts the outage breaker's changes of state, by sbretry.outage.from,
	// sbretry.outage.to and sbretry.outage.manual, with the consumer's entity and the server: trips are closed to open, probes open to half-open,
	// failed probes half-open to open, resumes anything to closed.
	MetricOutageChanges = "sbretry.outage.changes"
	// MetricDeadLetterDepth is the number of messages in an entity's dead-letter queue (gauge), as last
	// reported to [Instrumentation.RecordDeadLetterDepth].
	MetricDeadLetterDepth = "sbretry.dead_letter.depth"
)

// durationBuckets are the explicit bucket boundaries the messaging metric conventions ask for on
// their duration histograms.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// instruments holds every metric instrument of an Instrumentation.
type instruments struct {
	processDuration    metric.Float64Histogram
	consumed           metric.Int64Counter
	sent               metric.Int64Counter
	operationDuration  metric.Float64Histogram
	handlerDuration    metric.Float64Histogram
	retriesScheduled   metric.Int64Counter
	deadLettered       metric.Int64Counter
	leftForRedelivery  metric.Int64Counter
	possibleDuplicates metric.Int64Counter
	held               metric.Int64Counter
	discarded          metric.Int64Counter
	outageChanges      metric.Int64Counter
	consumerState      metric.Int64UpDownCounter

	// server holds server.address and server.port, on every span and metric: from Options.ServerAddress,
	// or else learned from the first connection that reports its address (see Instrumentation.Connector).
	server      atomic.Pointer[[]attribute.KeyValue]
	fixedServer bool // set from the Options: connections do not change it
	// outcome puts sbretry.outcome on the duration histograms (Options.DurationOutcome).
	outcome bool

	mu    sync.Mutex
	depth map[destination]int64
}

// newInstruments creates the instruments on m; outcome is Options.DurationOutcome.
func newInstruments(m metric.Meter, server []attribute.KeyValue, outcome bool) (*instruments, error) {
	in := &instruments{depth: map[destination]int64{}, fixedServer: len(server) > 0, outcome: outcome}
	in.server.Store(&server)
	var errs []error
	collect := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	// Collect every failure rather than stop at the first: a MeterProvider that refuses one name
	// usually refuses for a reason worth seeing in full.
	pd, err := messagingconv.NewProcessDuration(m, metric.WithExplicitBucketBoundaries(durationBuckets...))
	collect(err)
	in.processDuration = pd.Inst()
	cm, err := messagingconv.NewClientConsumedMessages(m)
	collect(err)
	in.consumed = cm.Inst()
	sm, err := messagingconv.NewClientSentMessages(m)
	collect(err)
	in.sent = sm.Inst()
	od, err := messagingconv.NewClientOperationDuration(m, metric.WithExplicitBucketBoundaries(durationBuckets...))
	collect(err)
	in.operationDuration = od.Inst()
	in.handlerDuration, err = m.Float64Histogram(MetricHandlerDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of the handler call of a delivery."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	collect(err)
	counter := func(name, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit("{message}"), metric.WithDescription(desc))
		collect(err)
		return c
	}
	in.retriesScheduled = counter(MetricRetriesScheduled, "Number of retry copies scheduled after a failed attempt.")
	in.deadLettered = counter(MetricDeadLettered, "Number of messages dead-lettered by the retry processor.")
	in.leftForRedelivery = counter(MetricLeftForRedelivery, "Number of deliveries left unsettled for the broker to redeliver.")
	in.possibleDuplicates = counter(MetricPossibleDuplicates, "Number of retries scheduled whose original message could not be completed.")
	in.held = counter(MetricHeld, "Number of messages held by the outage breaker without spending an attempt.")
	in.discarded = counter(MetricDiscarded, "Number of failed messages discarded by a retry policy.")
	in.outageChanges, err = m.Int64Counter(MetricOutageChanges, metric.WithUnit("{change}"),
		metric.WithDescription("Number of state changes of the outage breaker."))
	collect(err)
	in.consumerState, err = m.Int64UpDownCounter(MetricConsumerState, metric.WithUnit("{consumer}"),
		metric.WithDescription("Number of consumers in each state."))
	collect(err)
	depth, err := m.Int64ObservableGauge(MetricDeadLetterDepth, metric.WithUnit("{message}"),
		metric.WithDescription("Number of messages in the dead-letter queue of an entity, as last polled."))
	collect(err)
	// The depth is observed, not recorded: a gauge reports the latest poll per entity at every
	// collection, however rarely the monitor polls.
	if err == nil {
		_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
			in.mu.Lock()
			defer in.mu.Unlock()
			for d, n := range in.depth {
				o.ObserveInt64(depth, n, metric.WithAttributes(append(d.attrs(), in.serverAttrs()...)...))
			}
			return nil
		}, depth)
		collect(err)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("retryotel: creating metric instruments: %w", errors.Join(errs...))
	}
	return in, nil
}

// recordProcessed records the metrics of one processed delivery, received from dest on a chain that
// started on src. errType is the delivery's error.type, empty when it succeeded; handlerRan is false
// for a delivery whose handler was never going to run (OnStart was skipped) or did not run (an
// inherited outcome).
func (in *instruments) recordProcessed(ctx context.Context, p retry.ProcessedParams, dest, src destination, errType string, handlerRan bool) {
	// Metric attributes stay low in cardinality: the entity, the chain's source entity, the operation,
	// the error type and our own bounded enums (attempt numbers up to MaxAttempts, reasons from
	// DeadLetterReasons), and the outcome on the durations only when the Options ask for it. Message
	// ids and chain ids go on spans only.
	res := p.Result
	where := in.entityAttrs(dest, src)
	// Once per delivery. The core pulls every message with a receive call, and this package does not
	// instrument that call, so the delivery is counted here, under the receive operation the
	// conventions name for this metric. messaging.operation.type is not among this metric's attributes
	// in the conventions (nor among messaging.process.duration's), so neither carries it.
	in.consumed.Add(ctx, 1, metric.WithAttributes(append([]attribute.KeyValue{semconv.MessagingSystemServiceBus, semconv.MessagingOperationName(opReceive)}, where...)...))
	timed := append([]attribute.KeyValue{semconv.MessagingSystemServiceBus, semconv.MessagingOperationName(opProcess)}, where...)
	if in.outcome {
		timed = append(timed, AttrOutcome.String(res.Outcome.String()))
	}
	if errType != "" {
		timed = append(timed, semconv.ErrorTypeKey.String(errType))
	}
	in.processDuration.Record(ctx, p.Duration.Seconds(), metric.WithAttributes(timed...))
	if handlerRan && !res.Inherited {
		in.handlerDuration.Record(ctx, p.HandlerDuration.Seconds(), metric.WithAttributes(timed...))
	}
	with := func(kv ...attribute.KeyValue) metric.AddOption {
		return metric.WithAttributes(append(append([]attribute.KeyValue{semconv.MessagingSystemServiceBus}, where...), kv...)...)
	}
	// One counter per outcome rather than one counter with an outcome attribute: each answers an
	// alert of its own (retries piling up, any dead letter, settles failing) without a filter.
	switch res.Outcome {
	case retry.OutcomeRetryScheduled:
		in.retriesScheduled.Add(ctx, 1, with(AttrAttempt.Int(res.Attempt)))
	case retry.OutcomeDeadLettered:
		in.deadLettered.Add(ctx, 1, with(AttrDeadLetterReason.String(res.DeadLetterReason)))
	case retry.OutcomeHeld:
		in.held.Add(ctx, 1, with())
	case retry.OutcomeDiscarded:
		in.discarded.Add(ctx, 1, with(AttrPolicy.String(res.Policy)))
	case retry.OutcomeLeftForRedelivery:
		var kv []attribute.KeyValue
		if res.SettleErr != nil {
			kv = append(kv, semconv.ErrorTypeKey.String(errorType(res.SettleErr)))
		}
		in.leftForRedelivery.Add(ctx, 1, with(kv...))
	}
	if res.PossibleDuplicate {
		in.possibleDuplicates.Add(ctx, 1, with(AttrAttempt.Int(res.Attempt)))
	}
}

// entityAttrs are the attributes that say where a delivery was and where its chain started: the
// destination, the server and the chain's source.
func (in *instruments) entityAttrs(dest, src destination) []attribute.KeyValue {
	kv := append(dest.attrs(), in.serverAttrs()...)
	return append(kv, src.sourceAttrs()...)
}

// recordSent counts one message the processor attempted to send (a retry copy), with the schedule
// span's low-cardinality attributes. The conventions count attempts: "Number of messages producer
// attempted to send to the broker", with error.type when the send failed.
func (in *instruments) recordSent(ctx context.Context, attrs []attribute.KeyValue) {
	in.sent.Add(ctx, 1, metric.WithAttributes(attrs...))
}

// recordConsumed counts n messages a peek or receive of an operator tool returned, with the call's
// low-cardinality attributes. A reply of none is recorded too (as zero), so the series exists and a
// failed receive is seen with its error.type.
func (in *instruments) recordConsumed(ctx context.Context, n int64, attrs []attribute.KeyValue) {
	in.consumed.Add(ctx, n, metric.WithAttributes(attrs...))
}

// recordOperation records one broker call in messaging.client.operation.duration; attrs are the
// settle span's low-cardinality attributes.
func (in *instruments) recordOperation(ctx context.Context, d time.Duration, attrs []attribute.KeyValue) {
	in.operationDuration.Record(ctx, d.Seconds(), metric.WithAttributes(attrs...))
}

// stateChanged moves one consumer from its old state to its new one.
func (in *instruments) stateChanged(p retry.StateChangeParams) {
	ctx := context.Background() // the hook carries no context
	if p.From != retry.StateIdle {
		in.consumerState.Add(ctx, -1, metric.WithAttributes(AttrConsumerState.String(p.From.String())))
	}
	if p.To != retry.StateIdle {
		in.consumerState.Add(ctx, 1, metric.WithAttributes(AttrConsumerState.String(p.To.String())))
	}
}

// outageChanged counts one change of the outage breaker.
func (in *instruments) outageChanged(p outage.Change) {
	kv := []attribute.KeyValue{AttrOutageFrom.String(p.From.String()), AttrOutageTo.String(p.To.String()), AttrOutageManual.Bool(p.Manual)}
	if p.EntityPath != "" {
		kv = append(kv, parseEntity(p.EntityPath).attrs()...)
	}
	in.outageChanges.Add(context.Background(), 1, metric.WithAttributes(append(kv, in.serverAttrs()...)...))
}

// serverAttrs returns server.address and server.port, if known.
func (in *instruments) serverAttrs() []attribute.KeyValue { return *in.server.Load() }

// learnServer takes server.address and server.port from a connection's address (host:port), unless
// the Options set them. The latest connection's address wins: one Instrumentation serves one namespace.
func (in *instruments) learnServer(addr string) {
	if in.fixedServer || addr == "" {
		return
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return
	}
	kv := []attribute.KeyValue{semconv.ServerAddress(host)}
	if p, err := strconv.Atoi(port); err == nil && p > 0 {
		kv = append(kv, semconv.ServerPort(p))
	}
	in.server.Store(&kv)
}

// recordDeadLetterDepth keeps n as entity's latest dead-letter count.
func (in *instruments) recordDeadLetterDepth(entity string, n int64) {
	in.mu.Lock()
	in.depth[parseEntity(entity)] = n
	in.mu.Unlock()
}
