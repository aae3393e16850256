//go:build live

package e2e

import (
	"os"
	"testing"
)

// newEnv uses the namespace and queue from the environment; q is ignored (configure the queue itself).
func newEnv(t *testing.T, _ queueSettings) *env {
	t.Helper()
	connStr, queue := os.Getenv("SERVICEBUS_CONNECTION_STRING"), os.Getenv("SERVICEBUS_QUEUE")
	if connStr == "" || queue == "" {
		t.Skip("set SERVICEBUS_CONNECTION_STRING and SERVICEBUS_QUEUE to run the live suite")
	}
	e := &env{connStr: connStr, queue: queue}
	e.drain(t)
	return e
}

// settled cannot see scheduled messages on a real namespace without the admin API; the tests that use
// it wait for their own outcomes first.
func (e *env) settled(*testing.T) bool { return true }

// parallel does nothing live: the tests share one queue, so they run one at a time.
func parallel(*testing.T) {}
