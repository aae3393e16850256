package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/sbtest"
)

// With the real retry.SessionConsumer: its durable hold (a retry due in an hour) and its block after a
// dead-letter are what sessions list shows, and sessions release makes the consumer go on at once, in
// order.
func TestSessionsReleaseWithTheConsumer(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	h.Send(t, "s-retry", "r1", "r2")
	h.Send(t, "s-dead", "d1", "d2")

	var mu sync.Mutex
	var ran []string
	handler := func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		env, _ := envelope.FromContext(ctx)
		mu.Lock()
		ran = append(ran, m.MessageID)
		mu.Unlock()
		switch {
		case m.MessageID == "d1":
			return retry.Permanent(errBoom)
		case m.MessageID == "r1" && env.Attempt == 1:
			return errBoom
		}
		return nil
	}
	connect, err := retry.NewNamespace(h.Em.ConnectionString(), &retry.ConnectOptions{Client: &azservicebus.ClientOptions{RetryOptions: sbtest.FastRetries}}).SessionQueue(sessionQueue)
	require.NoError(t, err)
	sc, err := retry.NewSessionConsumer(connect, handler, &retry.Options{
		Backoff: backoff.Constant{Interval: time.Hour}, SettleTimeout: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, &retry.SessionOptions{SessionIdleTimeout: 300 * time.Millisecond, MaxHold: time.Nanosecond, DurableHolds: true, BlockAfterDeadLetter: true})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(sbtest.Context(t))
	errc := make(chan error, 1)
	go func() { errc <- sc.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("consumer: %v", err)
		}
	}()

	// Both sessions held, and let go by the consumer.
	var list jsonHeldSessions
	waitFor(t, "both sessions held and idle", func() bool {
		_, out, _ := h.cli(t, "", "sessions", "list", "--json")
		list = jsonHeldSessions{}
		if json.Unmarshal([]byte(out), &list) != nil {
			return false
		}
		statuses := map[string]string{}
		for _, s := range list.Sessions {
			statuses[s.SessionID] = s.Status
		}
		return statuses["s-retry"] == statusWaiting && statuses["s-dead"] == statusDeadLettered &&
			len(sessionNamed(list, "s-retry").State.Followers) == 1 && len(sessionNamed(list, "s-dead").State.Followers) == 1
	})
	held := sessionNamed(list, "s-retry")
	assert.Equal(t, "r1", held.State.Hold.MessageID)
	assert.Equal(t, 2, held.State.Hold.Attempt)
	require.NotNil(t, held.NextWakeUp, "the consumer's wake-up is in the session")
	assert.True(t, held.NextWakeUp.Scheduled)
	assert.WithinDuration(t, time.Now().Add(time.Hour), held.NextWakeUp.DueTime, time.Minute)
	assert.Equal(t, "d1", sessionNamed(list, "s-dead").State.Hold.MessageID)

	for _, sid := range []string{"s-retry", "s-dead"} {
		code, _, errOut := h.cli(t, "", "sessions", "release", "--session", sid, "--yes")
		require.Equal(t, exitOK, code, errOut)
	}
	waitFor(t, "the released sessions to run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return count(ran, "r1") == 2 && count(ran, "r2") == 1 && count(ran, "d2") == 1
	})
	mu.Lock()
	assert.Equal(t, []string{"r1", "r2"}, only(ran, "r1", "r2")[1:], "r1 ran again before r2")
	mu.Unlock()
	waitFor(t, "no session held any more", func() bool {
		_, out, _ := h.cli(t, "", "sessions", "list", "--json")
		list = jsonHeldSessions{}
		return json.Unmarshal([]byte(out), &list) == nil && len(list.Sessions) == 0
	})
}

func sessionNamed(l jsonHeldSessions, sid string) jsonHeldSession {
	for _, s := range l.Sessions {
		if s.SessionID == sid {
			return s
		}
	}
	return jsonHeldSession{State: &jsonSessionState{Hold: &jsonHold{}}}
}

func count(xs []string, x string) int {
	n := 0
	for _, y := range xs {
		if y == x {
			n++
		}
	}
	return n
}

// only keeps the elements of xs that are among keep, in order.
func only(xs []string, keep ...string) []string {
	var out []string
	for _, x := range xs {
		for _, k := range keep {
			if x == k {
				out = append(out, x)
			}
		}
	}
	return out
}

// waitFor polls cond every 50 ms until it holds, failing after sbtest.Timeout.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(sbtest.Timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
