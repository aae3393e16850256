package inspect

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry/internal/sbtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, sbtest.IgnoreSDKLeak())
}

var errBoom = errors.New("downstream unavailable")

// harness is the shared one-queue harness (internal/sbtest) with this package's helpers.
type harness struct{ *sbtest.Harness }

func newHarness(tb testing.TB) *harness {
	tb.Helper()
	return &harness{sbtest.New(tb)}
}

func (h *harness) inspector(tb testing.TB, opts *Options) *Inspector {
	tb.Helper()
	in, err := New(h.Client, sbtest.Queue, opts)
	require.NoError(tb, err)
	return in
}
