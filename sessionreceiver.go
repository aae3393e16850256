package retry

import (
	"context"
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
// wait for the turn left out: a settle is doubted by that time (sessionhold.go doubt).
func (s *serialReceiver) timed(ctx context.Context, clk Clock, call func(SessionReceiver) error) (time.Duration, error) {
	if err := s.take(ctx); err != nil {
		return 0, err
	}
	defer s.give()
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
	return s.r.ReceiveMessages(ctx, n, o)
}

func (s *serialReceiver) CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.CompleteMessageOptions) error {
	if err := s.take(ctx); err != nil {
		return err
	}
	defer s.give()
	return s.r.CompleteMessage(ctx, m, o)
}

func (s *serialReceiver) DeadLetterMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.DeadLetterOptions) error {
	if err := s.take(ctx); err != nil {
		return err
	}
	defer s.give()
	return s.r.DeadLetterMessage(ctx, m, o)
}

func (s *serialReceiver) DeferMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.DeferMessageOptions) error {
	if err := s.take(ctx); err != nil {
		return err
	}
	defer s.give()
	return s.r.DeferMessage(ctx, m, o)
}

func (s *serialReceiver) ReceiveDeferredMessages(ctx context.Context, seqs []int64, o *azservicebus.ReceiveDeferredMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if err := s.take(ctx); err != nil {
		return nil, err
	}
	defer s.give()
	return s.r.ReceiveDeferredMessages(ctx, seqs, o)
}

func (s *serialReceiver) GetSessionState(ctx context.Context, o *azservicebus.GetSessionStateOptions) ([]byte, error) {
	if err := s.take(ctx); err != nil {
		return nil, err
	}
	defer s.give()
	return s.r.GetSessionState(ctx, o)
}

func (s *serialReceiver) SetSessionState(ctx context.Context, state []byte, o *azservicebus.SetSessionStateOptions) error {
	if err := s.take(ctx); err != nil {
		return err
	}
	defer s.give()
	return s.r.SetSessionState(ctx, state, o)
}

func (s *serialReceiver) RenewSessionLock(ctx context.Context, o *azservicebus.RenewSessionLockOptions) error {
	if err := s.take(ctx); err != nil {
		return err
	}
	defer s.give()
	return s.r.RenewSessionLock(ctx, o)
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
