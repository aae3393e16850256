package wire

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestDeliveryStatesRoundTrip(t *testing.T) {
	tests := []struct {
		name  string
		state DeliveryState
	}{
		{name: "accepted", state: &Accepted{}},
		{name: "rejected bare", state: &Rejected{}},
		{name: "rejected dead-letter", state: &Rejected{Error: &Error{Condition: ConditionDeadLetter,
			Info: &Map{Entries: []MapEntry{{Key: "DeadLetterReason", Value: "why"}, {Key: "DeadLetterErrorDescription", Value: "desc"}}}}}},
		{name: "released", state: &Released{}},
		{name: "modified abandon", state: &Modified{MessageAnnotations: &Map{Entries: []MapEntry{{Key: Symbol("x-opt-k"), Value: "v"}}}}},
		{name: "modified flags", state: &Modified{DeliveryFailed: true, UndeliverableHere: true}},
		{name: "received", state: &Received{SectionNumber: 2, SectionOffset: 1 << 40}},
		{name: "unknown state", state: &Described{Descriptor: uint64(0x34), Value: []any{[]byte("txn")}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// States travel inside a disposition, so test them there too.
			d := &Disposition{Role: RoleReceiver, First: 1, Settled: true, State: tc.state}
			assert.Equal(t, tc.state, roundTrip(t, tc.state))
			assert.Equal(t, d, roundTrip(t, d))
		})
	}
}

func TestDeliveryStateValuesSatisfyInterface(t *testing.T) {
	states := []DeliveryState{Accepted{}, Rejected{}, Released{}, Modified{}, Received{}, Described{}}
	assert.Len(t, states, 6)
	d := roundTrip(t, Disposition{State: Accepted{}})
	assert.Equal(t, &Disposition{State: &Accepted{}}, d)
}
