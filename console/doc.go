// Package console is the operations console of the retry library: an [http.Handler] that shows, for
// the queues and subscriptions it is given, what is failing and why, what will be retried and when,
// and lets an operator put it right with the same safety as the sbretry command.
//
// # Pages
//
//   - the overview: active messages, pending retries and dead letters per entity, polled in the
//     background ([Console.Run]) into an in-memory ring covering [Options.Window], drawn as charts,
//     with an alert per entity whose dead letters reach [Options.AlertThreshold] or grew since the
//     previous poll;
//   - an entity's pending retries: a timeline of how many come due when, and the list, paged;
//     filtered (as the dead letters are) by error text, property, due time and, with
//     [Options.FilterBodies], body text;
//   - an entity's dead letters grouped by reason and by a fingerprint of the last error: the error
//     text with numbers, ids and hex values replaced by placeholders, hashed ([Fingerprint]), so that
//     "order 17 failed" and "order 18 failed" are one group; each group with its count, first and last
//     seen, who dead-lettered it (the retry library, Service Bus itself, or an application), and an
//     example; filtered by reason, error text, property (NAME=VALUE), time and, with
//     [Options.FilterBodies], body text, with the actions on all that matches;
//   - a group's dead letters, paged, and one message: envelope, attempt, last error (redacted), the
//     properties, and the body only when [Options.ShowBodies] is set;
//   - a session entity's held sessions (retry.SessionConsumer's durable holds): per session what
//     blocks it (the held message and its attempt, or the dead-letter that blocked it), the reason,
//     its followers and its next wake-up, with a release (on a subscription, with [Entity].WakeTo). A session entity is configured
//     ([Entity].SessionConsumer) or recognised at its first read: it refuses the plain receiver a
//     peek needs, and lists sessions. Its overview row counts its dead letters only, and no page
//     shows the broker's refusal;
//   - the search (/search?q=, from the box on every page): for a message id, an idempotency key or a
//     correlation id, where each event it names stands (will be retried at T, attempt n of
//     [Entity].MaxAttempts; active; held; dead-lettered with its reason; succeeded; or no trace, and
//     what was searched), with the cancel, redrive and purge previews that apply. With
//     [Options.Index] it answers from a retry-state index (package retryindex) with the event's
//     attempt history and the answer's freshness; without one it reads each entity as
//     [inspect.Inspector.Status] does and says when the read stopped at [Options.MaxPeek] (the answer
//     is then partial, and "no trace" no proof of absence). The query is bounded (1,024 bytes), shown
//     like message text (see Security) and never logged;
//   - the audit log (see below).
//
// With [Options.Index] the overview's pending and dead-letter counts, the pending page (every pending
// retry in true due order, the exact total, paged by the index's cursor), its chart and the
// dead-letter page (newest first, the exact total, the failure groups of the most recent 2,000, and
// each group's page) answer from the index too, each saying how fresh it is (as of when, each feed's
// last write, the records a feed lost); &from=broker reads the broker instead, and a filter always
// does. The pages of an index several entities share list and count each entity's own events, from the
// stores' indexes and counts by source entity. An action on messages selected on those pages peeks each at the
// sequence number the index recorded and acts only if the MessageID there is the one the index named;
// otherwise it is refused as a stale index (409), nothing done.
//
// # Actions
//
// Redrive (selected dead letters or a whole group), purge (the same, with a typed confirmation: the
// word yes or the number of dead letters shown) and cancel (pending retries) go through package
// internal/dlqaction, like the CLI; release (a held session of a queue, or of a subscription with
// [Entity].WakeTo) through [inspect.Inspector.Release], its digest covering the session's state before
// and after, the planned time, the wake-up's id and where it is sent. Each first shows a preview of exactly the entity-qualified refs it
// will act on, and for a redrive the MessageID each fresh delivery will carry. The preview's form
// carries those refs and a keyed digest of them with their MessageIDs; the run reads the dead letters
// again, and if the selection or the group is no longer exactly what was previewed it refuses with a
// message saying so and does nothing. Then it acts on exactly those refs and shows the result,
// including how far it got if Service Bus stopped it part way (running it again finishes it).
//
// An action on all that a filter matches previews exactly the messages it matches then, as refs under
// the digest (which also covers the filter's description), and its run acts on those refs, never on
// the filter again. A run of more than [Options.BatchSize] messages goes in batches, each with
// [Options.ActionTimeout], its page streaming a progress line after each.
//
// # Audit log
//
// Every action asked for, at its run and, when it is refused for who sent it (the role, the CSRF
// check), at its preview, is recorded ([AuditRecord]): who (the token's name, or "(no token)"), when,
// from where, the action, the selection (entity, group or session, and refs), the digest of the
// preview, and the outcome (refused, started, done, partial, failed) with what became of each message.
// Each record is a structured log line ([Options.Logger]) and, with [Options.AuditFile], a JSON line
// appended to that file and synced to disk before the console goes on; the audit page (/audit) shows
// the records newest first, to readers too. A run writes its started record before it touches
// anything, and is not carried out if that record cannot be written.
//
// # Security
//
// The handler never sees a connection string (it is given a client), and every error, description,
// last error and property shown is redacted (internal/redact). State-changing requests are POST only,
// and carry a CSRF token: an HMAC, under a per-process random key, of a random value in a SameSite=Strict
// cookie; their Origin (or, without one, Referer) must name the host they were sent to. With
// [Options.Tokens] (or the single operator token [Options.AccessToken]) set, every request must present
// one of the tokens (a bearer header, or the cookie a first visit with ?token= sets), compared in
// constant time. Each token has a name and a [Role]: a [RoleReader] token reads every page, which then
// shows no action buttons, and every action it posts is refused on the server with 403 Forbidden,
// whatever the form carries; a [RoleOperator] token acts too. Without tokens, the handler answers only to
// loopback Host names and [Options.AllowedHosts], against DNS rebinding (another site's name pointed at
// 127.0.0.1 would otherwise be same-origin with the console): bind it to loopback, or protect it with
// your own middleware and list the names it serves under in AllowedHosts. Behind a reverse proxy, pass
// the original Host header on: the Origin check compares the two. Message text (reasons, ids,
// property names and values, errors) is redacted wherever a page shows it, and shown with its control
// characters, terminal escapes, bidi overrides and invalid bytes written as escapes (\x1b, \u202e):
// a producer's id cannot disguise itself or another. A value is clipped at 2,000 characters (a last
// error or a body at 64 Ki), a binary property is shown as its size, and the pending-retry chart
// spans at most 30 days from now, counting retries due later (a producer may schedule one for the
// year 9000) apart.
//
// # Cost
//
// Every read is a bounded peek (package inspect): each poll, overview and page reads each entity up to
// [Options.MaxPeek] messages, and says so on the page when a read stopped at the bound. Service Bus can
// only be peeked in sequence order, so a dead-letter page or a group page reads the whole dead-letter
// queue (grouping needs every message's last error) whatever the page size, and costs time in
// proportion to min(dead letters, MaxPeek): on the in-process emulator 25 to 30 ms per 1,000 dead
// letters, so 10,000 take 0.25 to 0.3 s. A search without [Options.Index] reads every entity's queues
// and dead-letter queues up to MaxPeek each; with it, one indexed lookup, and the pages that list
// read one page of the index (docs/console.md has the figures at 1,000,000 pending retries). A poll of the overview reads every message of
// every entity up to MaxPeek (20 queues of 250 messages: 0.12 to 0.16 s); the overview itself then renders
// from the ring in well under a millisecond. Lower MaxPeek to bound a page's cost on huge entities: the
// page then says its figures cover the messages read only.
//
// # Telemetry
//
// Set [Options].Observer to trace every broker call of the pages and the actions; it is handed to each
// entity's inspector ([inspect.Options].Observer), and the redrives and purges report through it too.
// github.com/sbretry/retry/retryotel's Instrumentation is one: Options{Observer: inst}.
package console
