package retrytest

import (
	"errors"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// Op names a broker operation that a fault can target.
type Op int

const (
	// OpConnect is a Connector call.
	OpConnect Op = iota + 1
	// OpReceive is a ReceiveMessages call, on a plain or a session receiver, or a
	// [SessionReceiver]'s ReceiveDeferredMessages or PeekMessages.
	OpReceive
	// OpSchedule is a ScheduleMessages call (the republish of a retry).
	OpSchedule
	// OpComplete is a CompleteMessage call, on a plain or a session receiver.
	OpComplete
	// OpDeadLetter is a DeadLetterMessage call, on a plain or a session receiver.
	OpDeadLetter
	// OpRenew is a RenewMessageLock call, or a [SessionReceiver]'s RenewSessionLock.
	OpRenew
	// OpAccept is an accept of a session: [Broker.AcceptSession], [Broker.AcceptNextSession] and
	// their subscription forms.
	OpAccept
	// OpSessionState is a [SessionReceiver]'s GetSessionState or SetSessionState call.
	OpSessionState
	// OpDefer is a [SessionReceiver]'s DeferMessage call.
	OpDefer
	// OpAbandon is a [SessionReceiver]'s AbandonMessage call.
	OpAbandon
)

func (o Op) String() string {
	switch o {
	case OpConnect:
		return "connect"
	case OpReceive:
		return "receive"
	case OpSchedule:
		return "schedule"
	case OpComplete:
		return "complete"
	case OpDeadLetter:
		return "dead-letter"
	case OpRenew:
		return "renew"
	case OpAccept:
		return "accept"
	case OpSessionState:
		return "session-state"
	case OpDefer:
		return "defer"
	case OpAbandon:
		return "abandon"
	}
	return "unknown"
}

// ErrInjected is the default error of an injected fault.
var ErrInjected = errors.New("retrytest: injected fault")

// ErrConnectionLost is an SDK error with azservicebus.CodeConnectionLost, handy as a fault.
var ErrConnectionLost error = &azservicebus.Error{Code: azservicebus.CodeConnectionLost}

// fault is a pending injected failure: the next remaining calls of its Op return err.
type fault struct {
	remaining int
	err       error
}

// Fail makes the next n calls of op fail with err (nil means [ErrInjected]). n <= 0 clears the fault.
// A receive call already blocked waiting for messages fails at once.
// A failed settle leaves the message locked, as a real failed call would.
func (b *Broker) Fail(op Op, n int, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	defer b.notifyLocked() // wake blocked receivers so that a receive fault applies at once
	if n <= 0 {
		delete(b.faults, op)
		return
	}
	if err == nil {
		err = ErrInjected
	}
	b.faults[op] = &fault{remaining: n, err: err}
}

// takeFaultLocked consumes one pending fault of op, if any.
func (b *Broker) takeFaultLocked(op Op) error {
	f, ok := b.faults[op]
	if !ok {
		return nil
	}
	f.remaining--
	if f.remaining <= 0 {
		delete(b.faults, op)
	}
	return f.err
}
