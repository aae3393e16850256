// Command sbretry answers operators' questions about the retries of a Service Bus queue or
// subscription that a github.com/sbretry/retry consumer reads, and re-drives its dead letters.
//
// Usage:
//
//	sbretry [entity flags] status KEY           pending retries, active copies and dead letters of one message
//	sbretry [entity flags] pending [--limit N] [--cursor C]
//	                                            pending retries by due time, one page at a time
//	sbretry [entity flags] cancel SEQ           cancel one pending retry by its sequence number
//	sbretry [entity flags] dlq list [--reason R] [--since T] [--until T] [--contains TEXT]
//	sbretry [entity flags] dlq show SEQ
//	sbretry [entity flags] dlq redrive (--seq N,M | --reason R | --all) [filters] [--dry-run] [--redrive-to QUEUE]
//	sbretry [entity flags] dlq purge   (--seq N,M | --reason R | --all) [filters] [--dry-run] [--yes]
//
// Entity flags (they may also follow the subcommand):
//
//	--connection-string S   the namespace's connection string; default $SERVICEBUS_CONNECTION_STRING
//	--queue Q               a queue, or
//	--topic T --subscription S
//	--retry-queue Q         the queue the consumer schedules its retry copies on, if not the entity itself
//	--max-peek N            read at most N messages from each entity (default 10000)
//	--timeout D             bound on the whole command (default 5m)
//	--json                  machine-readable output on stdout, for jq
//
// Reading is peek-based (package github.com/sbretry/retry/inspect): it never locks or changes a message,
// and it is bounded by --max-peek; when the bound is hit, a warning on stderr says the answer covers the
// messages read only.
//
// # Redrive
//
// A redrive turns each selected dead letter into a fresh first delivery with retry.ResubmitMessage
// (retry properties stripped, so it gets the full retry schedule again; a new MessageID derived from
// the dead letter, so it is not dropped as a duplicate of the original), sends it, and only then
// completes the dead letter. The dead-letter queue is received in peek-lock mode; exactly the selected
// sequence numbers are completed, every other message received on the way is abandoned untouched.
// If the command dies between the send and the complete, the dead letter is still there; re-running
// the same command sends the same MessageID again, which the target's duplicate detection drops, and
// completes it. So a re-run after a crash never sends a message twice, provided duplicate detection is
// on for the target (as the retry library recommends) and the re-run comes within its window.
//
// A dead letter that is locked by another receiver when the redrive runs (for example by a redrive that
// was killed a moment ago, on a namespace that keeps a dead connection's locks until they expire) is not
// received within --wait (default 5s); the redrive then says which ones and exits 1. Run it again after
// the entity's lock duration, or with a longer --wait. Dead letters that were removed meanwhile are
// reported on stderr and are not an error, so a re-run with the same --seq list succeeds.
//
// A subscription cannot be sent to, and sending to its topic would deliver the message to every
// subscription of the topic, not just the one it was dead-lettered from. Redriving a subscription's
// dead letters therefore needs --redrive-to QUEUE: a queue that reaches that subscription's consumer
// only (its forwarding or retry queue); the topic itself is refused.
//
// # Exit codes
//
// 0 success, 1 an error (including a refused confirmation and a redrive that stopped part way: re-run
// it), 2 a usage error. Errors are printed with every secret redacted; the connection string is never
// printed.
package main
