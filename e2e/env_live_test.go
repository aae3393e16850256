//go:build live

package e2e

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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

// drain completes whatever a live queue still holds from earlier runs.
func (e *env) drain(t *testing.T) {
	t.Helper()
	r, err := e.client(t).NewReceiverForQueue(e.queue, nil)
	require.NoError(t, err)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		msgs, err := r.ReceiveMessages(ctx, 100, nil)
		cancel()
		if err != nil || len(msgs) == 0 {
			return
		}
		for _, m := range msgs {
			_ = r.CompleteMessage(t.Context(), m, nil)
		}
	}
}
