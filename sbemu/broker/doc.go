// Package broker implements the Service Bus semantics of the emulator:
// sequence numbers, peek-lock and receive-and-delete delivery, lock expiry and
// renewal, delivery counting, dead-lettering, scheduled messages, duplicate
// detection, time-to-live and size limits, for queues and for topics with
// subscriptions, their rules (TrueFilter, CorrelationFilter, SQL filters and
// actions, see rule.go and sqlfilter.go) and auto-forwarding (forward.go).
//
// # Topics
//
// A topic, a subscription and a queue are the same [Queue] type underneath.
// A topic accepts, deduplicates and holds scheduled messages like a queue;
// the moment a message becomes available there, it is copied to every
// subscription whose rules select it and leaves the topic (topic.go). A
// subscription is then a queue of its own, with its own lock duration,
// MaxDeliveryCount, TTL, dead-letter queue and forwarding. Everything
// happens under the broker's one mutex, so a fan-out is atomic.
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
// The broker keeps each message as its AMQP encoding (encoded.go), so what
// it hands out is decoded afresh, and a message handed in is encoded: a
// delivery carries the values as the wire gives them (a map[any]any with
// string keys comes back as a map[string]any, times to the millisecond).
// [Queue.SendOwned] and [Queue.ScheduleOwned] skip the copy that
// [Queue.Send] makes before adding what the broker adds (a MessageId, the
// scheduled time), for a caller that hands the message over.
//
// # Indexes
//
// What receivers and peeks ask for is kept ordered where it changes, so no
// call walks a whole entity: each entity orders its messages by sequence
// number, and a session-aware one each session's too, in B-trees
// (order.go), for [Queue.Peek] and [Queue.PeekSession]; the sessions
// [Queue.AcceptNextSession] may take are a heap keyed by their oldest
// message (readysessions.go). TestIndexesMatchReference checks them
// against the walks they replaced on random operations.
//
// # Persistence
//
// With [Options.DataDir] the broker keeps its state in a directory: every
// call that changes durable state appends one record to a write-ahead
// journal (fsynced by one goroutine, concurrent changes sharing fsyncs),
// and snapshots replace the journal from time to time. A change is
// durable once [Broker.Sync] returns or [Broker.AfterSync] calls back,
// which is what the AMQP server waits for before acknowledging; a
// delivered message is waited for with [Broker.WaitStored]. See
// persist.go for the design and journal.go for the files.
//
// [New] cuts off a torn tail, the unfinished last record a crash leaves,
// and refuses any other damage with a [*DamageError] naming the file and
// offset, unless [Options.TruncateDamagedJournal] says to cut the journal
// at its last good record (persist_damage.go has the exact rule). A
// failed write or fsync stops the journal for good: from then on every
// Sync, AfterSync and WaitStored reports the error, so nothing after it is
// acknowledged, and [Broker.JournalFailed] is closed.
// [Broker.InjectJournalFault] makes the next write or fsync fail, for
// tests (persist_faults.go).
//
// # Deliberate simplifications
//
// There are no transactions. Entities can be added ([Broker.AddQueue],
// [Broker.AddTopic], [Broker.AddSubscription]), their settings and rules
// changed where that moves no message (manage.go), and removed when nothing
// depends on them ([Broker.RemoveQueue]); see sbemu/README.md for the list
// of supported operations.
package broker
