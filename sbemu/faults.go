package sbemu

import (
	"strings"
	"time"

	"github.com/sbretry/retry/sbemu/internal/wire"
)

// The fault hooks below are the public face of the emulator's fault
// injection. The armed state lives in package internal/fault, which the
// protocol code consults at each point where a real namespace can fail.

// DropConnections closes every client socket at once, without close
// frames, as a network failure or a broker restart would. Locks held by the
// dropped connections go back to their queues with the delivery counted.
// Clients may reconnect immediately.
func (e *Emulator) DropConnections() {
	conns := e.snapshotConns()
	e.log.Info("sbemu: fault: dropping connections", "count", len(conns))
	for _, c := range conns {
		c.abort()
	}
}

// RefuseConnections closes every new connection as soon as it is accepted, for d (real time), as an
// unreachable namespace would; existing connections are not touched (combine with DropConnections for
// a full outage). RefuseConnections(0) ends it now. Clients see their connection attempts fail, so the
// SDK's own recovery gives up and the caller's reconnect logic is exercised.
func (e *Emulator) RefuseConnections(d time.Duration) {
	e.faults.RefuseFor(d)
	e.log.Info("sbemu: fault: refusing connections", "duration", d)
}

// RejectNextManagement makes the next n management requests for operation (for example
// "com.microsoft:schedule-message"; empty means any) fail with the given status code, such as 500 or
// 503, without doing anything. The SDK retries some statuses itself, so n counts attempts, not calls.
// n <= 0 cancels pending rejections.
func (e *Emulator) RejectNextManagement(n int, operation string, status int) {
	e.faults.RejectManagement(n, operation, status)
}

// Hang makes the emulator stop reading and writing on every connection,
// including heartbeats and new handshakes, for d; then it resumes as if
// nothing happened. Frames sent by clients meanwhile are processed
// afterwards. A new Hang replaces a running one (Hang(0) ends it now);
// Close ends it too. A hang longer than a client's idle timeout (one minute
// for the SDK) makes that client drop the connection, as a real network
// partition would.
func (e *Emulator) Hang(d time.Duration) {
	// Real time on purpose: a hang models the network, which the clock in
	// Config.Clock does not drive.
	e.faults.HangFor(d)
	e.log.Info("sbemu: fault: hanging", "duration", d)
}

// RejectNextSends makes the next n messages sent to any queue fail with an
// AMQP rejected outcome carrying condition cond (for example
// "com.microsoft:server-busy" or "amqp:internal-error"); the messages are
// not stored. n <= 0 cancels pending rejections.
func (e *Emulator) RejectNextSends(n int, cond string) {
	e.faults.RejectSends(n, cond)
}

// RejectNextSettlements makes the next n link settlements (complete,
// abandon, dead-letter, release) fail with a rejected outcome carrying
// condition cond; the messages keep their locks. n <= 0 cancels pending
// rejections.
func (e *Emulator) RejectNextSettlements(n int, cond string) {
	e.faults.RejectSettlements(n, cond)
}

// ExpireLocks expires every outstanding message lock now: the messages
// become receivable again with their delivery counted, and settling them
// fails with CodeLockLost.
func (e *Emulator) ExpireLocks() {
	e.log.Info("sbemu: fault: expiring all locks")
	e.broker.ExpireAllLocks()
}

// DetachLinks detaches, from the emulator's side, every link whose address
// is entity (case-insensitive; for example "orders",
// "orders/$DeadLetterQueue" or "orders/$management") with condition
// amqp:link:detach-forced. The SDK recreates its links on the next call. It
// returns the number of links detached.
func (e *Emulator) DetachLinks(entity string) int {
	n := 0
	for _, c := range e.snapshotConns() {
		for _, s := range c.allSessions() {
			s.mu.Lock()
			var links []*link
			for _, l := range s.links {
				if strings.EqualFold(l.path, entity) {
					links = append(links, l)
				}
			}
			s.mu.Unlock()
			for _, l := range links {
				l.forceDetach(condDetachForced, "sbemu: link detached by fault injection")
				n++
			}
		}
	}
	e.log.Info("sbemu: fault: detached links", "entity", entity, "count", n)
	return n
}

// rejectedState builds a rejected outcome with an error.
func rejectedState(cond wire.Symbol, desc string) *wire.Rejected {
	return &wire.Rejected{Error: &wire.Error{Condition: cond, Description: desc}}
}
