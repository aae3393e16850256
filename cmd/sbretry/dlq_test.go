package main

import (
	"context"
	"encoding/json"
	"strconv"
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

// dlqEntry is the part of `dlq list --json` the tests read.
type dlqEntry struct {
	Ref            string    `json:"ref"`
	Entity         string    `json:"entity"`
	SequenceNumber int64     `json:"sequenceNumber"`
	MessageID      string    `json:"messageId"`
	Reason         string    `json:"reason"`
	Description    string    `json:"description"`
	Attempt        int       `json:"attempt"`
	DeadLetteredAt time.Time `json:"deadLetteredAt"`
	LastError      string    `json:"lastError"`
	Key            string    `json:"key"`
	CorrelationID  string    `json:"correlationId"`
	Original       string    `json:"originalMessageId"`
}

func (h *harness) listJSON(t *testing.T, args ...string) []dlqEntry {
	t.Helper()
	code, out, errOut := h.cli(t, "", append([]string{"dlq", "list", "--json"}, args...)...)
	require.Equal(t, exitOK, code, errOut)
	var list struct {
		Entity      string     `json:"entity"`
		DeadLetters []dlqEntry `json:"deadLetters"`
		Scans       []jsonScan `json:"scans"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &list))
	assert.Equal(t, h.Entity, list.Entity)
	return list.DeadLetters
}

func keys(es []dlqEntry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.Original // the key of a chain, and the MessageID of a first delivery
	}
	return out
}

func TestDLQListFilters(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.seed(t, "perm-1", "perm-2", "max-1", "pending-1")
	all := h.listJSON(t)
	require.Len(t, all, 3)
	assert.ElementsMatch(t, []string{"perm-1", "perm-2", "max-1"}, keys(all))

	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"reason", []string{"--reason", "RetryPermanentFailure"}, []string{"perm-1", "perm-2"}},
		{"reason ignoring case", []string{"--reason", "retrymaxattemptsexceeded"}, []string{"max-1"}},
		{"contains in description", []string{"--contains", "payload in perm-2"}, []string{"perm-2"}},
		{"contains in last error", []string{"--contains", "LEDGER"}, []string{"max-1"}},
		{"since a duration ago", []string{"--since", "1h"}, []string{"perm-1", "perm-2", "max-1"}},
		{"since the future", []string{"--since", time.Now().Add(time.Hour).Format(time.RFC3339)}, []string{}},
		{"until the past", []string{"--until", "1h"}, []string{}},
		{"combined", []string{"--reason", "RetryPermanentFailure", "--contains", "perm-1"}, []string{"perm-1"}},
		{"property", []string{"--property", "tenant=acme"}, []string{"perm-1", "perm-2", "max-1"}},
		{"property of another value", []string{"--property", "tenant=globex"}, []string{}},
		{"body", []string{"--body-contains", `"PERM-2"`}, []string{"perm-2"}},
		{"property and reason", []string{"--property", "tenant=acme", "--reason", "RetryMaxAttemptsExceeded"}, []string{"max-1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.ElementsMatch(t, tc.want, keys(h.listJSON(t, tc.args...)))
		})
	}
	for _, e := range all {
		switch e.Original {
		case "max-1":
			assert.Equal(t, 2, e.Attempt)
			assert.Equal(t, "timeout calling the ledger", e.LastError)
		default:
			assert.Equal(t, 1, e.Attempt)
			assert.Equal(t, "RetryPermanentFailure", e.Reason)
		}
		assert.WithinDuration(t, time.Now(), e.DeadLetteredAt, sbtest.Timeout)
	}

	code, out, _ := h.cli(t, "", "dlq", "list")
	require.Equal(t, exitOK, code)
	assert.Regexp(t, `(?m)^ENTITY\s+SEQ\s+DEAD-LETTERED\s+REASON\s+ATTEMPT\s+ORIGINAL ID\s+DESCRIPTION$`, out)
	assert.Regexp(t, `(?m)^orders/\$DeadLetterQueue\s+\d+\s+\S+\s+RetryMaxAttemptsExceeded\s+2\s+max-1\s+timeout calling the ledger$`, out,
		"the original id, not the retry copy's sbretry-<hash>-2")
	assert.Contains(t, out, "3 dead letters")
	code, out, _ = h.cli(t, "", "dlq", "list", "--wide")
	require.Equal(t, exitOK, code)
	assert.Regexp(t, `(?m)^ENTITY\s+SEQ\s+DEAD-LETTERED\s+REASON\s+ATTEMPT\s+ORIGINAL ID\s+MESSAGE ID\s+KEY\s+DESCRIPTION$`, out)
	assert.Regexp(t, `\s+max-1\s+sbretry-[0-9a-f]+-2\s+max-1\s+`, out)

	code, _, errOut := h.cli(t, "", "dlq", "list", "--since", "yesterday")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "--since")
}

func TestDLQShow(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.seed(t, "perm-1")
	all := h.listJSON(t)
	require.Len(t, all, 1)
	seq := strconv.FormatInt(all[0].SequenceNumber, 10)
	code, out, _ := h.cli(t, "", "dlq", "show", seq)
	require.Equal(t, exitOK, code)
	for _, want := range []string{"reason:", "RetryPermanentFailure", "invalid payload in perm-1", "tenant = acme", envelope.PropDeadLetterAttempt + " = 1", `body (15 bytes):` + "\n" + `{"id":"perm-1"}`} {
		assert.Contains(t, out, want)
	}
	// A first-attempt dead letter has no envelope of its own; the consumer recorded its key and
	// correlation id on it.
	assert.Regexp(t, `(?m)^key: +perm-1$`, out)
	assert.Regexp(t, `(?m)^correlation id: +corr-perm-1$`, out)
	assert.Regexp(t, `(?m)^entity: +orders/\$DeadLetterQueue$`, out)
	code, out, _ = h.cli(t, "", "dlq", "show", seq, "--json")
	require.Equal(t, exitOK, code)
	var j struct {
		dlqEntry
		Body       string         `json:"body"`
		Properties map[string]any `json:"properties"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &j))
	assert.JSONEq(t, `{"id":"perm-1"}`, j.Body)
	assert.Equal(t, "acme", j.Properties["tenant"])
	assert.Equal(t, "perm-1", j.Key)
	assert.Equal(t, "corr-perm-1", j.CorrelationID)
	assert.Equal(t, "orders/$DeadLetterQueue:"+seq, j.Ref)

	code, _, errOut := h.cli(t, "", "dlq", "show", "999")
	assert.Equal(t, exitNotFound, code)
	assert.Contains(t, errOut, "no such message")
}

func TestRedriveBySequenceNumberAndDryRun(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.seed(t, "perm-1", "perm-2", "max-1")
	all := h.listJSON(t)
	require.Len(t, all, 3)
	var perm1 dlqEntry
	for _, e := range all {
		if e.Original == "perm-1" {
			perm1 = e
		}
	}
	seq := strconv.FormatInt(perm1.SequenceNumber, 10)

	code, out, _ := h.cli(t, "", "dlq", "redrive", "--seq", seq, "--dry-run")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "would resubmit 1 dead letters to orders:")
	assert.Regexp(t, `orders/\$DeadLetterQueue +`+seq+` +RetryPermanentFailure +perm-1 +`+perm1.MessageID+` +sbretry-resubmit-[0-9a-f]{40}`, out)
	assert.Equal(t, 3, h.Stats(t).DeadLettered, "a dry run changes nothing")
	assert.Empty(t, h.activeIDs(t))

	code, out, errOut := h.cli(t, "", "dlq", "redrive", "--seq", seq)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "resubmitted 1 dead letters to orders")
	assert.Contains(t, errOut, "sbretry: redrive 1/1")
	assert.Equal(t, 2, h.Stats(t).DeadLettered, "the other dead letters were abandoned, not taken")
	assert.ElementsMatch(t, []string{"perm-2", "max-1"}, keys(h.listJSON(t)))

	// The fresh delivery: a first delivery again, found by the original id.
	code, out, _ = h.cli(t, "", "status", "perm-1")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "active now (attempt 1)")
	assert.Contains(t, out, "message id sbretry-resubmit-")

	// The same --seq again: already done, reported, not an error.
	code, out, errOut = h.cli(t, "", "dlq", "redrive", "--seq", seq)
	require.Equal(t, exitOK, code)
	assert.Contains(t, errOut, "not in their dead-letter queue")
	assert.Contains(t, errOut, "orders/$DeadLetterQueue:"+seq)
	assert.Contains(t, out, "nothing to redrive")
	assert.Len(t, h.activeIDs(t), 1)
}

func TestRedriveByReasonThenConsumerRunsItAgain(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.seed(t, "perm-1", "max-1", "max-2")
	code, _, errOut := h.cli(t, "", "dlq", "redrive", "--reason", "RetryMaxAttemptsExceeded")
	require.Equal(t, exitOK, code, errOut)
	assert.ElementsMatch(t, []string{"perm-1"}, keys(h.listJSON(t)))
	// A consumer whose downstream recovered processes the resubmissions as first deliveries, with the
	// original id as their key.
	c := h.StartConsumer(t, func(context.Context, *azservicebus.ReceivedMessage) error { return nil }, retry.Options{})
	c.Out.WaitFor(t, "both resubmissions completed", func(ps []retry.ProcessedParams) bool {
		return sbtest.CountOutcome(ps, retry.OutcomeCompleted) == 2
	})
	for _, p := range c.Out.Snapshot() {
		assert.Equal(t, 1, p.Envelope.Attempt)
		assert.Contains(t, []string{"max-1", "max-2"}, p.Envelope.Key)
		assert.True(t, strings.HasPrefix(p.Message.MessageID, "sbretry-resubmit-"))
	}
}

// TestRedriveOfLockedDeadLetterWaitsThenFails: a dead letter locked by another receiver (say, a redrive
// that crashed a moment ago on a namespace that keeps its locks) is not received within --wait; the
// redrive says so and exits 1, and succeeds once the lock is released.
func TestRedriveOfLockedDeadLetterWaitsThenFails(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.seed(t, "perm-1", "perm-2")
	ctx := sbtest.Context(t)
	other, err := h.Client.NewReceiverForQueue(sbtest.Queue, &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	require.NoError(t, err)
	defer func() { _ = other.Close(ctx) }()
	locked, err := other.ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	require.Len(t, locked, 1)

	code, _, errOut := h.cli(t, "", "dlq", "redrive", "--all", "--wait", "300ms")
	assert.Equal(t, exitError, code)
	assert.Contains(t, errOut, "1 selected dead letters were not received within --wait 300ms, probably locked by another receiver: orders/$DeadLetterQueue:")
	assert.Contains(t, errOut, "redrive stopped after 1 of 2")

	require.NoError(t, other.AbandonMessage(ctx, locked[0], nil))
	code, out, errOut := h.cli(t, "", "dlq", "redrive", "--all", "--wait", "300ms")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "resubmitted 1 dead letters")
	assert.Len(t, h.activeIDs(t), 2)
	assert.Equal(t, 0, h.Stats(t).DeadLettered)
}

// TestRedriveReportsWhatWasSent: a redrive whose complete is refused after the send stops, exits 1,
// and its JSON says the fresh delivery was sent although the dead letter is not done.
func TestRedriveReportsWhatWasSent(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.seed(t, "perm-1")
	h.Em.RejectNextSettlements(1, "com.microsoft:message-lock-lost")
	code, out, errOut := h.cli(t, "", "dlq", "redrive", "--all", "--json")
	assert.Equal(t, exitError, code, errOut)
	var rep jsonAction
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Len(t, rep.Items, 1)
	require.NotNil(t, rep.Items[0].Sent)
	assert.True(t, *rep.Items[0].Sent)
	assert.False(t, rep.Items[0].Done)
	assert.Equal(t, 0, rep.Done)
	assert.Contains(t, rep.Error, "redrive stopped after 0 of 1")
	assert.Len(t, h.activeIDs(t), 1, "the fresh delivery is in the queue")
}

// TestDLQPropertySelects: --property selects what a redrive or purge acts on, as --reason does; a
// malformed one is a usage error, and it does not combine with --all.
func TestDLQPropertySelects(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.seed(t, "perm-1", "perm-2")
	code, out, errOut := h.cli(t, "", "dlq", "purge", "--property", "tenant=acme", "--dry-run")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "perm-1")
	assert.Contains(t, out, "perm-2")
	assert.Len(t, h.listJSON(t), 2, "a dry run")
	for _, args := range [][]string{{"--property", "tenant"}, {"--property", "tenant=acme", "--all"}} {
		code, _, errOut := h.cli(t, "", append([]string{"dlq", "purge", "--dry-run"}, args...)...)
		assert.Equal(t, exitUsage, code, errOut)
	}
}
