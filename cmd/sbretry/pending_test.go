package main

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/internal/sbtest"
)

func TestPendingCommandPaged(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.seed(t, "pending-1", "pending-2", "pending-3", "pending-4", "pending-5")
	var seen []string
	args := []string{"pending", "--limit", "2"}
	cursor := regexp.MustCompile(`--cursor (\S+)`)
	for range 5 {
		code, out, errOut := h.cli(t, "", args...)
		require.Equal(t, exitOK, code, errOut)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Regexp(t, `^ENTITY\s+SEQ\s+DUE\s+ATTEMPT\s+ORIGINAL ID\s+LAST ERROR$`, lines[0])
		for _, l := range lines[1:] {
			if !strings.HasPrefix(l, "more:") {
				f := strings.Fields(l)
				assert.Equal(t, sbtest.Queue, f[0], "the entity column")
				seen = append(seen, f[4]) // the original id
			}
		}
		m := cursor.FindStringSubmatch(out)
		if m == nil {
			break
		}
		args = []string{"pending", "--limit", "2", "--cursor", m[1]}
	}
	assert.ElementsMatch(t, []string{"pending-1", "pending-2", "pending-3", "pending-4", "pending-5"}, seen)

	code, out, _ := h.cli(t, "", "pending", "--json")
	require.Equal(t, exitOK, code)
	var page struct {
		Pending []jsonPending `json:"pending"`
		Next    string        `json:"next"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &page))
	assert.Len(t, page.Pending, 5)
	assert.Empty(t, page.Next)
	for i := 1; i < len(page.Pending); i++ {
		assert.False(t, page.Pending[i].DueTime.Before(page.Pending[i-1].DueTime), "by due time")
	}
}

func TestCancelCommand(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ps := h.seed(t, "pending-1", "pending-2")
	r, ok := sbtest.Result(ps, "pending-1", retry.OutcomeRetryScheduled)
	require.True(t, ok)
	seq := strconv.FormatInt(r.SequenceNumber, 10)

	code, out, _ := h.cli(t, "", "cancel", seq, "--dry-run")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "would cancel 1 pending retries:")
	assert.Regexp(t, `orders +`+seq+` +\S+ +2 +pending-1 +`+r.RetryMessageID, out)
	assert.Equal(t, 2, h.Stats(t).Scheduled, "a dry run cancels nothing")

	for _, answer := range []string{"", "y\n", "Yes\n"} {
		code, _, errOut := h.cli(t, answer, "cancel", seq)
		assert.Equal(t, exitError, code)
		assert.Contains(t, errOut, "Cancel the 1 pending retries listed above? They will never run. Type yes to continue: ")
		assert.Contains(t, errOut, "cancel not confirmed")
		assert.Equal(t, 2, h.Stats(t).Scheduled, "%q is not yes", answer)
	}

	code, out, _ = h.cli(t, "yes\n", "cancel", seq)
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "cancelling 1 pending retries:")
	assert.Contains(t, out, "cancelled 1 pending retries")
	assert.Equal(t, 1, h.Stats(t).Scheduled)
	code, _, errOut := h.cli(t, "", "cancel", seq, "--yes")
	assert.Equal(t, exitNotFound, code)
	assert.Contains(t, errOut, "no such message")

	code, _, errOut = h.cli(t, "", "cancel", "orders:999", "--yes")
	assert.Equal(t, exitNotFound, code)
	assert.Contains(t, errOut, "orders:999")

	// --json, dry run and real run alike.
	other, ok := sbtest.Result(ps, "pending-2", retry.OutcomeRetryScheduled)
	require.True(t, ok)
	ref := "orders:" + strconv.FormatInt(other.SequenceNumber, 10)
	dry := h.actionJSON(t, "", "cancel", ref, "--dry-run")
	assert.Equal(t, "cancel", dry.Action)
	assert.True(t, dry.DryRun)
	assert.Equal(t, 1, dry.Selected)
	assert.Equal(t, 0, dry.Done)
	rep := h.actionJSON(t, "", "cancel", ref, "--yes")
	assert.Equal(t, 1, rep.Done)
	assert.Empty(t, rep.Error)
	assert.Equal(t, 0, h.Stats(t).Scheduled)
}
