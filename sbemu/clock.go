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
// The default real clock calls the time package directly, so inside a
// testing/synctest bubble it is the bubble's fake clock. Over TCP that does
// not help: clients and the emulator would talk over real loopback sockets,
// and a goroutine blocked in a socket read is not "durably blocked" in
// synctest's sense, so the bubble's time would never advance. With
// [Config.InMemory] the emulator opens no socket and the SDK connects
// through [Emulator.NewWebSocketConn] over a net.Pipe, whose blocked reads
// wait on channels; then the SDK, the emulator and its broker run in one
// bubble, and a receive waiting for a message scheduled an hour ahead
// returns as soon as every goroutine waits, an hour later in fake time (see
// TestSDKInsideSynctest in memconn_test.go). Start, use and close
// everything inside the bubble. The broker on its own works there too.
type Clock = broker.Clock
