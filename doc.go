// Package retry adds delayed retries with backoff to Azure Service Bus consumers.
//
// Service Bus on its own can only redeliver a failed message at once (abandon) until the entity's
// MaxDeliveryCount is spent, and then dead-letters it. During a downstream outage every attempt burns
// within seconds. This package instead republishes a copy of a failed message with a scheduled enqueue
// time chosen by a backoff (package backoff; Fibonacci by default), carries the retry state in the
// copy's application properties (package envelope), and only then completes the original. Nothing is
// ever abandoned, and a message is never completed before its successor is safely scheduled: if the
// republish fails, the original stays locked and the broker redelivers it.
//
// # A map of the package
//
//   - First calls: a [Connector] from a [Namespace] ([NewNamespace] with a connection string, or
//     [NewNamespaceCredential]; then [Namespace.Queue], or [Namespace.Subscription] for a subscription
//     and its retry queue), [NewConsumer] with a [Handler] and [Options], then [Consumer.Run]. [Consumer.Health], [ReadinessHandler] and [LivenessHandler] report on it.
//   - Failures: a backoff (package backoff: Fibonacci, Exponential, Constant, Jitter) with MaxAttempts; a
//     handler answers [Permanent] to dead-letter at once or [RetryAfter] to choose the delay;
//     Options.ImmediateRetries retries in the same delivery first.
//   - Policies: Options.Policies, a [Rule] per kind of error ([ErrorIs], [ErrorAs]) with its own
//     [Policy] (retry, dead-letter or discard, backoff, attempts).
//   - Routing: [NewRouter] sends each message to a handler by subject or property, each [Route] with its
//     own policies.
//   - Outages: Options.Outage (package outage: its Options, and the Status that [Health] reports) stops
//     receiving while a dependency is down and holds the messages in hand without spending attempts;
//     [Consumer.Pause] and [ControlHandler] are the kill switch. Both consumers have it.
//   - Sessions: [NewSessionConsumer] keeps each session's order by retrying in place, or, with
//     SessionOptions.DurableHolds, by holding the session in the broker (its record: package
//     sessionstate).
//   - The envelope: package envelope names the sbretry-* application properties a retry copy carries
//     and decodes them; a handler reads its own with envelope.FromContext.
//   - Observing: [Hooks] (OnStart, OnRetryCopy, OnSettle, OnProcessed, ...), on which package retryotel
//     builds OpenTelemetry traces and metrics and package retryindex keeps the retry-state index.
//   - Testing: package retrytest is an in-memory broker with the emulator's semantics; inject a [Clock]
//     (benbjohnson/clock's Mock satisfies it) to run retries without waiting. Operators use package
//     inspect and the sbretry command.
//
// The per-message engine is [Processor]; [Consumer] wraps it in a receive loop with bounded concurrency,
// lock renewal, and a reconnect-then-watchdog recovery loop (watchdog.go) that rebuilds the client from
// scratch; [SessionConsumer] is the same engine, lock keeper, breaker and recovery loop with sessions
// accepted in place of the receive loop. All time flows through a [Clock].
//
// To follow one message in the source: a queue message goes receiveloop.go (receive, take a slot),
// consumer.go (deliver), process.go (Process: its stages in order), and what the stages call, none of
// which calls back: lockrenewer.go, flights.go, decision.go, settle.go, observe.go. A session message
// goes sessionloop.go (accept, serve, receive), sessionhold.go (dispatch, then handle: the handler,
// holds in place, the decision), sessiondurable.go (the session's record: durable holds), and
// sessionserved.go (its settles, through settle.go's lock-bound pair), on the same decision.go,
// flights.go (the one record of deliveries in flight) and observe.go.
//
// # Crash contract
//
// For every failed delivery the order is: schedule the copy, then complete the original, with the lock
// renewed until the complete returns. If the complete fails, the processor remembers the outcome and
// completes the redelivered original without running the handler again. If the process dies between
// the two, another process runs the handler again; its republish uses the same deterministic MessageId
// ([envelope.Envelope.RetryMessageID]: unique per retry chain and attempt), so a queue with duplicate detection
// drops it. Delivery is therefore at-least-once, and with duplicate detection on (a window covering the
// lock duration, one settle timeout and the longest handler run) a retry is scheduled at most once per
// attempt.
package retry
