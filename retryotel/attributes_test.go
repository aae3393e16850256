package retryotel

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"

	"github.com/sbretry/retry"
)

func TestParseEntity(t *testing.T) {
	for _, tc := range []struct {
		name, path string
		want       destination
		span       string
	}{
		{"queue", "orders", destination{name: "orders"}, "process orders"},
		{"subscription", "events/Subscriptions/billing", destination{name: "events", subscription: "billing"}, "process events"},
		{"subscription any case", "events/subscriptions/billing", destination{name: "events", subscription: "billing"}, "process events"},
		{"unknown", "", destination{}, "process"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := parseEntity(tc.path)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.span, got.spanName(opProcess))
		})
	}
}

// codedError names its own error.type.
type codedError struct{}

func (codedError) Error() string     { return "card declined" }
func (codedError) ErrorType() string { return "payment_declined" }

// plainError is a user's error type without an ErrorType method.
type plainError struct{}

func (*plainError) Error() string { return "plain" }

func TestErrorType(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"errors.New", errors.New("boom"), "*errors.errorString"},
		{"user type", &plainError{}, "*retryotel.plainError"},
		{"user type wrapped", fmt.Errorf("charging: %w", &plainError{}), "*retryotel.plainError"},
		{"permanent", retry.Permanent(&plainError{}), "*retryotel.plainError"},
		{"wrapped permanent", fmt.Errorf("x: %w", retry.Permanent(&plainError{})), "*retryotel.plainError"},
		{"retry after", retry.RetryAfter(time.Second, &plainError{}), "*retryotel.plainError"},
		{"ErrorType method", retry.Permanent(fmt.Errorf("y: %w", codedError{})), "payment_declined"},
		{"sdk code", fmt.Errorf("settle: %w", &azservicebus.Error{Code: azservicebus.CodeConnectionLost}), "connlost"},
		{"lock lost", fmt.Errorf("%w: expired", retry.ErrLockLost), "locklost"},
		{"panic", fmt.Errorf("%w: nil map", retry.ErrHandlerPanic), ErrorTypeHandlerPanic},
		{"deadline", context.DeadlineExceeded, "timeout"},
		{"canceled", fmt.Errorf("stop: %w", context.Canceled), ErrorTypeCanceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, errorType(tc.err))
		})
	}
}
