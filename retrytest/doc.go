// Package retrytest is an in-memory Service Bus entity for testing handlers written for package retry,
// without Azure and without real waiting.
//
// A [Broker] implements the retry package's Receiver, Sender and Connector. It is a front door on the
// emulator's broker model (package sbemu/broker), the same model that package sbemu serves to the real
// SDK over AMQP: one implementation of the semantics, two doors, so a test passes or fails here for
// the same reason it would against the emulator. Peek-lock locks expire on the injected clock and a
// late settle fails with azservicebus.CodeLockLost; scheduled messages become receivable when the clock
// reaches their enqueue time, with a new sequence number, as on Service Bus; time-to-live (the message's
// own, capped by [BrokerOptions.DefaultMessageTimeToLive]) is enforced, expired messages are dropped or
// dead-lettered with TTLExpiredException; duplicate detection drops a MessageID seen within its window;
// messages over MaxMessageSize or with application properties over the Service Bus limits (32 KiB each,
// 64 KiB in all) are refused; a message whose last delivery's lock expires at MaxDeliveryCount is
// dead-lettered with MaxDeliveryCountExceeded; every message gets a MessageID if it has none. With
// [BrokerOptions.Subscriptions] the entity is a topic whose subscriptions select copies by their rules
// (TrueFilter, CorrelationFilter, SQL filters and actions). Fault switches ([Broker.Fail]) make the next
// N connects, receives, sends, completes, dead-letters, renewals, session accepts, session state calls,
// defers or abandons fail, on whichever of the broker's entities the call is made; for anything else, [BrokerOptions.WrapReceiver] puts the test's own code
// around every receiver the broker hands out. Inspection helpers report what was scheduled (when, for
// which attempt, with which MessageID), completed and dead-lettered.
//
// # A subscription with its retry queue
//
// A topic subscription consumed with retries has its copies scheduled to a retry queue of its own (see
// [retry.Namespace.Subscription]), so that the topic's other subscriptions never see them. One
// broker is that whole layout:
//
//	b, err := retrytest.New(mock, &retrytest.BrokerOptions{
//		EntityPath: "orders/Subscriptions/billing", // the consumed subscription
//		RetryQueue: "orders-billing-retry",
//	})
//
// [Broker.Send] publishes to the topic; [Broker.Connector] gives a [retry.Consumer] the connection the
// real connector makes (receive from the subscription and the retry queue, schedule to the retry
// queue); for a [retry.Processor], [Broker.Sender] schedules to the retry queue and
// [Broker.Receiver] and [Broker.RetryQueueReceiver] read the two entities. A copy becomes receivable in
// the retry queue when due, as a new message there. [Broker.Stats] and [Broker.DeadLettered] cover the
// topic, its subscriptions and the retry queue: the original of a failed attempt counts as Retried,
// whichever entity it came from, and a message that fails for good is in the dead-letter queue of the
// entity its last attempt came from ([DeadLetteredMessage.Entity]), as on Service Bus.
//
// # Sessions
//
// With [BrokerOptions.RequiresSession] the queue (or every subscription of the topic) is
// session-aware, as on Service Bus: [Broker.AcceptSession] and [Broker.AcceptNextSession] (and
// [Broker.AcceptSubscriptionSession], [Broker.AcceptNextSubscriptionSession]) return a
// [SessionReceiver], which has the methods of *azservicebus.SessionReceiver with the SDK's signatures
// and errors, so a session consumer written against an interface of them runs on either. A session
// is held by one receiver at a time for the lock duration, on the injected clock; its messages come
// in sequence order and their locks live under the session lock, renewed with RenewSessionLock and
// lost with it (azservicebus.CodeLockLost); a receiver that closes gives the session up with its
// unsettled messages back in order; deferral, receive by sequence number and session state are
// limited to the session held; a scheduled message with a SessionID lands in its session when due.
// AcceptNextSession waits on the broker's clock as Service Bus does and ends, as the SDK does, with
// azservicebus.CodeTimeout. The broker's plain receivers refuse a session-aware entity with
// Service Bus's amqp:not-allowed. [Broker.Sessions] and [Broker.Deferred] show each session's
// messages, holder and state, and the deferred messages, without taking any lock.
//
// Messages are translated to and from the model's AMQP form the way the SDK does on the wire, so a
// handler sees the fields it would see from the SDK: DeliveryCount, SequenceNumber, EnqueuedTime,
// LockedUntil, ScheduledEnqueueTime, DeadLetterSource, a TimeToLive that is zero (not nil) when none was
// set and ExpiresAt computed from it, and RawAMQPMessage.
//
// Differences from Service Bus (and from the SDK against the emulator) worth knowing: there are no
// transactions or auto-forwarding, and the plain receivers cannot defer (the retry package's
// Receiver has no DeferMessage; a [SessionReceiver] can); ReceiveMessages returns what is available
// at once instead of waiting a moment for more; closing a connection leaves its locks to expire unless
// [BrokerOptions.ReleaseLocksOnClose] is set (a [SessionReceiver]'s Close always gives its session
// up, as closing the SDK's does); a session receiver is always in peek-lock mode, and once its session
// lock has ended its calls fail with azservicebus.CodeLockLost at once, where the SDK first spends
// seconds trying to recover the link (and may end in com.microsoft:session-cannot-be-locked); a
// session-aware subscription cannot have a [BrokerOptions.RetryQueue]; message values are not sent
// through an encoder, so application properties keep their Go types (int stays int, times keep their
// location and nanoseconds) where the SDK would hand back int64 and UTC milliseconds; any positive duplicate detection window is
// accepted (Service Bus requires 20 s at least). Sizes are those of the message's AMQP encoding, byte
// for byte what the SDK transfers to the emulator. For tests against the real protocol, package sbemu
// serves the same model to the SDK, and the repository's e2e suite runs the library through it.
//
// Drive time with any [retry.Clock]: github.com/benbjohnson/clock's *clock.Mock for step-by-step tests
// of a [retry.Processor], or the real clock inside a testing/synctest bubble for tests of a running
// [retry.Consumer]. A Broker runs no goroutine of its own, so it needs no Close and leaves a bubble
// clean.
package retrytest
