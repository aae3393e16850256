// Package inspect answers the operator's questions about retries on a Service Bus entity: "is this
// message going to be retried, and when?", "is it being processed right now?", "why is it in the
// dead-letter queue?". It reads what the retry library writes into every message (the envelope, see
// [envelope.Decode], and the dead-letter properties such as [envelope.PropDeadLetterAttempt]), so it
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
// live entity never disturbs its consumers. The exceptions are [Inspector.Cancel], which cancels a
// scheduled retry copy by its [Ref] through a Sender's CancelScheduledMessages, and the session calls
// (see Held sessions), which lock each session they read for a moment.
//
// Service Bus peek returns every message still in the entity, including scheduled ones that are not
// yet receivable: those come back with State [azservicebus.MessageStateScheduled] and their due time
// in ScheduledEnqueueTime. That is how a pending retry is found: the retry library schedules its copies
// with ScheduleMessages. Messages in any other state are receivable now or locked by a consumer (peek
// cannot tell the two apart) and are reported as [Active].
//
// # Held sessions
//
// On a session-enabled entity, retry.SessionConsumer's durable holds keep a failed message deferred in
// its session until its retry is due, with the later messages of the session deferred behind it, the
// hold's record in the session's state ([sessionstate.State]) and a wake-up message scheduled into the
// session for the due time; with SessionOptions.BlockAfterDeadLetter a session whose message was
// dead-lettered stays blocked until an operator releases it. [Inspector.ListHeldSessions] lists those
// sessions: what blocks each (the held message's sequence number, id, attempt and due time, or the
// dead-letter reason), its followers and its pending wake-up. [Inspector.PreviewRelease] shows what a
// release would change ([sessionstate.PlanRelease]: the state before and after, the wake-up) and
// [Inspector.Release] carries it out, sending the wake-up before it writes the state. A subscription
// cannot be sent to: its wake-up goes to [Options.WakeTo] (its topic) carrying [PropWakeTo], for the
// topic's rules to route to that subscription alone, and the state is written only once the wake-up
// is in the session.
//
// # Filters
//
// [DeadLetterFilter] and [PendingFilter] (through [PageOptions].Filter) select by reason, error text,
// an application property's value ([PropertyFilter], "NAME=VALUE"), time and body text; they are
// applied to each message as it is peeked, so a filtered read costs what an unfiltered one does.
//
// A session entity cannot be peeked as a whole with the Go SDK: Service Bus refuses a receiver without
// a session on it ("It is not possible for an entity that requires sessions to create a
// non-sessionful message receiver"), and the SDK's peek needs that receiver. So the session calls list
// the sessions that have a state (the hold's record is written before any deferral), and read each one
// by accepting it: its state, a peek of its messages, and a close at once. Reading a session
// therefore locks an idle session for a moment: a consumer that would take it then (a wake-up falling
// due, a new message of the session) waits until the inspector closes it. A session a consumer holds
// at that moment cannot be read at all; it is listed as locked, with nothing of it known, and a
// release of it is refused ([ErrSessionLocked]). A state that is not a hold record (another
// application's) is shown as such and never written.
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
// Set [Options].Observer to be told about every broker call: each peek request, each cancel, each
// session listing page, accept, state read and write and wake-up send and, for
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
// receivers (session receivers for the session calls) and senders (for Cancel and Release) it needs on
// the shared client and closes them before it returns.
package inspect
