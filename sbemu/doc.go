// Package sbemu is an in-process Azure Service Bus emulator that the
// unmodified azservicebus SDK talks to over loopback TCP.
//
// It speaks just enough AMQP 1.0 (SASL ANONYMOUS/PLAIN, connection, session
// and link flow control, multi-frame transfers, heartbeats) plus the Service
// Bus conventions layered on top of it: claims-based security on the "$cbs"
// node, the "<entity>/$management" request/response node (schedule, cancel,
// renew-lock, peek, update-disposition, receive-by-sequence-number, the
// session operations) and the lock-token/annotation rules for peek-lock
// deliveries. Service Bus semantics (locks, delivery counts,
// dead-lettering, scheduling, deferral, message sessions, duplicate
// detection, TTL, topics with subscriptions and rules, auto-forwarding)
// live in the broker subpackage;
// this package adapts them to the wire. Entities come from [Config] or from
// the Config.json of Microsoft's emulator ([ConfigFromFile]).
//
// In a test, [StartT] starts one on a free loopback port and closes it when
// the test ends; hand its [Emulator.ConnectionString] to
// azservicebus.NewClientFromConnectionString:
//
//	em := sbemu.StartT(t, sbemu.Config{Queues: []broker.QueueConfig{{Name: "orders"}}})
//	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), nil)
//
// Outside tests, [Start] and [Emulator.Close] do the same by hand. With
// [Config.InMemory] no socket is opened and the SDK connects through
// [Emulator.NewWebSocketConn], which makes the emulator usable inside a
// testing/synctest bubble.
// [Emulator.Broker] gives direct access to what the broker holds (active,
// locked, scheduled and dead-lettered messages) for assertions.
//
// # Layout
//
// The package is split by layer so each can be read alone: this package
// serves connections (connection, session and link state, flow control,
// the writer) and maps AMQP onto Service Bus (CBS in cbs.go, the management
// node in management.go, settlement in disposition.go, deferral in
// deferral.go, session receivers in sessions.go); package broker holds
// the Service Bus semantics and knows nothing about the network;
// internal/wire is the AMQP 1.0 codec; internal/fault holds the state of the
// fault hooks, which faults.go exposes.
//
// Fault hooks ([Emulator.DropConnections], [Emulator.RefuseConnections],
// [Emulator.Hang], [Emulator.RejectNextSends],
// [Emulator.RejectNextSettlements], [Emulator.RejectNextManagement],
// [Emulator.ExpireLocks], [Emulator.DetachLinks], and the
// [Config.KeepLocksOnDisconnect] switch) let tests exercise the failure
// paths a real namespace produces only occasionally. Time is injectable
// through [Config.Clock]; see [Clock].
//
// # Protocol behaviour
//
// Flow control never stalls a client: the session incoming window (5000
// transfers) is re-advertised whenever half of it is used, and a client
// sender's link credit (1000) is topped up at half use. Towards the client
// the emulator honours the client's session window and link credit; a drain
// request sends what is available at once and then spends the remaining
// credit. Frames larger than the client's max-frame-size are split into
// multi-frame transfers, and multi-frame transfers from the client are
// reassembled. Empty frames are sent at half the client's idle timeout.
//
// Every queue delivery carries delivery-id, message-format 0 and, as its
// delivery tag, the broker lock token in .NET GUID byte order, which is how
// the SDK derives ReceivedMessage.LockToken. Settlements map to the broker
// as Service Bus does: accepted completes, modified abandons (its annotations
// become application properties), rejected with com.microsoft:dead-letter
// dead-letters (reason and description from the error info), released
// returns the message without counting the delivery. Each is answered with a
// settled disposition, or rejected{com.microsoft:message-lock-lost} when the
// lock is gone, which the SDK reports as CodeLockLost. Receive-and-delete
// links get pre-settled transfers; the message is removed once its transfer
// is queued for the socket.
//
// Locks belong to the connection that received the message: by default,
// when a connection ends, cleanly or not, its locks go back to their queues
// with the delivery counted (and messages that used up MaxDeliveryCount are
// dead-lettered); with [Config.KeepLocksOnDisconnect] they stay until they
// expire, as on Service Bus. Detaching a link keeps its locks; the SDK
// settles such messages by lock token through the management node.
//
// A put-token for an entity that does not exist is answered 404 (the SDK's
// CodeNotFound), an attach to one amqp:not-found, unknown management
// operations 501, and a second "$cbs" link in one direction on a
// connection amqp:not-allowed, as Service Bus answers them. With
// [Config.StrictAuth] a put-token that is not a valid signature of one of
// the namespace's or the entity's shared access policies, has expired, or
// whose audience is neither the entity nor a prefix of it, gets 401, and a
// token grants its policy's rights only: a sender needs Send, a receiver
// Listen, the administration API Manage (rights.go). A token covers its
// links until it expires on [Config.Clock]: then, unless the client has
// put a fresh one, the links are detached with amqp:link:detach-forced
// ("Code: RenewToken"), as Service Bus does (token_expiry.go).
//
// # Serving a connection
//
// [Start] runs one accept goroutine; every accepted socket gets one goroutine
// running the connection's reader. The reader does the handshake (protocol
// header, optional SASL, open) with direct socket writes, then starts the
// connection's writer goroutine and dispatches every later frame inline:
// begin/end, attach/detach, flow, dispositions, client transfers (stored in
// the broker before the next frame is read) and $cbs/$management requests.
// Sessions have no goroutine of their own; a session's mutex orders its
// frames so transfer ids and flow state on the wire always agree with what
// was sent. Every link on which the emulator sends (a queue receiver or a
// reply link) has one delivery goroutine, which blocks in the broker only
// while the client has granted credit; withdrawing credit or asking for a
// drain cancels that blocked receive. Every goroutine sends its frames by
// encoding them and pushing the bytes onto a queue owned by the writer
// goroutine; pushing never blocks, so the reader never blocks on a slow
// client and the two peers can never deadlock writing to each other.
// Deliveries alone wait before each frame while the queue holds more than
// [Limits.MaxOutgoingBytesPerConnection], which bounds the memory a client
// that grants more than it reads can tie up.
//
// Credit and windows are replenished by the side that consumes them: the
// reader counts each client transfer against the session incoming window
// and each completed delivery against the client sender's link credit, and
// re-advertises the full amount with a flow frame when half is used. The
// client's own flow frames update the outgoing window and credit the
// delivery goroutines wait on (they are woken through channels, never by
// polling).
//
// When a connection ends (close frame, I/O error, idle timeout,
// [Emulator.DropConnections] or [Emulator.Close]) its context is canceled,
// which ends every link context derived from it; the writer gets two
// seconds to flush a final close frame; every session is shut down; the
// delivery goroutines are awaited, releasing any message they had taken but
// not yet sent (uncounted); and finally the broker returns every lock the
// connection still owned, counting the delivery, exactly as Service Bus does
// for a dropped receiver.
// # Topics
//
// [Config.Topics] adds topics with subscriptions. A client sends and
// schedules to "<topic>" and receives from "<topic>/Subscriptions/<name>"
// (the SDK's NewReceiverForSubscription) and its "/$DeadLetterQueue";
// management requests (renew, peek, schedule, cancel) go to the entity's
// own "$management" node. Receiving from a topic or sending to a
// subscription is refused at attach with amqp:not-allowed. Subscription
// rules, auto-forwarding and their Service Bus references are described in
// package broker.
//
// # Resource limits
//
// [Config.Limits] bounds connections, sessions per connection, links per
// session, bytes queued for a client, peek counts and partial multi-frame
// messages, so an unauthenticated client cannot exhaust the emulator; each
// limit that refuses something says so with amqp:resource-limit-exceeded
// (status 400 for a peek) naming the limit. See [Limits].
//
// # Administration API
//
// The emulator also serves the Service Bus administration API, the
// HTTPS/ATOM endpoint that the SDK's admin.Client (and the JavaScript and
// Python administration clients) use: create, get, list, update and delete
// queues, topics, subscriptions and rules, namespace properties, and
// runtime properties with CountDetails (active, dead-letter, scheduled and
// transfer counts), SizeInBytes and MessageCount. The admin client always
// calls "https://<connection string host>/", which here is the plain-AMQP
// port, so the API listens on a port of its own ([Config.AdminAddr], a
// free loopback port by default) with a certificate signed by the
// emulator's own certificate authority, and [Emulator.AdminClientOptions]
// gives the admin client a transport that sends every request there and
// trusts that authority:
//
//	ac, err := admin.NewClientFromConnectionString(em.ConnectionString(), em.AdminClientOptions())
//
// Other clients can use [Emulator.AdminEndpoint]'s host as the namespace
// and trust [Emulator.AdminCertificatePEM] or [Emulator.AdminRootCAs], the
// certificate authority that signs the API's certificate. With
// [Config.DataDir] that authority is kept in the directory ([AdminCAFile])
// and stays the same across restarts, and the running emulator's addresses
// are in [EndpointsFile]; a client in another process (a dead-letter
// monitor next to cmd/sbemu -data DIR) builds its admin client options from
// the directory with [AdminClientOptionsFromDir] and keeps working across
// restarts of the emulator.
// With [Config.StrictAuth] every request needs a SAS token signed with a
// policy's key whose audience covers the URL (401 otherwise), and a policy
// with Manage, as Service Bus answers a key without it (admin_auth.go). A create of a taken
// name answers 409, a read, update or delete of a missing entity 404, an
// unsupported setting (a status only the service sets, a SQL parameter a
// rule does not define) 400. Updates change only what applies to later operations (lock
// duration, MaxDeliveryCount, TTL, dead-lettering on expiry, duplicate
// detection window, size limit, status, rules); forwarding, RequiresSession
// and switching duplicate detection on or off are refused. An entity's
// status (Active, Disabled, SendDisabled, ReceiveDisabled) is enforced as
// Service Bus enforces it: links and operations it forbids are refused
// with com.microsoft:entity-disabled (broker/status.go). A delete is refused (409)
// while another entity forwards to the entity or receivers hold locks on
// its messages, so the broker never keeps half of an entity. See admin.go.
//
// # Persistence
//
// By default the emulator keeps everything in memory, like Microsoft's,
// which loses everything on restart. With [Config.DataDir] (cmd/sbemu
// -data DIR) entities, messages (active, scheduled, dead-lettered, with
// their properties and delivery counts), sequence numbers and
// duplicate-detection history survive [Emulator.Close] and a crash: the
// broker journals every change and the emulator sends an acknowledgement
// (the disposition of a send or settlement, a management reply, an
// administration API answer) only once the change is fsynced, and holds a
// delivery back until its message is, so a SIGKILL loses nothing a client
// was told had happened. Concurrent acknowledgements share fsyncs. Locks do
// not survive a restart: locked messages come back with that delivery
// counted, as after a lock expiry. Stored entities win over configured ones
// of the same name; new configured ones are added. See durable.go and the
// broker's persist.go.
//
// Start cuts off the torn tail a crash leaves at the end of the journal,
// and refuses a directory damaged anywhere else with a
// [*broker.DamageError] naming the file and offset, since the records
// after the damage may have been acknowledged;
// [Config.TruncateDamagedJournal] (cmd/sbemu -truncate-damaged-journal)
// cuts the journal at its last good record instead and logs what was
// dropped. If a write or fsync of the journal fails while serving, the
// emulator stops acknowledging: every send, settlement, management
// request and administration call is answered with an error (the SDK
// sees amqp:internal-error), no message is delivered, and the failure is
// logged at Error level; cmd/sbemu exits. Tests cause such a failure with
// Broker().InjectJournalFault.
//
// # What is not emulated
//
// No transactions; TLS on the AMQP port only when [Config.TLS] is set
// (AMQP over WebSockets, wss://<admin host>/$servicebus/websocket, is
// always TLS: websocket.go); no auto-delete on idle; tokens from Entra ID are
// never verified (see [Config.AcceptUnverifiedJWT]). It is meant for tests
// and local development.
package sbemu
