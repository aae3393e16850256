package sbemu

import "github.com/sbretry/retry/sbemu/broker"

// Clock is the emulator's source of time for Service Bus semantics: lock
// expiry, scheduled activation, time-to-live, duplicate detection and SAS
// token expiry. It is [broker.Clock] under a name that needs no second
// import: two methods of standard-library types (Now and After), satisfied
// as they are by github.com/benbjohnson/clock's Clock and *Mock and by the
// library's retry.Clock, so one fake clock can drive a consumer and the
// emulator together.
//
// A test that advances a fake clock sees, through the real SDK, a scheduled
// message become receivable, a lock expire (the message is redelivered and a
// late settle fails with CodeLockLost) and a time-to-live lapse, with no real
// waiting; see TestSDKFakeClock in clock_test.go. Set the fake clock to the
// present first (mock.Set(time.Now())), because the SDK reads the times the
// emulator stamps on messages, such as LockedUntil.
//
// # testing/synctest
//
// The default real clock calls the time package directly, so the broker on
// its own works inside a testing/synctest bubble: its goroutines block only
// on channels, and fake time advances when they are all parked. The AMQP
// emulator does not: clients and the emulator talk over real loopback
// sockets, and a goroutine blocked in a socket read is not "durably
// blocked" in synctest's sense, so the bubble's clock would never advance
// while a connection is open (and the SDK's own timers would stall with
// it). Inside synctest, use package broker directly; across the wire, use
// a fake Clock.
type Clock = broker.Clock
