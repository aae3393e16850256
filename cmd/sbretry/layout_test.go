package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/sbtest"
)

// The subscription layout of the README: a subscription and the retry queue its consumer schedules
// copies on. Each has a dead-letter queue that counts sequence numbers on its own, so the first dead
// letter of each is number 1. These tests seed exactly that collision (perm-1 dead-lettered at its first
// attempt from the subscription, max-1 after its retry from the retry queue) and check that every
// command acts on the dead letter it was given, in its own dead-letter queue.

const (
	subDLQ   = sbtest.SubscriptionPath + "/$DeadLetterQueue"
	retryDLQ = sbtest.RetryQueue + "/$DeadLetterQueue"
)

// collidingLayout seeds the layout and returns the two dead letters, checking that they collide. extra
// ids must not be dead-lettered (pending-*), or the numbering would depend on the order of handling.
func collidingLayout(t *testing.T, extra ...string) (h *harness, sub, rq dlqEntry) {
	t.Helper()
	h = newSubscriptionHarness(t)
	h.seed(t, append([]string{"perm-1", "max-1"}, extra...)...)
	all := h.listJSON(t)
	require.Len(t, all, 2)
	for _, e := range all {
		switch e.Entity {
		case subDLQ:
			sub = e
		case retryDLQ:
			rq = e
		}
	}
	require.Equal(t, "perm-1", sub.Original)
	require.Equal(t, "max-1", rq.Original)
	require.Equal(t, sub.SequenceNumber, rq.SequenceNumber, "the test needs colliding sequence numbers")
	require.Equal(t, retryDLQ+":1", rq.Ref)
	return h, sub, rq
}

// dlqCounts is the number of dead letters in the subscription's and the retry queue's dead-letter
// queues, read from the emulator.
func (h *harness) dlqCounts(t *testing.T) (sub, rq int) {
	t.Helper()
	return h.Stats(t).DeadLettered, h.QueueStats(t, sbtest.RetryQueue).DeadLettered
}

func TestLayoutListAndShowNameTheEntity(t *testing.T) {
	t.Parallel()
	h, sub, rq := collidingLayout(t)

	code, out, _ := h.cli(t, "", "dlq", "list")
	require.Equal(t, exitOK, code)
	assert.Regexp(t, `(?m)^events/Subscriptions/billing/\$DeadLetterQueue +1 +\S+ +RetryPermanentFailure +1 +perm-1 `, out)
	assert.Regexp(t, `(?m)^billing-retry/\$DeadLetterQueue +1 +\S+ +RetryMaxAttemptsExceeded +2 +max-1 `, out)

	for _, want := range []dlqEntry{sub, rq} {
		code, out, _ := h.cli(t, "", "dlq", "show", want.Ref)
		require.Equal(t, exitOK, code)
		assert.Regexp(t, `(?m)^entity: +`+strings.ReplaceAll(want.Entity, "$", `\$`)+`$`, out)
		assert.Regexp(t, `(?m)^original message id: +`+want.Original+`$`, out)
	}
	// Without its entity, number 1 could be either: refused, naming both.
	code, _, errOut := h.cli(t, "", "dlq", "show", "1")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "sequence number without its entity")
	assert.Contains(t, errOut, subDLQ+":1 or "+retryDLQ+":1")
	// A pending retry's entity does not name a dead letter.
	code, _, errOut = h.cli(t, "", "dlq", "show", sbtest.RetryQueue+":1")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "not read by this inspector")
}

func TestLayoutRedriveActsOnTheSelectedDeadLetter(t *testing.T) {
	t.Parallel()
	h, sub, rq := collidingLayout(t)

	code, _, errOut := h.cli(t, "", "dlq", "redrive", "--seq", "1", "--redrive-to", sbtest.RetryQueue)
	assert.Equal(t, exitUsage, code, "a bare number is ambiguous here")
	assert.Contains(t, errOut, "name one: "+subDLQ+":1 or "+retryDLQ+":1")
	s, r := h.dlqCounts(t)
	assert.Equal(t, [2]int{1, 1}, [2]int{s, r}, "nothing was touched")

	// The dry run and the real run print the same plan and the same resubmitted MessageID.
	args := []string{"dlq", "redrive", "--seq", rq.Ref, "--redrive-to", sbtest.RetryQueue}
	dry := h.actionJSON(t, "", append(args, "--dry-run")...)
	require.Len(t, dry.Items, 1)
	assert.Equal(t, retryDLQ, dry.Items[0].Entity)
	assert.Equal(t, rq.MessageID, dry.Items[0].MessageID)
	code, dryText, _ := h.cli(t, "", append(args, "--dry-run")...)
	require.Equal(t, exitOK, code)
	code, realText, errOut := h.cli(t, "", args...)
	require.Equal(t, exitOK, code, errOut)
	assert.Equal(t, planLines(dryText), planLines(realText), "the real run shows the dry run's plan")
	assert.Contains(t, realText, "resubmitted 1 dead letters to "+sbtest.RetryQueue)

	s, r = h.dlqCounts(t)
	assert.Equal(t, 1, s, "the subscription's dead letter number 1 (perm-1) is untouched")
	assert.Equal(t, 0, r, "the retry queue's dead letter number 1 (max-1) was redriven")
	left := h.listJSON(t)
	require.Len(t, left, 1)
	assert.Equal(t, sub.Ref, left[0].Ref)
	assert.Equal(t, 1, h.activeIn(t, sbtest.RetryQueue)[dry.Items[0].ResubmitMessageID], "sent with the previewed MessageID")

	// Then the subscription's own, selected with its entity.
	rep := h.actionJSON(t, "", "dlq", "redrive", "--seq", sub.Ref, "--redrive-to", sbtest.RetryQueue)
	assert.Empty(t, rep.Error)
	assert.Equal(t, 1, rep.Done)
	require.Len(t, rep.Items, 1)
	assert.True(t, rep.Items[0].Done)
	assert.Equal(t, subDLQ, rep.Items[0].Entity)
	s, r = h.dlqCounts(t)
	assert.Equal(t, [2]int{0, 0}, [2]int{s, r})
	assert.Len(t, h.activeIn(t, sbtest.RetryQueue), 2)
}

func TestLayoutPurgeActsOnTheSelectedDeadLetter(t *testing.T) {
	t.Parallel()
	h, sub, rq := collidingLayout(t)

	dry := h.actionJSON(t, "", "dlq", "purge", "--seq", sub.Ref, "--dry-run")
	require.Len(t, dry.Items, 1)
	assert.Equal(t, subDLQ, dry.Items[0].Entity)
	assert.False(t, dry.Items[0].Done)

	code, out, errOut := h.cli(t, "yes\n", "dlq", "purge", "--seq", sub.Ref)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "deleted 1 dead letters")
	s, r := h.dlqCounts(t)
	assert.Equal(t, 0, s, "perm-1 was deleted")
	assert.Equal(t, 1, r, "max-1, number 1 of the other dead-letter queue, is untouched")
	left := h.listJSON(t)
	require.Len(t, left, 1)
	assert.Equal(t, rq.Ref, left[0].Ref)

	// A re-run finds it gone and says so; the other one stays.
	rep := h.actionJSON(t, "", "dlq", "purge", "--seq", sub.Ref, "--yes")
	assert.Empty(t, rep.Error)
	assert.Equal(t, 0, rep.Selected)
	assert.Equal(t, []jsonRef{{Entity: subDLQ, SequenceNumber: sub.SequenceNumber}}, rep.Missing)
	_, r = h.dlqCounts(t)
	assert.Equal(t, 1, r)
}

// TestLayoutSelectionSpanningBothQueues: --all and --reason select in both dead-letter queues, and each
// dead letter is settled in its own.
func TestLayoutSelectionSpanningBothQueues(t *testing.T) {
	t.Parallel()
	h, sub, rq := collidingLayout(t)

	dry := h.actionJSON(t, "", "dlq", "purge", "--all", "--dry-run")
	require.Len(t, dry.Items, 2)
	refs := []string{}
	for _, it := range dry.Items {
		refs = append(refs, it.Ref)
	}
	assert.Contains(t, refs, sub.Ref)
	assert.Contains(t, refs, rq.Ref)

	rep := h.actionJSON(t, "yes\n", "dlq", "purge", "--all")
	assert.Empty(t, rep.Error)
	assert.Equal(t, 2, rep.Done)
	s, r := h.dlqCounts(t)
	assert.Equal(t, [2]int{0, 0}, [2]int{s, r})
}

// TestLayoutStatusAndPendingLookInTheRetryQueue: pending retries of a subscription are in its retry
// queue, and the listings say so.
func TestLayoutStatusAndPendingLookInTheRetryQueue(t *testing.T) {
	t.Parallel()
	h, _, _ := collidingLayout(t, "pending-1")

	code, out, _ := h.cli(t, "", "status", "pending-1")
	require.Equal(t, exitOK, code)
	assert.Regexp(t, `will be retried at .* \(attempt 2\), .*; sequence number \d+ in billing-retry, message id sbretry-`, out)

	code, out, _ = h.cli(t, "", "pending")
	require.Equal(t, exitOK, code)
	assert.Regexp(t, `(?m)^billing-retry +\d+ +\S+ +2 +pending-1 +downstream unavailable$`, out)

	code, out, _ = h.cli(t, "", "status", "max-1")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "; sequence number 1 in billing-retry/$DeadLetterQueue")

	code, _, _ = h.cli(t, "", "status", "nobody", "--json")
	assert.Equal(t, exitNotFound, code)
}

// planLines are the lines of a redrive's or purge's plan table (indented by two spaces).
func planLines(out string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "  ") {
			lines = append(lines, l)
		}
	}
	return lines
}
