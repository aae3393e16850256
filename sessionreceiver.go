package retry

import (
	"bytes"
	"context"
	"errors"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// serialReceiver makes the calls on one session's receiver one at a time, and answers SessionID from
// what it was at accept. azservicebus v1.11's SessionReceiver rewrites its session id and lock expiry
// without a lock when a call recovers its link (SessionReceiver.newLink), so a renewal on the lock's
// goroutine racing a settle or a receive on the worker's is a data race (found by the sessions soak,
// soak/README.md finding 4; soak/repro/session_test.go shows the SDK's half). A receive holds the
// receiver only for a slice of receiveSlice at a time (sessionloop.go), so a renewal waits at most that
// long, plus one settle call.
//
// The lock is a channel rather than a sync.Mutex: a goroutine waiting on a channel made inside a
// testing/synctest bubble is durably blocked, so the bubble's clock moves on while a renewal waits for
// a receive slice to end; waiting on a mutex would stop the clock, and with it the slice.
type serialReceiver struct {
	turn chan struct{}
	r    SessionReceiver
	sid  string
	// retaken, when set, is called when a call other than a renewal finds that the SDK took the
	// session again (see watch); set before the worker's first call, read only by the worker's calls.
	retaken func()
}

// receiveSlice is the longest one receive holds a session's receiver; a wait for the session's next
// message is a loop of such receives until SessionIdleTimeout.
const receiveSlice = time.Second

func newSerialReceiver(r SessionReceiver) *serialReceiver {
	return &serialReceiver{turn: make(chan struct{}, 1), r: r, sid: r.SessionID()}
}

// take waits for the receiver's turn, or for ctx to end (then it returns ctx's error).
func (s *serialReceiver) take(ctx context.Context) error {
	select {
	case s.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *serialReceiver) give() { <-s.turn }

// timed runs call on the receiver in its turn and reports how long the call itself took on clk, the
// wait for the turn left out: a settle is doubted by that time (sessionserved.go doubt).
func (s *serialReceiver) timed(ctx context.Context, clk Clock, call func(SessionReceiver) error) (time.Duration, error) {
	if err := s.take(ctx); err != nil {
		return 0, err
	}
	defer s.give()
	defer s.watch(s.r.LockedUntil())
	start := clk.Now()
	err := call(s.r)
	return clk.Now().Sub(start), err
}

var _ SessionReceiver = (*serialReceiver)(nil)

func (s *serialReceiver) ReceiveMessages(ctx context.Context, n int, o *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if err := s.take(ctx); err != nil {
		return nil, err
	}
	defer s.give()
	defer s.watch(s.r.LockedUntil())
	return s.r.ReceiveMessages(ctx, n, o)
}

func (s *serialReceiver) CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.CompleteMessageOptions) error {
	if err := s.take(ctx); err != nil {
		return err
	}
	defer s.give()
	defer s.watch(s.r.LockedUntil())
	return s.r.CompleteMessage(ctx, m, o)
}

func (s *serialReceiver) DeadLetterMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.DeadLetterOptions) error {
	if err := s.take(ctx); err != nil {
		return err
	}
	defer s.give()
	defer s.watch(s.r.LockedUntil())
	return s.r.DeadLetterMessage(ctx, m, o)
}

func (s *serialReceiver) DeferMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.DeferMessageOptions) error {
	if err := s.take(ctx); err != nil {
		return err
	}
	defer s.give()
	defer s.watch(s.r.LockedUntil())
	return s.r.DeferMessage(ctx, m, o)
}

func (s *serialReceiver) ReceiveDeferredMessages(ctx context.Context, seqs []int64, o *azservicebus.ReceiveDeferredMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if err := s.take(ctx); err != nil {
		return nil, err
	}
	defer s.give()
	defer s.watch(s.r.LockedUntil())
	return s.r.ReceiveDeferredMessages(ctx, seqs, o)
}

func (s *serialReceiver) GetSessionState(ctx context.Context, o *azservicebus.GetSessionStateOptions) ([]byte, error) {
	if err := s.take(ctx); err != nil {
		return nil, err
	}
	defer s.give()
	defer s.watch(s.r.LockedUntil())
	return s.r.GetSessionState(ctx, o)
}

func (s *serialReceiver) SetSessionState(ctx context.Context, state []byte, o *azservicebus.SetSessionStateOptions) error {
	if err := s.take(ctx); err != nil {
		return err
	}
	defer s.give()
	defer s.watch(s.r.LockedUntil())
	return s.r.SetSessionState(ctx, state, o)
}

// Why replaceState wrote nothing, or doubts its write.
var (
	errStateChanged        = errors.New("retry: the session state changed since this consumer read it")
	errSessionRetaken      = errors.New("retry: the SDK took the session again after its lock was lost")
	errStateWrittenRetaken = errors.New("retry: the session state was written only after the SDK took the session again")
)

// replaceState writes next as the session's state, in one turn, only if the state is still old: what
// this consumer read at accept or wrote last. The SDK takes a session whose lock was lost again on its
// next call, without a word (azservicebus v1.11 internal/errors.go, GetRecoveryKindForSession: "a lock
// lost on a session _is_ retryable"; the new link re-accepts the same session id), so a consumer whose
// lock ran out while its handler ran would otherwise write its record over the one the session's next
// holder wrote meanwhile (e2e TestSessionStateWrittenMeanwhileIsNotOverwritten). It returns
// errStateChanged without writing when the state is not old, errSessionRetaken without writing when
// the read already took the session again, and errStateWrittenRetaken when the write went through only
// after the SDK took the session again: a state written by another holder in that moment may have been
// replaced. Both of the last two make the session lost (watch), so that the next holder starts from
// the broker's state. No check can close that last window: Service Bus offers no conditional write of
// a session state.
func (s *serialReceiver) replaceState(ctx context.Context, old, next []byte) error {
	if err := s.take(ctx); err != nil {
		return err
	}
	defer s.give()
	before := s.r.LockedUntil()
	cur, err := s.r.GetSessionState(ctx, nil)
	switch {
	case s.watch(before):
		return errSessionRetaken // read under a lock taken again: nothing written, the session is lost
	case err != nil:
		return err
	case !bytes.Equal(cur, old):
		return errStateChanged
	}
	err = s.r.SetSessionState(ctx, next, nil)
	switch retaken := s.watch(before); {
	case err != nil:
		return err // the session is lost if retaken: nothing to doubt, the write failed
	case retaken:
		return errStateWrittenRetaken
	}
	return nil
}

// watch reports whether the SDK took the session again since LockedUntil was before (only a new link
// moves it outside a renewal: azservicebus v1.11 session_receiver.go, newLink), and then calls retaken:
// the lock this consumer held was lost meanwhile, and another consumer may have held the session and
// changed it, so the session is treated as lost (its message left unsettled, the session released)
// rather than served on a view that may be stale. Called in the receiver's turn, after the call.
func (s *serialReceiver) watch(before time.Time) bool {
	if s.r.LockedUntil().Equal(before) {
		return false
	}
	if s.retaken != nil {
		s.retaken()
	}
	return true
}

func (s *serialReceiver) RenewSessionLock(ctx context.Context, o *azservicebus.RenewSessionLockOptions) error {
	if err := s.take(ctx); err != nil {
		return err
	}
	defer s.give()
	return s.r.RenewSessionLock(ctx, o)
}

// renewSessionLock renews the session lock and reads its new expiry in the same turn, for the lock
// keeper (sessionlock.go), which must not wait for a turn of its own to read it.
func (s *serialReceiver) renewSessionLock(ctx context.Context) (time.Time, error) {
	if err := s.take(ctx); err != nil {
		return time.Time{}, err
	}
	defer s.give()
	err := s.r.RenewSessionLock(ctx, nil)
	return s.r.LockedUntil(), err
}

// SessionID is the id at accept: a session receiver holds one session for its life.
func (s *serialReceiver) SessionID() string { return s.sid }

func (s *serialReceiver) LockedUntil() time.Time {
	s.turn <- struct{}{}
	defer func() { <-s.turn }()
	return s.r.LockedUntil()
}

func (s *serialReceiver) Close(ctx context.Context) error {
	if err := s.take(ctx); err != nil {
		return err
	}
	defer s.give()
	return s.r.Close(ctx)
}
