package inspect

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/sbtest"
)

// sessionQueue is the session-enabled queue of the session tests; the held-session fixtures are
// sbtest's (internal/sbtest/sessions.go).
const sessionQueue = sbtest.SessionQueue

// sessionHarness is sbtest's session emulator with an inspector on its queue.
type sessionHarness struct{ *sbtest.Sessions }

func newSessionHarness(tb testing.TB) *sessionHarness {
	return &sessionHarness{sbtest.NewSessions(tb)}
}

func (h *sessionHarness) inspector(tb testing.TB, opts *Options) *Inspector {
	tb.Helper()
	in, err := New(h.Client, sessionQueue, opts)
	require.NoError(tb, err)
	return in
}
