package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/sbtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, sbtest.IgnoreSDKLeak())
}

var errBoom = errors.New("downstream unavailable")

// harness is the shared one-queue harness (internal/sbtest) with the command's helpers.
type harness struct{ *sbtest.Harness }

func newHarness(tb testing.TB) *harness {
	tb.Helper()
	return &harness{sbtest.New(tb)}
}

// cli runs the command with the emulator's connection string and the queue; stdin feeds prompts.
func (h *harness) cli(tb testing.TB, stdin string, args ...string) (code int, stdout, stderr string) {
	tb.Helper()
	return h.cliWith(tb, hooks{}, stdin, args...)
}

func (h *harness) cliWith(tb testing.TB, hk hooks, stdin string, args ...string) (code int, stdout, stderr string) {
	tb.Helper()
	var out, errOut bytes.Buffer
	a := &app{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }, now: time.Now, hooks: hk}
	full := append([]string{"--connection-string", h.Em.ConnectionString(), "--queue", sbtest.Queue}, args...)
	code = a.run(sbtest.Context(tb), full)
	tb.Logf("sbretry %s -> %d\nstdout:\n%sstderr:\n%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return code, out.String(), errOut.String()
}

// cliNoEntity runs the command with exactly args and no environment.
func cliNoEntity(tb testing.TB, stdin string, args ...string) (code int, stdout, stderr string) {
	tb.Helper()
	var out, errOut bytes.Buffer
	a := &app{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }, now: time.Now}
	code = a.run(sbtest.Context(tb), args)
	return code, out.String(), errOut.String()
}

// seed sends one message per id and runs a consumer until each reached its stage: "pending-*" fail once
// and are retried in an hour, "perm-*" fail permanently, "max-*" fail every attempt (MaxAttempts 2, so
// they are dead-lettered after one retry). It returns the consumer's results.
func (h *harness) seed(tb testing.TB, ids ...string) []retry.ProcessedParams {
	tb.Helper()
	msgs := make([]*azservicebus.Message, len(ids))
	for i, id := range ids {
		msgs[i] = sbtest.Message(id)
		msgs[i].ApplicationProperties = map[string]any{"tenant": "acme"}
	}
	h.Send(tb, msgs...)
	c := h.StartConsumer(tb, func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		env, _ := retry.EnvelopeFromContext(ctx)
		id := env.OriginalMessageID
		switch {
		case strings.HasPrefix(id, "pending-"):
			return errBoom // the backoff: an hour
		case strings.HasPrefix(id, "perm-"):
			return retry.Permanent(errors.New("invalid payload in " + id))
		case strings.HasPrefix(id, "max-"):
			return retry.RetryAfter(10*time.Millisecond, errors.New("timeout calling the ledger"))
		}
		return nil
	}, retry.Options{MaxAttempts: 2, Backoff: retry.Constant{Interval: time.Hour}, MaxConcurrency: 8})
	c.Out.WaitFor(tb, "every message at its stage", func(ps []retry.ProcessedParams) bool {
		for _, id := range ids {
			want := retry.OutcomeDeadLettered
			if strings.HasPrefix(id, "pending-") {
				want = retry.OutcomeRetryScheduled
			}
			if _, ok := sbtest.Result(ps, id, want); !ok {
				return false
			}
		}
		return true
	})
	c.Stop()
	return c.Out.Snapshot()
}

// activeIDs counts the receivable messages of the queue by MessageID.
func (h *harness) activeIDs(tb testing.TB) map[string]int {
	q, ok := h.Em.Broker().Queue(sbtest.Queue)
	require.True(tb, ok)
	out := map[string]int{}
	for _, m := range q.ActiveMessages() {
		id, _ := m.Properties.MessageID.(string)
		out[id]++
	}
	return out
}

func mustEntity(tb testing.TB, path string) inspect.Entity {
	tb.Helper()
	e, err := inspect.ParseEntity(path)
	require.NoError(tb, err)
	return e
}

func timeMust(tb testing.TB, s string) time.Time {
	tb.Helper()
	v, err := time.Parse(time.RFC3339, s)
	require.NoError(tb, err)
	return v
}

type stringsBuilder = strings.Builder

func countLines(s string) int { return strings.Count(s, "\n") }
