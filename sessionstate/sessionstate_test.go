package sessionstate_test

import (
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry/sessionstate"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The record round-trips, and what is not ours is told apart from what is broken.
func TestDecodeSessionState(t *testing.T) {
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	st := sessionstate.State{Hold: &sessionstate.Hold{SequenceNumber: 7, MessageID: "m", Attempt: 3, FirstFailure: at, WakeAt: at.Add(time.Minute), WakeID: "w", LastError: "boom", ImmediateRetries: 2}, Followers: []int64{9, 8}}
	raw, err := sessionstate.Marshal(st)
	require.NoError(t, err)
	got, err := sessionstate.Decode(raw)
	require.NoError(t, err)
	assert.Equal(t, st, got)
	empty, err := sessionstate.Marshal(sessionstate.State{})
	require.NoError(t, err)
	assert.Nil(t, empty, "nothing held clears the state")

	for _, foreign := range []string{"hello", `{"cart":1}`, `{"format":"sbretry/v9"}`, `[1,2]`} {
		_, err := sessionstate.Decode([]byte(foreign))
		assert.ErrorIs(t, err, sessionstate.ErrForeign, foreign)
	}
	for _, broken := range []string{
		`{"format":"sbretry/v1","hold":{"seq":-1,"attempt":2}}`,
		`{"format":"sbretry/v1","hold":{"seq":1,"attempt":1}}`,
		`{"format":"sbretry/v1","hold":{"seq":1,"attempt":2},"followers":[1]}`,
		`{"format":"sbretry/v1","followers":[3,3]}`,
		`{"format":"sbretry/v1","hold":{"seq":1,"attempt":2,"immediate":-1}}`,
		`{"format":"sbretry/v1","hold":{"seq":1,"attempt":2,"immediate":2}}`,
	} {
		_, err := sessionstate.Decode([]byte(broken))
		require.ErrorIs(t, err, sessionstate.ErrInvalid, broken)
		assert.NotErrorIs(t, err, sessionstate.ErrForeign, broken)
	}
	_, err = sessionstate.PlanRelease("s", sessionstate.State{}, at)
	assert.ErrorIs(t, err, sessionstate.ErrNotHeld)
	plan, err := sessionstate.PlanRelease("s", st, at)
	require.NoError(t, err)
	assert.Equal(t, at, plan.After.Hold.WakeAt, "a retry hold is made due now")
	assert.Equal(t, plan.After.Hold.WakeID, *plan.Wake.MessageID)
	assert.Equal(t, plan.WakeID, *plan.Wake.MessageID)
	assert.Equal(t, int64(7), plan.WakeFor)
	wake := &azservicebus.ReceivedMessage{ApplicationProperties: plan.Wake.ApplicationProperties}
	forSeq, ok := sessionstate.IsWakeUp(wake)
	assert.True(t, ok)
	assert.Equal(t, int64(7), forSeq)
	_, ok = sessionstate.IsWakeUp(&azservicebus.ReceivedMessage{ApplicationProperties: map[string]any{"x": 1}})
	assert.False(t, ok)
	blocked := sessionstate.State{Hold: &sessionstate.Hold{SequenceNumber: 7, Attempt: 2, DeadLetterReason: "RetryPermanentFailure"}, Followers: []int64{9}}
	plan, err = sessionstate.PlanRelease("s", blocked, at.Add(1500*time.Microsecond).In(time.FixedZone("x", 3600)))
	require.NoError(t, err)
	assert.Nil(t, plan.After.Hold, "a dead-letter block is lifted")
	assert.Equal(t, []int64{7, 9}, plan.After.Followers, "the dead-lettered message heads the followers, in case it is still there")
	assert.Equal(t, int64(sessionstate.NoHeldMessage), plan.WakeFor)
	assert.Equal(t, "s", *plan.Wake.SessionID)
	assert.Equal(t, 3, st.Hold.Attempt, "the plan does not change its input")
}

// A release's wake-up has an id of its own per session and per record released: two sessions released
// for the same planned time would otherwise send the same id, and duplicate detection would drop the
// second session's wake-up. The same release planned twice keeps its id, so a resend is absorbed.
func TestReleaseWakeUpIDsAreUniquePerSession(t *testing.T) {
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	blocked := sessionstate.State{Hold: &sessionstate.Hold{SequenceNumber: 7, Attempt: 2, DeadLetterReason: "RetryPermanentFailure"}}
	waiting := sessionstate.State{Hold: &sessionstate.Hold{SequenceNumber: 7, Attempt: 2, WakeAt: at.Add(time.Hour), WakeID: "w"}}
	ids := map[string]string{}
	for _, sid := range []string{"a", "b", "a-longer-one"} {
		for name, st := range map[string]sessionstate.State{"blocked": blocked, "waiting": waiting} {
			plan, err := sessionstate.PlanRelease(sid, st, at)
			require.NoError(t, err)
			id := plan.WakeID
			assert.LessOrEqual(t, len(id), 128)
			if prev, dup := ids[id]; dup {
				t.Errorf("%s/%s has the wake-up id of %s: %s", sid, name, prev, id)
			}
			ids[id] = sid + "/" + name
			again, err := sessionstate.PlanRelease(sid, st, at)
			require.NoError(t, err)
			assert.Equal(t, id, again.WakeID, "the same release plans the same id")
		}
	}
	// Another record of the same session (blocked again, later), released for the same time.
	later := sessionstate.State{Hold: &sessionstate.Hold{SequenceNumber: 9, Attempt: 2, DeadLetterReason: "RetryPermanentFailure"}}
	plan, err := sessionstate.PlanRelease("a", later, at)
	require.NoError(t, err)
	assert.NotContains(t, ids, plan.WakeID)
}
