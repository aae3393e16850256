// Package inspect answers the operator's questions about retries on a Service Bus entity: "is this
// message going to be retried, and when?", "is it being processed right now?", "why is it in the
// dead-letter queue?". It reads what the retry library writes into every message (the envelope, see
// [retry.DecodeEnvelope], and the dead-letter properties such as [retry.PropDeadLetterAttempt]), so it
// needs nothing but the entity itself: no side database, no cooperation from running consumers.
//
// An [Inspector] works on one entity (a queue, or a subscription path "topic/Subscriptions/sub"), the
// retry queue its consumer schedules copies on when that is another queue (required for a
// subscription: [Options.RetryQueue]), and the dead-letter queues of both, through an
// *azservicebus.Client:
//
//	client, err := azservicebus.NewClientFromConnectionString(connStr, nil)
//	...
//	in, err := inspect.New(client, "orders", nil)
//	st, err := in.Status(ctx, "order-42") // a key, correlation id or message id
//	for _, p := range st.Pending {
//		fmt.Printf("will be retried at %v (attempt %d)\n", p.DueTime, p.Attempt)
//	}
//
// # Entities and references
//
// Every result carries the path of the entity it was found in, and every call that acts on one message
// takes a [Ref]: that entity and the message's sequence number there. Service Bus counts sequence
// numbers per entity, and each dead-letter queue counts its own, so in the subscription layout the
// subscription's dead-letter queue and its retry queue's both hold a number 1: a number alone names a
// message only where one entity can hold it, and the Inspector refuses it ([ErrAmbiguousRef]) where two
// can.
//
// # How it reads
//
// Everything is read with PeekMessages, which neither locks nor changes a message, so inspecting a
// live entity never disturbs its consumers. The one exception is [Inspector.Cancel], which cancels a
// scheduled retry copy by its [Ref] through a Sender's CancelScheduledMessages.
//
// Service Bus peek returns every message still in the entity, including scheduled ones that are not
// yet receivable: those come back with State [azservicebus.MessageStateScheduled] and their due time
// in ScheduledEnqueueTime. That is how a pending retry is found: the retry library schedules its copies
// with ScheduleMessages. Messages in any other state are receivable now or locked by a consumer (peek
// cannot tell the two apart) and are reported as [Active].
//
// # Bounded reads
//
// There is no index: answering "what is pending for key K" means reading the entity. Every call
// therefore peeks at most [Options.MaxPeek] messages from each entity it reads (10,000 by default), in
// sequence-number order, and reports in a [Scan] how many it read and whether it stopped at the bound
// (Truncated) rather than at the end of the entity. A truncated answer is still correct for the
// messages it read; raise MaxPeek to see further. Measured against the bundled emulator on loopback
// (2 cores, BenchmarkInspector10kPending), a Status over a queue holding 10,000 pending retries peeks
// all 10,000 in about 0.36 s (40 peek requests of 250, plus one for the empty dead-letter queue), and
// a full ListPending in one page takes about 0.47 s; with PeekBatchSize 1000 both take about 0.25 s.
// Listing in pages costs one scan per page: 10 pages of 1,000 read 100,000 messages in about 3.2 s.
//
// # Telemetry
//
// Set [Options].Observer to be told about every broker call: each peek request, each cancel and, for
// a redrive or purge of the Inspector's selections, each receive, send, complete and abandon. The
// package depends on no telemetry library; github.com/sbretry/retry/retryotel's Instrumentation is an
// [Observer] that makes an OpenTelemetry span and metrics of each call, following the messaging
// semantic conventions:
//
//	inst, err := retryotel.New(&retryotel.Options{ServerAddress: host, ServerPort: port})
//	...
//	in, err := inspect.New(client, "orders", &inspect.Options{Observer: inst})
//
// # Concurrency
//
// An Inspector is safe for concurrent use. It holds no links of its own: each call opens the
// receivers (and, for Cancel, the sender) it needs on the shared client and closes them before it
// returns.
package inspect
