// Package wire encodes and decodes the AMQP 1.0 wire format for the server side
// of the Service Bus emulator in [github.com/sbretry/retry/sbemu].
//
// The emulator has to speak to the unmodified Azure Go SDK (azservicebus over
// github.com/Azure/go-amqp), and go-amqp keeps its codec in internal packages,
// so the emulator needs its own. This package is written from the OASIS AMQP 1.0
// specification: part 1 (the type system), part 2 (frames and performatives),
// part 3 (delivery states) and part 5 (SASL).
//
// The package has three layers:
//
//   - Generic values: [AppendValue] and [DecodeValue] handle every AMQP type.
//     Decoded values use plain Go types (uint32, int64, string, ...) plus the
//     small named types of this package ([Symbol], [UUID], [Char], [Map],
//     [Array], [Described], ...), so that the AMQP type survives a round trip.
//   - Composite types: the performatives ([Open], [Begin], [Attach], [Flow],
//     [Transfer], [Disposition], [Detach], [End], [Close]), the delivery states
//     ([Accepted], [Rejected], [Released], [Modified], [Received]), [Error],
//     [Source], [Target] and the SASL frames. [DecodeValue] returns them as
//     pointers whenever it meets their descriptor; [AppendValue] encodes them.
//   - Frames: [ReadProtocolHeader], [WriteProtocolHeader], [ReadFrame],
//     [AppendFrame] and [WriteFrame].
//
// Bare messages (the payload of a transfer) are not decoded here: the emulator
// uses go-amqp's exported amqp.Message MarshalBinary and UnmarshalBinary so the
// message layout is exactly the one the SDK produces.
//
// The decoder treats its input as hostile: it never panics, bounds nesting
// depth, and checks every length and element count against the bytes that are
// actually left before it allocates.
//
// Nothing in this package holds state; every function is safe for concurrent
// use. Values are not copied on encode, so do not mutate a value while another
// goroutine encodes it.
package wire
