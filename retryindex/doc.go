// Package retryindex keeps an index of retry state, so that "will event X be retried, and when?" is
// answered in well under a second at any backlog, with the event's history, instead of by peeking the
// whole retry entity for every question (Service Bus has no query by property, so a broker scan is
// linear in the backlog).
//
// # The broker stays the truth
//
// The index is a cache of what the broker and the consumer did; retries never depend on it. It is fed
// from two sides, each optional:
//
//   - the consumer: [Recorder.Hooks] returns a [retry.Hooks] value that records every delivery's outcome
//     (a retry scheduled with its due time, a success, a dead letter with its reason, a failure left for
//     redelivery), composed with the user's own hooks the way retryotel's are. A first attempt's
//     success is no retry state and is skipped unless [RecorderOptions.RecordFirstAttempts]. The hook
//     never blocks the consumer: records queue in memory and one writer stores them in batches every
//     [RecorderOptions.FlushInterval] (100 ms); a full queue drops the record and counts it
//     ([Recorder.Stats]), the store notes the loss, every answer's freshness then says this feed
//     lost records ([FeedStatus].Lost), and a [Tailer.Rebuild] repairs the states and clears it.
//   - the broker: a [Tailer] peeks the retry entity and its dead-letter queue from the last sequence
//     number it saw, so that copies scheduled by any process (and dead letters) are indexed too
//     ([Tailer.Run] polls every interval), and [Tailer.Rebuild] reads everything again and marks the
//     events whose copy is no longer there. A lost or stale index is rebuilt this way.
//
// Every answer says how fresh it is: each event carries when it was last updated and by which feed, and
// each answer lists every feed with the time of its last record (see [Freshness]).
//
// # Storage
//
// [OpenSQLite] opens an embedded, pure-Go SQLite database (modernc.org/sqlite) in WAL mode: one file
// beside the process that keeps it, no server. It survives a kill -9 of that process (a committed batch
// is in the write-ahead log before the commit returns). Message bodies are never stored; error texts are
// redacted (the library's secret redaction) and bounded ([SQLiteOptions.MaxErrorLength]). A finished
// event and its history are kept for [RecorderOptions.Retention] (14 days by default) after its last
// change: the recorder's writer calls [Store.Prune] every [RecorderOptions.PruneInterval]. BENCHMARKS.md
// states the bytes per event.
//
// Several consumers and consoles share one index through a real database instead: the subpackage
// postgres is the same [Store] in PostgreSQL (pgx v5). Both stores pass the same checks
// (retryindex/storetest).
//
// # Answers
//
// [Store.Lookup] finds events by a retry MessageID, the original MessageID, the idempotency key or the
// correlation id; [Store.Pending] pages pending retries in due order, and [Store.DeadLettered]
// dead-lettered events newest first; [Store.Counts] counts events by state, exactly, as of the time
// it states; [Store.PendingHistogram] counts pending retries by due time, for a chart of the whole
// backlog. Each answers for every entity, or for one source entity of an index several share
// ([PendingOptions.Source], [CountsOptions.Source]) at the same cost: the stores index pending and
// dead-lettered events by source entity too, and keep their counts by source. A pending event says what holds it ([Event.Kind]): a retry copy, the outage breaker's
// copy ([KindHeld]), or a session consumer's durable hold in the session itself ([KindDeferred]).
// These are the calls an operator console or a command-line tool makes (sbretry status, pending and
// dlq list take --index).
package retryindex
