package retrytest_test

import (
	"errors"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

// Sessions through both doors (parity_test.go): the same scenario on a session-enabled queue, once
// through retrytest's SessionReceiver and once through the SDK's *azservicebus.SessionReceiver against
// the emulator, both used only through the sessionReceiver interface of session_test.go.

// acceptSession accepts session id on door d, or the next available session when id is nil.
func acceptSession(t *testing.T, d door, id *string) (sessionReceiver, error) {
	var (
		r   sessionReceiver
		err error
	)
	switch d := d.(type) {
	case *retrytestDoor:
		if id == nil {
			r, err = d.b.AcceptNextSession(ctx(t))
		} else {
			r, err = d.b.AcceptSession(ctx(t), *id)
		}
	case *sdkDoor:
		if id == nil {
			r, err = d.client.AcceptNextSessionForQueue(ctx(t), d.name, nil)
		} else {
			r, err = d.client.AcceptSessionForQueue(ctx(t), d.name, *id, nil)
		}
	default:
		panic("unknown door")
	}
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = r.Close(ctx(t)) })
	return r, nil
}

// receiveExactly receives n messages of the session; the SDK may hand them over in several batches.
func receiveExactly(t *testing.T, r sessionReceiver, n int) []*azservicebus.ReceivedMessage {
	t.Helper()
	var out []*azservicebus.ReceivedMessage
	for len(out) < n {
		msgs, err := r.ReceiveMessages(ctx(t), n-len(out), nil)
		require.NoError(t, err)
		out = append(out, msgs...)
	}
	return out
}

type sessionParityOutcome struct {
	First          []string // session a, received at once
	Abandoned      uint32   // the abandoned message's DeliveryCount on its return
	OtherSession   azservicebus.Code
	Deferred       string
	DeferredState  azservicebus.MessageState
	State          string
	HeldElsewhere  amqp.ErrCond
	Next           string   // the next available session after a is closed
	AfterClose     []string // session a's messages for its next receiver
	AfterCloseSeen []uint32 // and their DeliveryCounts
	StateKept      string
}

func runSessionParity(t *testing.T, d door) any {
	var out sessionParityOutcome
	seqs := map[string]int64{}
	for _, m := range [][2]string{{"a", "a1"}, {"b", "b1"}, {"a", "a2"}, {"a", "a3"}} {
		require.NoError(t, d.send(t, &azservicebus.Message{SessionID: ptr(m[0]), Body: []byte(m[1])}))
	}
	ra, err := acceptSession(t, d, ptr("a"))
	require.NoError(t, err)
	msgs := receiveExactly(t, ra, 3)
	for _, m := range msgs {
		out.First = append(out.First, string(m.Body))
		seqs[string(m.Body)] = *m.SequenceNumber
	}
	require.NoError(t, ra.AbandonMessage(ctx(t), msgs[0], nil))
	again := receiveExactly(t, ra, 1)[0]
	out.Abandoned = again.DeliveryCount
	require.NoError(t, ra.DeferMessage(ctx(t), again, nil))
	require.NoError(t, ra.CompleteMessage(ctx(t), msgs[1], nil))

	_, err = ra.ReceiveDeferredMessages(ctx(t), []int64{seqs["a1"] + 1}, nil) // b1: another session's
	var sbErr *azservicebus.Error
	if errors.As(err, &sbErr) {
		out.OtherSession = sbErr.Code
	}
	got, err := ra.ReceiveDeferredMessages(ctx(t), []int64{seqs["a1"]}, nil)
	require.NoError(t, err)
	require.Len(t, got, 1)
	out.Deferred, out.DeferredState = string(got[0].Body), got[0].State

	require.NoError(t, ra.SetSessionState(ctx(t), []byte("blocked:a1"), nil))
	state, err := ra.GetSessionState(ctx(t), nil)
	require.NoError(t, err)
	out.State = string(state)

	_, err = acceptSession(t, d, ptr("a"))
	var amqpErr *amqp.Error
	if errors.As(err, &amqpErr) {
		out.HeldElsewhere = amqpErr.Condition
	}

	// Closed with a3 and the deferred a1 locked and not settled.
	require.NoError(t, ra.Close(ctx(t)))
	next, err := acceptSession(t, d, nil)
	require.NoError(t, err)
	out.Next = next.SessionID()
	ra2, err := acceptSession(t, d, ptr("a"))
	require.NoError(t, err)
	for _, m := range receiveExactly(t, ra2, 1) {
		out.AfterClose = append(out.AfterClose, string(m.Body))
		out.AfterCloseSeen = append(out.AfterCloseSeen, m.DeliveryCount)
	}
	state, err = ra2.GetSessionState(ctx(t), nil)
	require.NoError(t, err)
	out.StateKept = string(state)
	return out
}

func TestSessionParityOfDoors(t *testing.T) {
	start := time.Now().Truncate(time.Second)
	e := entity{queue: &broker.QueueConfig{Name: "orders", RequiresSession: true, LockDuration: 30 * time.Second}}
	want := sessionParityOutcome{
		First: []string{"a1", "a2", "a3"}, Abandoned: 2, OtherSession: azservicebus.CodeNotFound,
		Deferred: "a1", DeferredState: azservicebus.MessageStateDeferred, State: "blocked:a1",
		HeldElsewhere: "com.microsoft:session-cannot-be-locked", Next: "b",
		AfterClose: []string{"a3"}, AfterCloseSeen: []uint32{1}, StateKept: "blocked:a1",
	}
	got := make([]any, len(doors))
	for i, d := range doors {
		t.Run(d.name, func(t *testing.T) {
			got[i] = runSessionParity(t, d.open(t, e, start))
			assert.Equal(t, want, got[i])
		})
	}
	assert.Equal(t, got[0], got[1], "the doors disagree")
}
