package sbemu

import "fmt"

// Limits bound what clients can make the emulator hold, so a misbehaving or
// hostile client (the emulator accepts unauthenticated connections) cannot
// exhaust memory or goroutines: without them one socket could open 4096
// sessions of 4096 links, each with a goroutine, stall its own reads while
// the emulator queued megabytes for it, and park a partial message of
// megabytes on every link.
//
// Each field's zero value means the default given with it, which is far
// above what the Go SDK needs in normal use; a negative value means no limit.
// A limit that is hit gives the client a clear AMQP error with condition
// amqp:resource-limit-exceeded naming the limit, except the outgoing-bytes
// limit, which is back-pressure rather than an error (see its field).
type Limits struct {
	// MaxConnections bounds open client connections. A connection over the
	// limit completes the AMQP handshake and is then closed with
	// amqp:resource-limit-exceeded, so the client can tell why. Default
	// 1000 (Service Bus Standard allows 5000 AMQP connections per
	// namespace; a test needs far fewer).
	MaxConnections int

	// MaxSessionsPerConnection bounds the sessions open at the same time on
	// one connection; a begin over the limit is answered with a begin and
	// an end carrying amqp:resource-limit-exceeded. Default 256 (the SDK
	// opens one per sender or receiver, one for management and short-lived
	// ones for CBS).
	MaxSessionsPerConnection int

	// MaxLinksPerSession bounds the links attached at the same time on one
	// session; an attach over the limit is refused (attach reply without
	// terminus, then a detach with amqp:resource-limit-exceeded). Default 64
	// (the SDK uses at most two per session).
	MaxLinksPerSession int

	// MaxOutgoingBytesPerConnection bounds the encoded frames queued for a
	// client that reads slower than it grants credit. Message deliveries
	// (and management replies) wait while the queue is over the limit, so
	// memory stays bounded even when a client grants unlimited credit and
	// window; frames the emulator must send in answer to the client (flow,
	// disposition, attach) are never held back, so the connection cannot
	// deadlock. A client that stops reading altogether is disconnected once
	// a write has been stuck for 30 seconds. Default 16 MiB.
	MaxOutgoingBytesPerConnection int

	// MaxPeekCount bounds message-count of one peek request, and the
	// number of sequence numbers of one receive-by-sequence-number
	// (deferred messages); a larger count is answered with status 400
	// naming the limit. The Go SDK treats a 400
	// from the management node as a connection problem and retries it
	// (azservicebus internal/errors.go), so the error reaches the caller
	// after the client's RetryOptions are spent. Default 1000. Peek
	// replies are also cut at 4 MiB of encoded messages (a peek may always
	// return fewer messages than asked for), so a peek of large messages
	// cannot build a huge reply.
	MaxPeekCount int

	// MaxPartialMessageBytesPerConnection bounds the bytes of multi-frame
	// messages still being assembled, summed over every link of a
	// connection; exceeding it closes the connection with
	// amqp:resource-limit-exceeded. It must exceed the largest message the
	// connection legitimately sends. Default 64 MiB.
	MaxPartialMessageBytesPerConnection int
}

// Defaults for [Limits] fields left zero.
const (
	DefaultMaxConnections                      = 1000
	DefaultMaxSessionsPerConnection            = 256
	DefaultMaxLinksPerSession                  = 64
	DefaultMaxOutgoingBytesPerConnection       = 16 << 20
	DefaultMaxPeekCount                        = 1000
	DefaultMaxPartialMessageBytesPerConnection = 64 << 20
)

// maxPeekReplyBytes caps the encoded messages of one peek reply.
const maxPeekReplyBytes = 4 << 20

// withDefaults replaces zero fields by their defaults and negative ones by
// "unlimited" (the largest int), so checks are a plain comparison.
func (l Limits) withDefaults() Limits {
	fix := func(v *int, def int) {
		switch {
		case *v == 0:
			*v = def
		case *v < 0:
			*v = int(^uint(0) >> 1)
		}
	}
	fix(&l.MaxConnections, DefaultMaxConnections)
	fix(&l.MaxSessionsPerConnection, DefaultMaxSessionsPerConnection)
	fix(&l.MaxLinksPerSession, DefaultMaxLinksPerSession)
	fix(&l.MaxOutgoingBytesPerConnection, DefaultMaxOutgoingBytesPerConnection)
	fix(&l.MaxPeekCount, DefaultMaxPeekCount)
	fix(&l.MaxPartialMessageBytesPerConnection, DefaultMaxPartialMessageBytesPerConnection)
	return l
}

// limitError describes an exceeded limit for the client.
func limitError(name string, limit int) string {
	return fmt.Sprintf("sbemu: %s limit of %d exceeded (see sbemu.Limits)", name, limit)
}
