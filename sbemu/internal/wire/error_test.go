package wire

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestErrorRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		err  *Error
	}{
		{name: "condition only", err: &Error{Condition: ConditionNotFound}},
		{name: "with description", err: &Error{Condition: ConditionMessageLockLost, Description: "lock expired"}},
		{name: "with info", err: &Error{Condition: "x", Info: &Map{Entries: []MapEntry{{Key: Symbol("k"), Value: int32(1)}}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.err, roundTrip(t, tc.err))
		})
	}
}

func TestErrorImplementsError(t *testing.T) {
	var err error = &Error{Condition: ConditionNotFound, Description: "no queue q"}
	assert.Equal(t, "wire: amqp error amqp:not-found: no queue q", err.Error())
	var target *Error
	assert.True(t, errors.As(err, &target))
	assert.Equal(t, "wire: amqp error amqp:not-found", (&Error{Condition: ConditionNotFound}).Error())
	assert.Equal(t, "wire: <nil> amqp error", (*Error)(nil).Error())
}
