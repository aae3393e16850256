package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/sbretry/retry/internal/sbtest"
)

// sessionQueue is the session-enabled queue of the sessions commands' tests; the held-session
// fixtures are sbtest's (internal/sbtest/sessions.go), shared with package inspect's tests.
const sessionQueue = sbtest.SessionQueue

// sessionHarness is sbtest's session emulator with the command line on its queue.
type sessionHarness struct{ *sbtest.Sessions }

func newSessionHarness(tb testing.TB) *sessionHarness {
	return &sessionHarness{sbtest.NewSessions(tb)}
}

// cli runs the command on the session queue; stdin feeds prompts.
func (h *sessionHarness) cli(tb testing.TB, stdin string, args ...string) (code int, stdout, stderr string) {
	tb.Helper()
	var out, errOut bytes.Buffer
	a := &app{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }, now: time.Now}
	full := append([]string{"--connection-string", h.Em.ConnectionString(), "--queue", sessionQueue}, args...)
	code = a.run(sbtest.Context(tb), full)
	tb.Logf("sbretry %s -> %d\nstdout:\n%sstderr:\n%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return code, out.String(), errOut.String()
}
