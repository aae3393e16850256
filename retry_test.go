package retry_test

import (
	"context"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
)

func TestChainOrder(t *testing.T) {
	var order []string
	mw := func(name string) retry.Middleware {
		return func(next retry.Handler) retry.Handler {
			return func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
				order = append(order, name)
				return next(ctx, m)
			}
		}
	}
	h := retry.Chain(func(context.Context, *azservicebus.ReceivedMessage) error {
		order = append(order, "handler")
		return nil
	}, mw("a"), nil, mw("b"))
	require.NoError(t, h(t.Context(), &azservicebus.ReceivedMessage{}))
	assert.Equal(t, []string{"a", "b", "handler"}, order)
}
