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
		require.True(t, strings.HasPrefix(lines[0], "DUE"), out)
		for _, l := range lines[1:] {
			if !strings.HasPrefix(l, "more:") {
				seen = append(seen, strings.Fields(l)[3]) // the key column
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
	code, out, _ := h.cli(t, "", "cancel", strconv.FormatInt(r.SequenceNumber, 10))
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "cancelled the retry due at")
	assert.Equal(t, 1, h.Stats(t).Scheduled)
	code, _, errOut := h.cli(t, "", "cancel", strconv.FormatInt(r.SequenceNumber, 10))
	assert.Equal(t, exitError, code)
	assert.Contains(t, errOut, "no such message")
}
