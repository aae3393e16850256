package sbemu

import (
	"strings"
	"sync"
	"time"

	"github.com/sbretry/retry/internal/sbemu/wire"
)

// faults holds the state of the fault-injection hooks. The zero value is
// ready to use: no hang, no pending rejections.
type faults struct {
	// mu guards every field. A rejection count is consumed one per message
	// or settlement (takeSendRejection, takeSettleRejection), together with
	// the condition to reject with.
	mu            sync.Mutex
	hangOver      chan struct{} // non-nil while hung; closed when the hang ends
	hangTimer     *time.Timer
	rejectSends   int
	sendCond      string
	rejectSettles int
	settleCond    string
	refuseUntil   time.Time // new connections are closed at once until then
	rejectMgmt    int       // pending management rejections
	mgmtOp        string    // operation they apply to; empty means any
	mgmtStatus    int
}

// takeManagementRejection consumes one pending rejection for operation op, returning its status.
func (f *faults) takeManagementRejection(op string) (int, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rejectMgmt == 0 || (f.mgmtOp != "" && f.mgmtOp != op) {
		return 0, false
	}
	f.rejectMgmt--
	return f.mgmtStatus, true
}

// refusing reports whether new connections are being refused now.
func (f *faults) refusing() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return time.Now().Before(f.refuseUntil)
}

// waitHang blocks while the emulator is hung. It returns false if one of
// stop closed first.
func (f *faults) waitHang(stop ...<-chan struct{}) bool {
	f.mu.Lock()
	over := f.hangOver
	f.mu.Unlock()
	if over == nil {
		return true
	}
	// A select needs a fixed number of cases; callers pass at most two stop
	// channels, so the cases are spelled out instead of using reflect.
	switch len(stop) {
	case 0:
		<-over
	case 1:
		select {
		case <-over:
		case <-stop[0]:
			return false
		}
	default:
		select {
		case <-over:
		case <-stop[0]:
			return false
		case <-stop[1]:
			return false
		}
	}
	return true
}

// endHang ends the current hang, if any.
func (f *faults) endHang() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hangOver != nil {
		close(f.hangOver)
		f.hangOver = nil
	}
	if f.hangTimer != nil {
		f.hangTimer.Stop()
		f.hangTimer = nil
	}
}

// takeSendRejection consumes one pending send rejection.
func (f *faults) takeSendRejection() (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rejectSends == 0 {
		return "", false
	}
	f.rejectSends--
	return f.sendCond, true
}

// takeSettleRejection consumes one pending settlement rejection.
func (f *faults) takeSettleRejection() (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rejectSettles == 0 {
		return "", false
	}
	f.rejectSettles--
	return f.settleCond, true
}

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
	f := &e.faults
	f.mu.Lock()
	f.refuseUntil = time.Now().Add(d)
	f.mu.Unlock()
	e.log.Info("sbemu: fault: refusing connections", "duration", d)
}

// RejectNextManagement makes the next n management requests for operation (for example
// "com.microsoft:schedule-message"; empty means any) fail with the given status code, such as 500 or
// 503, without doing anything. The SDK retries some statuses itself, so n counts attempts, not calls.
// n <= 0 cancels pending rejections.
func (e *Emulator) RejectNextManagement(n int, operation string, status int) {
	f := &e.faults
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rejectMgmt, f.mgmtOp, f.mgmtStatus = max(n, 0), operation, status
}

// Hang makes the emulator stop reading and writing on every connection,
// including heartbeats and new handshakes, for d; then it resumes as if
// nothing happened. Frames sent by clients meanwhile are processed
// afterwards. A new Hang replaces a running one (Hang(0) ends it now);
// Close ends it too. A hang longer than a client's idle timeout (one minute
// for the SDK) makes that client drop the connection, as a real network
// partition would.
func (e *Emulator) Hang(d time.Duration) {
	f := &e.faults
	f.mu.Lock()
	if f.hangTimer != nil {
		f.hangTimer.Stop()
	}
	if f.hangOver == nil {
		f.hangOver = make(chan struct{})
	}
	// Real time on purpose: a hang models the network, which the mock clock
	// in Config.Clock does not drive.
	f.hangTimer = time.AfterFunc(d, f.endHang)
	f.mu.Unlock()
	e.log.Info("sbemu: fault: hanging", "duration", d)
}

// RejectNextSends makes the next n messages sent to any queue fail with an
// AMQP rejected outcome carrying condition cond (for example
// "com.microsoft:server-busy" or "amqp:internal-error"); the messages are
// not stored. n <= 0 cancels pending rejections.
func (e *Emulator) RejectNextSends(n int, cond string) {
	f := &e.faults
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rejectSends, f.sendCond = max(n, 0), cond
}

// RejectNextSettlements makes the next n link settlements (complete,
// abandon, dead-letter, release) fail with a rejected outcome carrying
// condition cond; the messages keep their locks. n <= 0 cancels pending
// rejections.
func (e *Emulator) RejectNextSettlements(n int, cond string) {
	f := &e.faults
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rejectSettles, f.settleCond = max(n, 0), cond
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
