// Package topics holds the sample emulator configuration of the README's "Topics and subscriptions"
// section; the test proves that it loads and that the layout it describes works.
package topics

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry/sbemu"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSampleConfigLoads(t *testing.T) {
	cfg, err := sbemu.ConfigFromFile("Config.json")
	require.NoError(t, err)
	em := sbemu.StartT(t, cfg)
	b := em.Broker()
	for _, sub := range []string{"billing", "shipping", "audit"} {
		_, ok := b.Subscription("orders", sub)
		require.True(t, ok, sub)
	}
	for _, q := range []string{"orders-billing-retry", "orders-shipping-retry"} {
		_, ok := b.Queue(q)
		require.True(t, ok, q)
	}
}
