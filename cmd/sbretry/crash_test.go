package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/sbtest"
)

// TestRedriveCrashMidwayThenRerun stops a bulk redrive of n dead letters after the k-th fresh delivery
// was sent but before its dead letter was completed (the worst moment: the message exists twice), then
// runs the same command again. Every dead letter must end up resubmitted exactly once, counted by
// MessageID in the queue, and the dead-letter queue must be empty.
func TestRedriveCrashMidwayThenRerun(t *testing.T) {
	t.Parallel()
	const n, k = 8, 3
	cases := []struct {
		name  string
		crash func(h *harness, cancel context.CancelFunc)
	}{
		// The process dies: its context ends, so the complete is never acknowledged.
		{name: "context cancelled", crash: func(_ *harness, cancel context.CancelFunc) { cancel() }},
		// The broker refuses the complete, as after a lost lock.
		{name: "complete rejected by the broker", crash: func(h *harness, _ context.CancelFunc) {
			h.Em.RejectNextSettlements(1, "com.microsoft:message-lock-lost")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			ids := make([]string, n)
			for i := range ids {
				ids[i] = fmt.Sprintf("perm-%d", i)
			}
			h.seed(t, ids...)
			require.Equal(t, n, h.Stats(t).DeadLettered)
			dead := h.dryRunResubmitIDs(t, "--all") // the dead letters' resubmission ids
			require.Len(t, dead, n)

			ctx, cancel := context.WithCancel(sbtest.Context(t))
			defer cancel()
			var out1, err1 strings.Builder
			a := &app{stdin: strings.NewReader(""), stdout: &out1, stderr: &err1, getenv: func(string) string { return "" }, now: time.Now,
				hooks: hooks{afterResubmit: func(sent int, _ int64) {
					if sent == k {
						tc.crash(h, cancel)
					}
				}}}
			code := a.run(ctx, append(append([]string{"--connection-string", h.Em.ConnectionString()}, h.entityFlags()...), "dlq", "redrive", "--all"))
			t.Logf("first run -> %d\n%s%s", code, out1.String(), err1.String())
			require.Equal(t, exitError, code)
			assert.Contains(t, err1.String(), fmt.Sprintf("redrive stopped after %d of %d", k-1, n))
			assert.Contains(t, err1.String(), "run the same command again")
			assert.Equal(t, n-(k-1), h.Stats(t).DeadLettered, "the k-th dead letter is still there")
			assert.Len(t, h.activeIDs(t), k, "k fresh deliveries were sent")

			code, out, errOut := h.cli(t, "", "dlq", "redrive", "--all")
			require.Equal(t, exitOK, code, errOut)
			// The k-th was sent again: duplicate detection dropped the second copy.
			assert.Contains(t, out, fmt.Sprintf("resubmitted %d dead letters", n-k+1))

			got := h.activeIDs(t)
			assert.Len(t, got, n)
			for _, id := range dead {
				assert.Equal(t, 1, got[id], "%s resubmitted exactly once", id)
			}
			assert.Equal(t, 0, h.Stats(t).DeadLettered)
			assert.Equal(t, n, h.Stats(t).Active, "nothing else in the queue")
		})
	}
}
