//go:build !live

package e2e

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/outage"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// Outage mode on a session queue through the real SDK: the first failure trips the breaker. While it is
// open (3 s, longer than the 2 s session lock) no handler runs and the failed message waits in its
// session, its lock renewed; once the dependency is back the probe closes the breaker and every message
// completes in order, none having spent an attempt on the outage.
func TestSessionOutageModeThroughTheSDK(t *testing.T) {
	parallel(t)
	const sessions, perSession = 3, 3
	em, err := sbemu.Start(sbemu.Config{Queues: []broker.QueueConfig{{Name: "sessions", RequiresSession: true, LockDuration: 2 * time.Second}}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, em.Close()) })
	e := &env{connStr: em.ConnectionString(), queue: "sessions", em: em}
	sender, err := e.client(t).NewSender(e.queue, nil)
	require.NoError(t, err)
	for s := range sessions {
		for i := range perSession {
			sid, id := fmt.Sprintf("s%d", s), fmt.Sprintf("s%d-%d", s, i)
			require.NoError(t, sender.SendMessage(t.Context(), &azservicebus.Message{MessageID: &id, SessionID: &sid, Body: []byte("x")}, nil))
		}
	}

	type call struct {
		id      string
		attempt int
		at      time.Time
		failed  bool
	}
	var (
		mu        sync.Mutex
		calls     []call
		successes = map[string][]string{}
		succeeded int
		down      atomic.Bool
		done      = make(chan struct{})
	)
	down.Store(true)
	handler := func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		sid, _ := retry.SessionIDFromContext(ctx)
		env, _ := envelope.FromContext(ctx)
		failed := down.Load()
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, call{id: m.MessageID, attempt: env.Attempt, at: time.Now(), failed: failed})
		if failed {
			return errBoom
		}
		successes[sid] = append(successes[sid], m.MessageID)
		if succeeded++; succeeded == sessions*perSession {
			close(done)
		}
		return nil
	}
	connect, err := retry.NewNamespace(e.connStr, &retry.ConnectOptions{
		Client: &azservicebus.ClientOptions{RetryOptions: fastRetries},
	}).SessionQueue(e.queue)
	require.NoError(t, err)
	sc, err := retry.NewSessionConsumer(connect, handler, &retry.Options{
		Backoff: backoff.Constant{Interval: 100 * time.Millisecond}, SettleTimeout: 5 * time.Second, Logger: quietLogger(),
		Outage: &outage.Options{ConsecutiveFailures: 1, OpenFor: 3 * time.Second},
	}, &retry.SessionOptions{MaxConcurrentSessions: 2, SessionIdleTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	runErr := make(chan error, 1)
	go func() { runErr <- sc.Run(ctx) }()

	require.Eventually(t, func() bool { return sc.Health().Outage.State == outage.Open }, testTimeout, 10*time.Millisecond)
	st := sc.Health().Outage
	down.Store(false)
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatal("the sessions were not drained in time")
	}
	cancel()
	require.NoError(t, <-runErr)

	mu.Lock()
	defer mu.Unlock()
	for s := range sessions {
		sid := fmt.Sprintf("s%d", s)
		assert.Equal(t, []string{sid + "-0", sid + "-1", sid + "-2"}, successes[sid], "session %s in order", sid)
	}
	for _, c := range calls {
		assert.Equal(t, 1, c.attempt, "%s: no attempt spent on the outage", c.id)
		if c.at.After(st.Since) && c.at.Before(st.NextProbe.Add(-100*time.Millisecond)) {
			t.Errorf("%s ran at %v while the breaker was open (%v until %v)", c.id, c.at, st.Since, st.NextProbe)
		}
	}
	h := sc.Health()
	assert.Equal(t, uint64(1), h.Outage.Trips)
	assert.Equal(t, outage.Closed, h.Outage.State)
	assert.Zero(t, h.LeftForRedelivery, "the held message kept its session: its lock was renewed through the outage")
	assert.Zero(t, h.DeadLettered)
}
