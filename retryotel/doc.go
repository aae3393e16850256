// Package retryotel instruments [retry] consumers with OpenTelemetry: a consumer "process" span per
// delivery with child spans for its broker calls, trace context carried from each attempt into its
// retry copy, and metrics for processing, retries, dead letters and consumer state; and the operator
// tools' broker calls (see "Operator tools" below). Names follow the
// messaging semantic conventions and their Azure Service Bus part
// (https://opentelemetry.io/docs/specs/semconv/messaging/azure-messaging/), version 1.43.0; our own
// attributes and metrics are under the sbretry. prefix.
//
// It depends on the OpenTelemetry API only: bring your own SDK and exporter. Setup wraps two things
// the consumer already takes, its connector and its hooks:
//
//	inst, err := retryotel.New(nil) // the global TracerProvider, MeterProvider and propagator
//	if err != nil {
//		return err
//	}
//	consumer, err := retry.NewConsumer(inst.Connector(connect), handler, &retry.Options{
//		Hooks: inst.Hooks(retry.Hooks{}), // pass your own hooks here: both run
//	})
//
// Use both. [Instrumentation.Hooks] gives the process spans, the spans of the settles and schedules
// and the metrics; [Instrumentation.Connector] gives what no hook reports: server.address and
// server.port (which the conventions require when available), learned from the connection's
// [retry.Connection].Address that the built-in connectors set; the lock renewals; and the name of a
// subscription's retry queue. With the hooks alone, nothing carries the server and no renewal is
// traced. With a connector that sets no Address, or to report another name, set
// [Options].ServerAddress and ServerPort (for example from [ServerFromConnectionString]).
//
// A [retry.SessionConsumer] is instrumented the same way, its connector wrapped by
// [Instrumentation.SessionConnector] (which adds the session lock renewals and learns the server):
//
//	consumer, err := retry.NewSessionConsumer(inst.SessionConnector(connect), handler, &retry.Options{
//		Hooks: inst.Hooks(retry.Hooks{}),
//	}, nil)
//
// # Trace shape
//
// Each delivery gets a span "process <queue or topic>" of kind CONSUMER, a child of the context the
// consumer runs in, linked (as the conventions recommend) to the creation context the message carries
// in its traceparent, tracestate or Diagnostic-Id application properties. Its broker calls are child
// spans: "schedule <entity>" (the retry copy, on the entity the copy goes to: the queue itself, or a
// subscription's retry queue), "complete <entity>", "dead_letter <entity>" and, through
// [Instrumentation.Connector], "renew_message_lock <entity>". Before a
// retry copy is scheduled, the process span's context is written into the copy, so attempt n+1's span
// links to attempt n's; every copy also carries the chain's creation context (see
// [PropOriginTraceparent]), so each attempt links straight back to the producer too, and all attempts
// share the attribute sbretry.chain_id. Set [Options].ParentFromMessage to make the whole history
// one trace instead.
//
// A session consumer retries in place: a message's attempts are all in its one process span, which
// has the "complete" or "dead_letter" child of the message and, through
// [Instrumentation.SessionConnector], the "renew_session_lock <entity>" spans of the session lock
// renewed while it was handled or held. Every span of a message received from a session carries its
// session id in [AttrSessionID] (the conventions define no attribute for it); metrics do not.
//
// A retry too long to hold in place becomes a durable hold (retry.SessionOptions.DurableHolds): the
// message is deferred, and its held attempt's process span ends with outcome "deferred" and a
// "defer <entity>" child (operation type settle, disposition status defer). When the hold is due, the
// message is received back by its sequence number, a "receive_deferred <entity>" span through
// [Instrumentation.SessionConnector], and the attempt it resumes has a process span of its own, which
// links to the held attempt's (as a retry copy's does) when the deferral carried that attempt's trace
// context, written by OnRetryCopy. The hold's wake-up is a control message, never a delivery: when
// the consumer reports it to OnSettle, its schedule (for the held delivery) is a "schedule <entity>"
// child of the held attempt that counts in messaging.client.sent.messages, and its complete (with the
// wake-up as the message) a "complete <entity>" span of its own, with no process span.
//
// # Where a chain belongs
//
// A subscription's retries are scheduled to and received from its retry queue, so from the second
// attempt on messaging.destination.name is the retry queue and messaging.destination.subscription.name
// (which the conventions set only on what is received from a subscription) is absent. Every span and
// metric of every attempt also carries sbretry.source.name and sbretry.source.subscription.name, the
// entity the chain started on (its sbretry-source property): filter on those to see all of a
// subscription's deliveries and retries.
//
// # Operator tools
//
// The inspector, the dead-letter monitor and what is built on them (cmd/sbretry, the console) are
// instrumented the same way, without depending on OpenTelemetry themselves. An Instrumentation is an
// inspect.Observer ([Instrumentation.StartCall]): pass it as inspect.Options.Observer, and every peek,
// cancel and, for a redrive or purge of the inspector's selections, every receive, send, complete and
// abandon becomes a CLIENT span ("peek orders", "send billing-retry", "cancel_scheduled orders") with
// the conventions' attributes, and counts in messaging.client.operation.duration, in
// messaging.client.consumed.messages (peeks and receives, by the messages they returned) or in
// messaging.client.sent.messages (a redrive's fresh deliveries, operation send). A call on a
// dead-letter queue names its entity and carries [AttrSubQueue]. [Instrumentation.AdminClient] wraps
// the dead-letter monitor's administration client: a span per runtime-properties read, and the
// dead-letter depth gauge set from what it read.
//
//	in, err := inspect.New(client, "orders", &inspect.Options{Observer: inst})
//	mon, err := dlqmonitor.New(inst.AdminClient(adminClient), []string{"orders"}, nil)
//
// # Metrics
//
// messaging.process.duration, messaging.client.consumed.messages (operation receive, and the operator
// tools' peek and receive), messaging.client.sent.messages (the retry copies, operation schedule, and
// a redrive's fresh deliveries, operation send) and messaging.client.operation.duration from the
// conventions; sbretry.handler.duration, sbretry.retries.scheduled, sbretry.dead_lettered,
// sbretry.left_for_redelivery, sbretry.possible_duplicates, sbretry.held (messages outage mode held),
// sbretry.discarded (by sbretry.policy), sbretry.outage.changes (the breaker's trips, probes and
// resumes, by sbretry.outage.from, sbretry.outage.to and sbretry.outage.manual),
// sbretry.consumer.state and sbretry.dead_letter.depth (fed by [Instrumentation.RecordDeadLetterDepth]
// or [Instrumentation.AdminClient]) of our own. A process span carries the delivery's outcome in
// sbretry.outcome ([AttrOutcome] lists its values), and sbretry.policy and sbretry.immediate_retries
// when a retry policy rule or immediate retries were involved. The duration histograms carry error.type
// for a failed delivery but not the outcome, which would multiply their series by up to seven (see
// [Options].DurationOutcome to add it). Every metric of a delivery or a broker call carries the
// entity (messaging.destination.name and, for a subscription, messaging.destination.subscription.name)
// and the server, and a consumer's also the chain's source, so one [Instrumentation] can serve several
// consumers and tools of a namespace; an operator tool's call on a dead-letter queue carries
// sbretry.sub_queue; the dead-letter gauge and the outage changes carry the entity and the server, the
// consumer-state metric only the state.
package retryotel
