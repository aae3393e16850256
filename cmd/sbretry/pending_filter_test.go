package main

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/sbtest"
)

// seedPendingKinds leaves three pending retries that differ in what the filters read: the last
// error, the property region, the body and the due time (in 1 h, 3 h and 5 h).
func seedPendingKinds(t *testing.T, h *harness) {
	t.Helper()
	kinds := map[string]struct {
		region, body, err string
		in                time.Duration
	}{
		"eu-1": {"eu", "invoice alpha", "timeout calling the ledger", time.Hour},
		"us-1": {"us", "invoice beta", "connection refused by payments", 3 * time.Hour},
		"eu-2": {"eu", "refund gamma", "connection refused by payments", 5 * time.Hour},
	}
	var msgs []*azservicebus.Message
	for id, k := range kinds {
		m := sbtest.Message(id)
		m.ApplicationProperties = map[string]any{"region": k.region}
		m.Body = []byte(k.body)
		msgs = append(msgs, m)
	}
	h.Send(t, msgs...)
	c := h.StartConsumer(t, func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		env, _ := envelope.FromContext(ctx)
		k := kinds[env.OriginalMessageID]
		return retry.RetryAfter(k.in, errors.New(k.err))
	}, retry.Options{MaxAttempts: 5})
	c.Out.WaitFor(t, "every message scheduled for a retry", func(ps []retry.ProcessedParams) bool {
		return sbtest.CountOutcome(ps, retry.OutcomeRetryScheduled) == len(kinds)
	})
	c.Stop()
}

// pendingIDs runs pending --json with args and returns the original ids listed, in due order.
func (h *harness) pendingIDs(t *testing.T, args ...string) []string {
	t.Helper()
	code, out, errOut := h.cli(t, "", append([]string{"pending", "--json"}, args...)...)
	require.Equal(t, exitOK, code, errOut)
	var page struct {
		Pending []jsonPending `json:"pending"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &page))
	ids := []string{}
	for _, p := range page.Pending {
		ids = append(ids, p.OriginalMessageID)
	}
	return ids
}

// TestPendingFilters: pending lists only the retries that pass every filter given, by the last error
// (ignoring case), an application property, the due time (a time, or a duration ahead of now) and the
// body; a filtered listing's next page keeps the filters.
func TestPendingFilters(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	seedPendingKinds(t, h)
	require.Equal(t, []string{"eu-1", "us-1", "eu-2"}, h.pendingIDs(t), "unfiltered, by due time")

	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"last error", []string{"--contains", "CONNECTION refused"}, []string{"us-1", "eu-2"}},
		{"property", []string{"--property", "region=eu"}, []string{"eu-1", "eu-2"}},
		{"property and last error", []string{"--property", "region=eu", "--contains", "refused"}, []string{"eu-2"}},
		{"due within two hours", []string{"--due-before", "2h"}, []string{"eu-1"}},
		{"due between two and four hours", []string{"--due-after", "2h", "--due-before", "4h"}, []string{"us-1"}},
		{"due after a time", []string{"--due-after", time.Now().Add(4 * time.Hour).UTC().Format(time.RFC3339)}, []string{"eu-2"}},
		{"body", []string{"--body-contains", "GAMMA"}, []string{"eu-2"}},
		{"body and property", []string{"--body-contains", "invoice", "--property", "region=us"}, []string{"us-1"}},
		{"nothing matches", []string{"--property", "region=ap"}, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, h.pendingIDs(t, tc.args...))
		})
	}

	code, out, errOut := h.cli(t, "", "pending", "--property", "region=ap")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "no matching pending retries")

	// Page by page: the command that continues carries the filters.
	code, out, errOut = h.cli(t, "", "pending", "--limit", "1", "--contains", "connection refused")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "us-1")
	assert.Regexp(t, `more: sbretry pending --limit 1 --cursor \S+ --contains 'connection refused'\n`, out, "quoted for the shell")
	code, out, errOut = h.cli(t, "", "pending", "--limit", "1", "--property", "region=eu")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "eu-1")
	more := regexp.MustCompile(`more: sbretry pending (.*)`).FindStringSubmatch(out)
	require.NotNil(t, more, out)
	next := strings.Fields(more[1])
	assert.Equal(t, []string{"--property", "region=eu"}, next[len(next)-2:])
	code, out, errOut = h.cli(t, "", append([]string{"pending"}, next...)...)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "eu-2")
	assert.NotContains(t, out, "us-1")
	assert.NotContains(t, out, "more:")
}

// TestPendingFiltersRefused: a filter that cannot be read, an empty due window, and filters with
// --index (which lists the whole backlog unfiltered) are usage errors, before anything is read.
func TestPendingFiltersRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"property without a value", []string{"--property", "region"}, "is not NAME=VALUE"},
		{"due time unreadable", []string{"--due-before", "tomorrow"}, "--due-before: \"tomorrow\" is neither"},
		{"negative duration", []string{"--due-after", "-1h"}, "--due-after"},
		{"empty window", []string{"--due-after", "5h", "--due-before", "1h"}, "is not before --due-before"},
		{"filters with the index", []string{"--index", "state.db", "--contains", "x"}, "takes no filters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := cliNoEntity(t, "", append([]string{"--connection-string", "Endpoint=sb://localhost:1;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true", "--queue", "orders", "pending"}, tc.args...)...)
			assert.Equal(t, exitUsage, code, errOut)
			assert.Contains(t, errOut, tc.want)
		})
	}
}

func TestShellQuote(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"region=eu", "region=eu"},
		{"a b", "'a b'"},
		{"it's", `'it'\''s'`},
		{"$(rm)", "'$(rm)'"},
		{"esc\x1b[2J", `"esc\x1b[2J"`},
	} {
		assert.Equal(t, tc.want, shellQuote(tc.in), "%q", tc.in)
	}
}

// TestPendingQuotesHostileText: the ids, the key and the last error of a pending retry are any
// producer's or handler's text; pending prints them quoted with Go escapes, never raw.
func TestPendingQuotesHostileText(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	m := sbtest.Message("p-\x1b[31mred\u202e")
	m.ApplicationProperties = map[string]any{envelope.PropKey: "k\x1b[2J"}
	h.Send(t, m)
	c := h.StartConsumer(t, func(context.Context, *azservicebus.ReceivedMessage) error {
		return errors.New("down\x1b]0;pwned\x07 \u200b")
	}, retry.Options{MaxAttempts: 5})
	c.Out.WaitFor(t, "the retry scheduled", func(ps []retry.ProcessedParams) bool {
		return sbtest.CountOutcome(ps, retry.OutcomeRetryScheduled) == 1
	})
	c.Stop()
	code, out, errOut := h.cli(t, "", "pending", "--wide")
	require.Equal(t, exitOK, code, errOut)
	for _, bad := range []string{"\x1b", "\x07", "\u202e", "\u200b"} {
		assert.NotContains(t, out, bad)
	}
	assert.Contains(t, out, `"p-\x1b[31mred\u202e"`)
	assert.Contains(t, out, `"k\x1b[2J"`)
	assert.Contains(t, out, `"down\x1b]0;pwned\a \u200b"`)
}
