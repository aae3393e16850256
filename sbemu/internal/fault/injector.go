package fault

import (
	"sync"
	"time"
)

// Injector is the set of armed faults. The zero value is ready to use: no
// hang, nothing refused, no pending rejections. All methods are safe for
// concurrent use.
type Injector struct {
	// mu guards every field. A rejection count is consumed one per message,
	// settlement or request, together with the condition or status to use.
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

// RejectSends arms n send rejections with condition cond; n <= 0 disarms.
func (f *Injector) RejectSends(n int, cond string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rejectSends, f.sendCond = max(n, 0), cond
}

// TakeSendRejection consumes one pending send rejection and returns its
// condition.
func (f *Injector) TakeSendRejection() (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rejectSends == 0 {
		return "", false
	}
	f.rejectSends--
	return f.sendCond, true
}

// RejectSettlements arms n settlement rejections with condition cond; n <= 0
// disarms.
func (f *Injector) RejectSettlements(n int, cond string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rejectSettles, f.settleCond = max(n, 0), cond
}

// TakeSettleRejection consumes one pending settlement rejection and returns
// its condition.
func (f *Injector) TakeSettleRejection() (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rejectSettles == 0 {
		return "", false
	}
	f.rejectSettles--
	return f.settleCond, true
}

// RejectManagement arms n rejections of management operation op (empty
// means any) with status; n <= 0 disarms.
func (f *Injector) RejectManagement(n int, op string, status int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rejectMgmt, f.mgmtOp, f.mgmtStatus = max(n, 0), op, status
}

// TakeManagementRejection consumes one pending rejection for operation op,
// returning its status.
func (f *Injector) TakeManagementRejection(op string) (int, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rejectMgmt == 0 || (f.mgmtOp != "" && f.mgmtOp != op) {
		return 0, false
	}
	f.rejectMgmt--
	return f.mgmtStatus, true
}

// RefuseFor makes [Injector.Refusing] true for d of real time from now;
// d <= 0 ends a refusal.
func (f *Injector) RefuseFor(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refuseUntil = time.Now().Add(d)
}

// Refusing reports whether new connections are being refused now. Real time
// on purpose: a refusal models the network, which the emulator's clock does
// not drive.
func (f *Injector) Refusing() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return time.Now().Before(f.refuseUntil)
}

// HangFor starts a hang of d (real time), or replaces the running one, so
// [Injector.WaitHang] blocks until it ends.
func (f *Injector) HangFor(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hangTimer != nil {
		f.hangTimer.Stop()
	}
	if f.hangOver == nil {
		f.hangOver = make(chan struct{})
	}
	f.hangTimer = time.AfterFunc(d, f.EndHang)
}

// EndHang ends the current hang, if any.
func (f *Injector) EndHang() {
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

// WaitHang blocks while a hang is in force. It returns false if one of stop
// closed first, so a connection being torn down is never held by a hang.
func (f *Injector) WaitHang(stop ...<-chan struct{}) bool {
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
