package main

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/internal/sbtest"
)

func TestStatusCommand(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ps := h.seed(t, "pending-1", "perm-1", "max-1")
	retried, ok := sbtest.Result(ps, "pending-1", retry.OutcomeRetryScheduled)
	require.True(t, ok)

	code, out, errOut := h.cli(t, "", "status", "pending-1")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "will be retried at "+formatTime(retried.ScheduledFor)+" (attempt 2), in ")
	assert.Regexp(t, `\(attempt 2\), in (59m5\ds|1h0m0s); sequence number `+strconv.FormatInt(retried.SequenceNumber, 10)+` in orders,`, out)
	assert.Contains(t, out, "last error: "+errBoom.Error())
	assert.Empty(t, errOut)

	code, out, _ = h.cli(t, "", "status", "max-1")
	require.Equal(t, exitOK, code)
	assert.Regexp(t, `dead-lettered at [0-9T:.\-]+Z: RetryMaxAttemptsExceeded \(attempt 2\): timeout calling the ledger; sequence number \d+ in orders/\$DeadLetterQueue`, out)

	// Flags may follow the command, and --json parses.
	code, out, _ = cliNoEntity(t, "", "status", "perm-1", "--json", "--queue", sbtest.Queue, "--connection-string", h.Em.ConnectionString())
	require.Equal(t, exitOK, code)
	var st struct {
		ID          string        `json:"id"`
		Pending     []jsonPending `json:"pending"`
		DeadLetters []struct {
			Reason  string `json:"reason"`
			Attempt int    `json:"attempt"`
		} `json:"deadLetters"`
		Scans []jsonScan `json:"scans"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	assert.Equal(t, "perm-1", st.ID)
	assert.Empty(t, st.Pending)
	require.Len(t, st.DeadLetters, 1)
	assert.Equal(t, "RetryPermanentFailure", st.DeadLetters[0].Reason)
	assert.Equal(t, 1, st.DeadLetters[0].Attempt)
	require.Len(t, st.Scans, 2)

	code, out, _ = h.cli(t, "", "status", "nobody")
	require.Equal(t, exitNotFound, code, "found nothing")
	assert.Contains(t, out, "nothing pending, active or dead-lettered (read 1 messages of orders, 2 messages of orders/$DeadLetterQueue)")
}

func TestStatusWarnsWhenTruncated(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.seed(t, "pending-1", "pending-2", "pending-3")
	code, _, errOut := h.cli(t, "", "status", "pending-3", "--max-peek", "2")
	assert.Contains(t, []int{exitOK, exitPartial}, code, "found or not among the messages read")
	assert.Contains(t, errOut, "warning: read only the first 2 messages of orders (--max-peek)")
}

// TestStatusSaysPartialInsteadOfNotFound: a key not found in a read stopped by --max-peek is not
// "not found" (exit 3) but "not found in a partial read" (exit 4), in words and in JSON; a found key
// in a partial read says the answer may miss more.
func TestStatusSaysPartialInsteadOfNotFound(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.seed(t, "pending-1", "pending-2", "pending-3")
	code, out, _ := h.cli(t, "", "status", "nobody", "--max-peek", "2")
	assert.Equal(t, exitPartial, code)
	assert.Contains(t, out, "not found in what was read, which is partial: read only 2 messages of orders")
	assert.NotContains(t, out, "nothing pending, active or dead-lettered")
	code, out, _ = h.cli(t, "", "status", "nobody", "--max-peek", "2", "--json")
	assert.Equal(t, exitPartial, code)
	var st struct {
		Partial bool `json:"partial"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	assert.True(t, st.Partial)

	code, out, _ = h.cli(t, "", "status", "corr-pending-1", "--max-peek", "1")
	if code == exitOK { // pending-1's copy is the first message read
		assert.Contains(t, out, "partial answer: read only 1 messages of orders")
	}
	code, _, _ = h.cli(t, "", "status", "nobody")
	assert.Equal(t, exitNotFound, code, "a complete read that finds nothing is not found")
}
