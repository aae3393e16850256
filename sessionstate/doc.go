// Package sessionstate is the record a retry.SessionConsumer keeps in a session's state for its durable
// holds (SessionOptions.DurableHolds, BlockAfterDeadLetter), and the operator's release of a held
// session.
//
// A durable hold keeps a failed message's retry in the broker, not in the consumer's memory: the message
// is deferred in its session, a wake-up message is scheduled into the session for when the retry is
// due, and the record ([State]: the held message as a [Hold], and the messages deferred behind it, in
// order) is written as the session's state. Whichever consumer accepts the session next reads it and
// resumes. Operator tools (package inspect, sbretry sessions) read the same record with [Decode], and
// release a held session with [PlanRelease]: a wake-up sent, then the new record written ([Marshal]).
//
// The record is JSON marked "format":"sbretry/v1" ([Format]); a session state without that marker is
// another application's, and nothing here overwrites it ([ErrForeign]).
package sessionstate
