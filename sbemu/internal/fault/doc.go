// Package fault holds the state of the emulator's fault injection: which
// failures are armed and how many of them are left. It knows nothing about
// AMQP or Service Bus; the emulator asks it, at the few points where a real
// namespace can fail (accepting a socket, reading or writing a frame, storing
// a message, settling, answering a management request), whether to fail now.
//
// Keeping the state here means the failure model can be read, and tested,
// without the protocol code around it: every method is a small
// consume-one-pending-failure step guarded by one mutex.
package fault
