//go:build !live

package e2e

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// startBenchEmulator starts an emulator with the "orders" queue at its defaults.
func startBenchEmulator() (*sbemu.Emulator, error) {
	return sbemu.Start(sbemu.Config{Queues: []broker.QueueConfig{{Name: "orders"}}})
}

// newEnv starts an emulator with one queue configured by q and stops it at cleanup.
func newEnv(t *testing.T, q queueSettings) *env {
	t.Helper()
	em, err := sbemu.Start(sbemu.Config{KeepLocksOnDisconnect: q.keepLocksOnDisconnect, Queues: []broker.QueueConfig{{
		Name:                     "orders",
		LockDuration:             q.lockDuration,
		MaxDeliveryCount:         q.maxDeliveryCount,
		DuplicateDetectionWindow: 10 * time.Minute,
	}}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, em.Close()) })
	t.Cleanup(func() {
		if t.Failed() { // runs before Close: show what the broker still holds
			q, _ := em.Broker().Queue("orders")
			t.Logf("queue at failure: %+v", q.Stats())
			for _, m := range q.ActiveMessages() {
				t.Logf("active: %v", m.Properties.MessageID)
			}
		}
	})
	return &env{connStr: em.ConnectionString(), queue: "orders", em: em}
}

// settled reports whether the queue holds nothing: no message available, locked or scheduled.
func (e *env) settled(t *testing.T) bool {
	q, ok := e.em.Broker().Queue(e.queue)
	require.True(t, ok)
	st := q.Stats()
	return st.Active == 0 && st.Locked == 0 && st.Scheduled == 0
}

// parallel runs the test in parallel with the others: each has its own emulator.
func parallel(t *testing.T) { t.Parallel() }
