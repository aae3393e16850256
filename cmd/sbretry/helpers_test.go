package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/retryindex/postgres/pgtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Stop() // the server of the --index postgres:// tests, if they started one
	if code == 0 {
		if err := goleak.Find(sbtest.IgnoreSDKLeak()); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

var errBoom = errors.New("downstream unavailable")

// harness is the shared harness (internal/sbtest) with the command's helpers.
type harness struct{ *sbtest.Harness }

// newHarness is the one-queue layout.
func newHarness(tb testing.TB) *harness {
	tb.Helper()
	return &harness{sbtest.New(tb)}
}

// newSubscriptionHarness is the README's subscription layout: a subscription and its retry queue.
func newSubscriptionHarness(tb testing.TB) *harness {
	tb.Helper()
	return &harness{sbtest.NewSubscription(tb)}
}

// entityFlags name the harness's entity as an operator would.
func (h *harness) entityFlags() []string {
	if h.RetryQueue == "" {
		return []string{"--queue", sbtest.Queue}
	}
	return []string{"--topic", sbtest.Topic, "--subscription", sbtest.Subscription, "--retry-queue", h.RetryQueue}
}

// cli runs the command with the emulator's connection string and the entity; stdin feeds prompts.
func (h *harness) cli(tb testing.TB, stdin string, args ...string) (code int, stdout, stderr string) {
	tb.Helper()
	return h.cliWith(tb, hooks{}, stdin, args...)
}

func (h *harness) cliWith(tb testing.TB, hk hooks, stdin string, args ...string) (code int, stdout, stderr string) {
	tb.Helper()
	var out, errOut bytes.Buffer
	a := &app{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }, now: time.Now, hooks: hk}
	full := append(append([]string{"--connection-string", h.Em.ConnectionString()}, h.entityFlags()...), args...)
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

// seed is [sbtest.Harness.Seed].
func (h *harness) seed(tb testing.TB, ids ...string) []retry.ProcessedParams {
	tb.Helper()
	return h.Seed(tb, ids...)
}

// activeIDs counts the receivable messages of the queue by MessageID.
func (h *harness) activeIDs(tb testing.TB) map[string]int { return h.activeIn(tb, sbtest.Queue) }

// activeIn counts the receivable messages of the queue name by MessageID.
func (h *harness) activeIn(tb testing.TB, name string) map[string]int {
	q, ok := h.Em.Broker().Queue(name)
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

// dryRunResubmitIDs runs a redrive dry run with the selection args and returns the MessageIDs it says
// the fresh deliveries will carry.
func (h *harness) dryRunResubmitIDs(tb testing.TB, args ...string) []string {
	tb.Helper()
	rep := h.actionJSON(tb, "", append([]string{"dlq", "redrive", "--dry-run"}, args...)...)
	require.True(tb, rep.DryRun)
	ids := make([]string, len(rep.Items))
	for i, it := range rep.Items {
		ids[i] = it.ResubmitMessageID
	}
	return ids
}

// actionJSON runs a redrive, purge or cancel with --json and decodes what it printed.
func (h *harness) actionJSON(tb testing.TB, stdin string, args ...string) jsonAction {
	tb.Helper()
	_, out, _ := h.cli(tb, stdin, append(args, "--json")...)
	var rep jsonAction
	require.NoError(tb, json.Unmarshal([]byte(out), &rep), out)
	return rep
}
