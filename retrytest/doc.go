// Package retrytest is an in-memory Service Bus queue for testing handlers written for package retry,
// without Azure and without real waiting.
//
// A [Broker] implements the retry package's Receiver, Sender and Connector with peek-lock semantics:
// locks expire on the injected clock, scheduled messages become receivable when the clock reaches their
// enqueue time, dead-lettered messages are kept with their reason, and fault switches make the next N
// connects, receives, sends, completes, dead-letters or renewals fail. Inspection helpers report what was
// scheduled (when, for which attempt, with which MessageID), completed and dead-lettered.
//
// Differences from Service Bus worth knowing: a scheduled message keeps the sequence number that
// ScheduleMessages returned when it becomes receivable (Service Bus assigns a new one), time-to-live is
// not enforced, duplicate detection (when on) has no window, and there are no sessions, deferral or
// topics. For tests against the real protocol, the repository's e2e suite runs the SDK against an
// in-process emulator.
//
// Drive time with any [retry.Clock]: github.com/benbjohnson/clock's *clock.Mock for step-by-step tests
// of a [retry.Processor], or the real clock inside a testing/synctest bubble for tests of a running
// [retry.Consumer].
package retrytest
