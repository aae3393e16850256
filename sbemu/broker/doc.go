// Package broker implements the queue semantics of the Service Bus emulator:
// sequence numbers, peek-lock and receive-and-delete delivery, lock expiry and
// renewal, delivery counting, dead-lettering, scheduled messages, duplicate
// detection, time-to-live and size limits.
//
// The package knows nothing about networking or AMQP framing. The AMQP server
// in the parent package decodes transfers into [*amqp.Message] values, hands
// them to [Queue.Send], and turns the [Delivery] values returned by
// [Queue.Receive] back into transfers; settlements and management requests map
// one-to-one onto [Queue.Complete], [Queue.Abandon], [Queue.Release],
// [Queue.DeadLetter], [Queue.RenewLock], [Queue.Schedule],
// [Queue.CancelScheduled] and [Queue.Peek].
//
// # Time
//
// All time comes from an injected [Clock] (Now and After, standard-library
// types only), so tests can drive lock expiry, scheduled activation and TTL
// with a fake clock such as github.com/benbjohnson/clock's *Mock. Deadlines
// are evaluated lazily on every call and, in addition, one goroutine per
// broker waits for the earliest pending deadline of all queues, so that a
// [Queue.Receive] already blocked wakes up when a scheduled message becomes
// due or a lock expires (see wakeup.go). On the default clock the broker
// also works inside a testing/synctest bubble.
//
// # Concurrency
//
// A [Broker] and its queues are safe for concurrent use; one mutex guards the
// whole broker, which keeps cross-queue moves (dead-lettering) atomic. Every
// message handed in is copied and every message handed out is a fresh copy, so
// callers may mutate what they get without corrupting the stored message.
//
// # Deliberate simplifications
//
// There are no sessions, topics, deferral or transactions; see the README of
// the emulator for the list of supported operations.
package broker
