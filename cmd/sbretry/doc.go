// Command sbretry answers operators' questions about the retries of a Service Bus queue or
// subscription that a github.com/sbretry/retry consumer reads, and re-drives its dead letters.
//
// Usage:
//
//	sbretry [entity flags] status KEY           pending retries, active copies and dead letters of one message
//	sbretry status --index PATH KEY             the same from a retry-state index, with the history
//	sbretry [entity flags] pending [--limit N] [--cursor C] [--wide] [--index PATH] [--contains TEXT]
//	                               [--property NAME=VALUE] [--due-after T] [--due-before T] [--body-contains TEXT]
//	                                            pending retries by due time, one page at a time
//	sbretry [entity flags] cancel REF... [--dry-run] [--yes]
//	                                            cancel pending retries
//	sbretry [entity flags] dlq list [--reason R] [--since T] [--until T] [--contains TEXT]
//	                                [--property NAME=VALUE] [--body-contains TEXT] [--wide]
//	sbretry dlq list --index PATH [filters] [--limit N] [--cursor C]
//	                                            dead-lettered events from a retry-state index, newest first
//	sbretry [entity flags] dlq show REF
//	sbretry [entity flags] dlq redrive (--seq REF,REF | --reason R | --property N=V | --all) [filters] [--dry-run] [--redrive-to QUEUE]
//	sbretry [entity flags] dlq purge   (--seq REF,REF | --reason R | --property N=V | --all) [filters] [--dry-run] [--yes]
//	sbretry [entity flags] sessions list [--max-sessions N]
//	                                            held sessions of a session-enabled queue or subscription
//	sbretry [entity flags] sessions release --session ID [--dry-run] [--yes] [--wake-to TOPIC]
//	                                            release one held session
//	sbretry [entity flags] serve [--listen ADDR] [--token T | --tokens-file F] [--audit-file F]
//	                             [--index PATH|URL [--index-dedicated]] [--max-attempts N]
//	                             [--entity PATH[=RETRYQUEUE]]... [--poll-interval D] [--window D] [--show-bodies]
//	                             [--filter-bodies] [--wake-to TOPIC]
//	                                            the web console (--tokens-file: lines of NAME ROLE SECRET,
//	                                            ROLE reader or operator; --audit-file: the JSON-lines audit log)
//	sbretry pause|resume --consumer URL [--token T] [--reason TEXT] [--dry-run]
//	                                            pause or resume one consumer through its control endpoint
//
// The acting commands (dlq redrive, dlq purge, cancel, sessions release, pause, resume) take
// --audit-file F and --operator NAME (default $SBRETRY_OPERATOR, else the OS user name): each run
// appends console.AuditRecord JSON lines to F, the file `serve --audit-file` shows on the console's
// audit page, with role "cli". The started record is written before anything is done, and a command
// whose record cannot be written does nothing, or, when its end record fails, exits 1: it never
// reports an unrecorded success. A dry run is a preview and, as in the console, is not recorded. The
// CLI has no preview digest (the console's is keyed with its process's secret), so the records carry
// the selection and each message's outcome without one.
//
// Entity flags (they may also follow the subcommand):
//
//	--connection-string S   the namespace's connection string; default $SERVICEBUS_CONNECTION_STRING
//	--queue Q               a queue, or
//	--topic T --subscription S --retry-queue R
//	                        a subscription and the queue its consumer schedules retry copies on
//	--retry-queue Q         for a queue: the queue holding its retry copies, if not the queue itself
//	--session-consumer      a retry.SessionConsumer consumes the entity: it holds retries in the
//	                        session and has no retry queue, so a subscription needs no --retry-queue
//	--max-peek N            read at most N messages from each entity (default 10000)
//	--timeout D             bound on the whole command (default 5m)
//	--json                  machine-readable output on stdout, for jq: every command, dry runs included
//	--trace-file F          append the command's OpenTelemetry spans to F (see Tracing); not for serve
//
// # Entities and references
//
// Every listing names the entity of each row, and every command that acts on messages takes them as
// REFs: ENTITY:SEQ, the entity as the listing spells it and the sequence number there
// ('orders-billing-retry/$DeadLetterQueue:17'; quote the $ for the shell). Service Bus counts sequence
// numbers per entity, and a dead-letter queue counts its own, so in the subscription layout the
// subscription's dead-letter queue and its retry queue's both hold a number 17: a bare 17 is accepted
// only where one entity can hold the message (the dead letters of a queue without a --retry-queue of
// its own, a subscription's pending retries, which are all in its retry queue), and refused with exit
// code 2, naming both candidates, where two can. A redrive or purge that selects in both dead-letter
// queues (--reason, --all) settles each dead letter in its own queue.
//
// A subscription needs --retry-queue: its pending retries and the dead letters of its last attempts are
// there, and an answer that left them out would say "nothing pending" about a place it never looked.
// The queue is the retryQueue argument of retry.Namespace.Subscription; Service Bus records no
// link between the two, so the operator names it. A subscription that a retry.SessionConsumer consumes
// has none (its retries are held in the session, its dead letters are in the subscription's own
// dead-letter queue): say so with --session-consumer, which sessions list implies.
//
// Reading is peek-based (package github.com/sbretry/retry/inspect): it never locks or changes a message,
// and it is bounded by --max-peek; when the bound is hit, a warning on stderr says the answer covers the
// messages read only, and the answer itself says it is partial: status that found nothing says "not
// found in what was read, which is partial" and exits 4 instead of 3, pending prints a "partial:" line
// (a peek reads in sequence order, not due order, so a retry beyond the bound may be due before every
// one listed), so does dlq list (dead letters beyond the bound are not listed), and --json carries
// "partial": true.
//
// # The retry-state index
//
// status, pending and dlq list take --index PATH, a retry-state index file (package
// github.com/sbretry/retry/retryindex) that a consumer keeps through retryindex.Recorder.Hooks, or a
// retryindex.Tailer keeps by peeking the broker. They then answer from the index without reading the
// broker, in milliseconds whatever the backlog: status with the event's state (pending with its due
// time and attempt, active, succeeded, dead-lettered with its reason, discarded, or its copy gone) and
// its history (every attempt: when, outcome, error, immediate retries, next due, which process);
// pending in true due order over the whole backlog, with the exact total; dlq list the dead-lettered
// events, the most recently dead-lettered first, one page of --limit at a time (--cursor continues),
// with the exact total (--reason, --since, --until and --contains filter as they do a scan; --contains
// searches the last error and the reason, the index keeping no description). A pending event is
// either waiting for its retry copy, held in its session (a session consumer's durable hold: no copy,
// the session's later messages wait behind it), or held by the outage breaker (a copy that spends no
// attempt): status says which, and --json's "hold" is "session" or "outage" for the two holds. The
// --json of status and pending carries "immediate" for each event and history entry. Every index answer starts with "from
// index PATH, as of T" and when each feed last wrote to it, and says when a feed LOST records (its
// recorder's queue was full, or a write failed) until a rebuild from the broker (sbretry index
// rebuild, below) repairs the states, since the index is only as fresh as its feeds: the broker
// stays the truth, and an action (cancel, redrive) still verifies there before it acts. The entity
// flags and the connection string are optional with --index; entity flags, when given, keep only the
// events whose chain started on that entity. The file is opened read-only. --index also takes a
// PostgreSQL URL (postgres://… or postgresql://…), the index a team shares (package
// github.com/sbretry/retry/retryindex/postgres); give its password through PGPASSWORD or ~/.pgpass
// rather than in the URL, which other users can see in the process list. Output names the database
// and host, never the URL.
//
// index rebuild --index FILE|URL reads the entity (and the retry queue, with --retry-queue) and their
// dead-letter queues from their first message into the index, with retryindex.Tailer.Rebuild: what a
// recorder lost is read again, the events whose copy is no longer there are marked gone, and the
// losses the answers warned of are cleared. It is a peek of the whole backlog: about two minutes for
// 1,100,000 messages on the emulator (BENCHMARKS.md). index tail --index FILE|URL keeps an index fed
// from the broker alone (a consumer without a recorder): it reads what arrived since its last read
// every --interval (10 s by default) until interrupted, and says on stderr what each read that found
// something wrote; its first read is the command's own, so a wrong entity or a refused credential
// ends it at once with exit 1, while later failures are reported and tried again. Both open the
// index for writing, and create the file when it does not exist. Neither is bounded by --timeout
// unless it is given (a rebuild then stops when it passes, keeping what it stored); rebuild --json
// prints one object: index, tookMs, peeked (messages read per entity), recorded, gone, lossesCleared.
//
// # Redrive
//
// A redrive turns each selected dead letter into a fresh first delivery with envelope.Resubmit
// (retry properties stripped, so it gets the full retry schedule again; a new MessageID derived from
// the dead letter, so it is not dropped as a duplicate of the original), sends it, and only then
// completes the dead letter. Both the dry run and the real run first print the plan: one line per dead
// letter with its entity, sequence number, original id, MessageID and the MessageID it will be
// resubmitted as. The real run then receives each dead-letter queue of the plan in peek-lock mode and
// completes exactly the planned dead letters there; every other message received on the way is
// abandoned untouched, and a received dead letter that does not match its line of the plan is refused.
// If the command dies between the send and the complete, the dead letter is still there; re-running
// the same command sends the same MessageID again, which the target's duplicate detection drops, and
// completes it. So a re-run after a crash never sends a message twice, provided duplicate detection is
// on for the target (as the retry library recommends) and the re-run comes within its window.
//
// A dead letter that is locked by another receiver when the redrive runs (for example by a redrive that
// was killed a moment ago, on a namespace that keeps a dead connection's locks until they expire) is not
// received within --wait (default 5s); the redrive then says which ones and exits 1. Run it again after
// the entity's lock duration, or with a longer --wait. Dead letters that were removed meanwhile are
// reported on stderr (and in the JSON's "missing") and are not an error, so a re-run with the same
// --seq list succeeds.
//
// A subscription cannot be sent to, and sending to its topic would deliver the message to every
// subscription of the topic, not just the one it was dead-lettered from. Redriving a subscription's
// dead letters therefore needs --redrive-to QUEUE: a queue that reaches that subscription's consumer
// only (its retry queue, or a forwarding queue); the topic itself is refused.
//
// # Purge and cancel
//
// Both print their plan (the dead letters, or the pending retries, by entity and sequence number),
// then ask on stderr for the exact word yes (not y, not YES; end of input is a no) unless --yes is
// given; --dry-run prints the plan and stops. cancel checks every REF first and refuses, before
// cancelling anything, one that is not a scheduled retry copy, so a mistyped number never deletes a
// live message.
//
// # Held sessions
//
// On a session-enabled queue, retry.SessionConsumer's durable holds block a session whose message
// failed: the message is deferred in its session until its retry is due, the session's later messages
// are deferred behind it, the session's state holds the record (sessionstate.State), and a wake-up
// message is scheduled into the session for the due time. With SessionOptions.BlockAfterDeadLetter, a
// session whose message was dead-lettered stays blocked until an operator releases it.
//
// sessions list (or sessions held) shows them, one line per session with its entity and session id:
// STATUS is waiting (a retry is due at DUE, its held message is SEQ / MESSAGE ID at ATTEMPT), dead-lettered
// (blocked until released; NOTE gives the reason), followers (nothing held, deferred messages waiting to
// run), foreign (the session's state is another application's, left alone), invalid (a hold record
// that cannot be read, left alone) or locked (a consumer holds the session now, so nothing of it could
// be read: run the listing again later). FOLLOWERS counts the messages deferred behind the hold, and
// WAKE-UP is the due time of the wake-up found in the session ("none" when a waiting session has none:
// no consumer will take it up before a new message of the session arrives; release it). Only sessions
// with a state are read (a hold always writes one), at most --max-sessions (default 1000), each by
// accepting it, reading its state, peeking its messages and closing it at once: a session a consumer
// would take up during that moment (a wake-up falling due) waits for the close. Service Bus lets only
// a session's holder read it, so a session entity cannot be peeked the way other entities are.
//
// sessions release --session ID releases one session of the queue: a waiting retry is made due now, a
// session blocked after a dead-letter runs its followers next (sessionstate.PlanRelease). It prints the state
// before and after and the wake-up it sends; --dry-run stops there, otherwise it asks for the word yes
// unless --yes is given. The real run then locks the session, refuses it if its state is no longer
// the one shown (a consumer moved on meanwhile: preview again), sends the wake-up to the queue (a plain
// send, receivable at once) and only then writes the new state. If the send succeeded and the state
// write failed, it says exactly that and exits 1: the session is still held, the consumer ignores a
// wake-up its state does not name, and running the release again finishes it. It refuses, and changes
// nothing: a session a consumer holds now (exit 1; run it again once the consumer lets it go), a
// session whose state is not a hold record (exit 1), a session that holds nothing (exit 3), a missing
// --session, and a subscription, whose wake-up would go to its topic and so to every subscription
// (exit 2). The session is named by --queue and --session together; an empty session id is refused.
//
// # Serve
//
// serve runs the web console of package github.com/sbretry/retry/console for the entity of the entity
// flags and every --entity (repeatable: a queue, or topic/Subscriptions/sub=RETRYQUEUE for a
// subscription and its retry queue), until interrupted; it waits up to 10s for requests in flight.
// The console shows the entities' counts over time, pending retries by due time, dead letters grouped
// by failure, and one message at a time, and redrives, purges and cancels with a preview of exactly
// what it will do.
//
//	--listen ADDR        the address to serve on (default 127.0.0.1:8080, loopback only)
//	--token T            the access token every request must present (default $SBRETRY_CONSOLE_TOKEN):
//	                     required for any address that is not loopback (an empty host, 0.0.0.0, a LAN
//	                     address). Open http://ADDR/?token=T once; the console sets a cookie and
//	                     redirects to the address without it. Scripts send Authorization: Bearer T.
//	                     The token is compared in constant time.
//	--entity P[=R]       another entity to show (repeatable)
//	--poll-interval D    how often the overview's counts are read (default 15s)
//	--window D           how much history the overview's charts keep in memory (default 1h)
//	--show-bodies        show message bodies on the message page (default off: they hold customer data)
//	--filter-bodies      let the dead-letter and pending pages filter by body text (default off: bodies
//	                     hold customer data; the text is never logged or audited)
//	--wake-to TOPIC      with --topic T --subscription S (a session subscription, no --retry-queue):
//	                     its held sessions are released by a wake-up sent to TOPIC carrying
//	                     sbretry-wake-to=T/Subscriptions/S; give it only where the topic's rules route
//	                     that to this subscription alone (docs/console.md)
//	--max-peek N         the peek bound per entity and read (default 10000)
//
// Without --token the console answers only to loopback names in the Host header (localhost,
// 127.0.0.1, [::1]): a guard against DNS rebinding, where another site's name is pointed at 127.0.0.1.
// Prefer $SBRETRY_CONSOLE_TOKEN to --token: a flag is visible in the process list.
// Interrupting serve gives running requests 10 s to finish; a redrive or purge still running then is
// cut off part way, which loses nothing (each dead letter is completed only after its fresh delivery
// was sent): preview and run it again.
//
// The connection string never reaches a page. State-changing requests are POST forms with a CSRF
// token and an Origin check.
//
// # JSON
//
// With --json, status, pending, dlq list and dlq show print what they found. redrive and purge print
// {"action", "dryRun", "target" (redrive), "selected", "done", "items", "missing", "error"}, each item
// with its "ref", "entity", "sequenceNumber", "done" and, for a redrive, "resubmitMessageId" and "sent"
// (the fresh delivery went out; "done" can still be false when completing the dead letter failed).
// cancel prints {"action", "dryRun", "selected", "done", "items", "error"}, each item a pending retry.
// sessions list prints {"entity", "sessions", "listed", "truncated"}, each session with its "entity",
// "sessionId", "status", "lockedByConsumer", "lockError", "stateError", "stateBytes", "state" ({"hold",
// "followers"}, the hold with "sequenceNumber", "messageId", "attempt", "firstFailure", "wakeAt",
// "wakeId", "lastError", "deadLetterReason", "deadLetteredAt"), "deferred", "wakeUps", "nextWakeUp"
// and "scan". sessions release prints {"action": "release", "dryRun", "entity", "sessionId",
// "plannedAt", "before", "after", "wakeUp" ({"messageId", "sessionId", "forSequenceNumber"}), "wakeSent",
// "stateWritten", "error"}.
// Both are printed also when the command stopped part way; then "error" says why and the exit code is 1.
// Messages of the retry queue whose chain belongs to another entity (sbretry-source) are left out of
// every answer, with a warning on stderr: the retry queue may be shared, or named by mistake.
//
// # Tracing
//
// --trace-file F appends what the command did to the broker to the file F (created with mode 0600) as
// OpenTelemetry spans in the OTLP JSON file format, one ExportTraceServiceRequest per line, which the
// OpenTelemetry Collector's otlpjsonfile receiver forwards to any backend: a span "sbretry COMMAND"
// (with process.exit.code, and an error status with the redacted error when the command failed) and
// under it one span per broker call (every peek, receive, send, complete, abandon and cancel),
// named and attributed by the messaging semantic conventions (package
// github.com/sbretry/retry/retryotel lists them). A redrive's sends link to the trace context each
// dead letter carries, so the redrive shows up in the message's history. When TRACEPARENT (and
// TRACESTATE) are set in the environment, the command's span continues that trace, so a traced script
// or CI job contains it. Every span is recorded; no metric is exported. The file holds entity names,
// message ids and redacted error texts, never a body or the connection string.
//
// The command does not export over OTLP to a collector endpoint, and so does not read the
// OTEL_EXPORTER_OTLP_* variables: that would make every build of the tool carry an OTLP client
// (gRPC or protobuf over HTTP) for a command that runs for seconds; a file is what an operator keeps
// of a redrive or purge.
//
// # Exit codes
//
//	0  done, or found
//	1  an error: Service Bus refused, a confirmation was refused, an action stopped part way (re-run it)
//	2  a usage error: a bad flag, a missing --retry-queue, a REF that is ambiguous or names an entity
//	   the command does not read; nothing was done
//	3  not found: status found nothing for the KEY where it looked (the whole entity, or the index), dlq
//	   show or cancel found no message at the REF, sessions release found nothing held in the session
//	4  not found in a partial read: status found nothing among the messages it read, but the read stopped
//	   at --max-peek, so the rest of the entity was not looked at (raise --max-peek, or use --index)
//
// Errors are printed with every secret redacted; the connection string is never printed.
package main
