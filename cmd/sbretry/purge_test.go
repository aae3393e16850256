package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPurgeAsksForConfirmation(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.seed(t, "perm-1", "perm-2", "max-1")

	code, _, errOut := h.cli(t, "no\n", "dlq", "purge", "--reason", "RetryPermanentFailure")
	assert.Equal(t, exitError, code)
	assert.Contains(t, errOut, "Delete the 2 dead letters listed above for good? Type yes to continue: ")
	assert.Contains(t, errOut, "purge not confirmed")
	assert.Contains(t, errOut, "nothing was done")
	assert.Equal(t, 3, h.Stats(t).DeadLettered)

	code, _, _ = h.cli(t, "", "dlq", "purge", "--all")
	assert.Equal(t, exitError, code, "no answer is no")
	assert.Equal(t, 3, h.Stats(t).DeadLettered)

	// Only the exact word: "y" and "YES" are a no.
	for _, answer := range []string{"y\n", "YES\n", "yes please\n"} {
		code, _, errOut = h.cli(t, answer, "dlq", "purge", "--all")
		assert.Equal(t, exitError, code, answer)
		assert.Contains(t, errOut, `the answer must be "yes"`)
		assert.Equal(t, 3, h.Stats(t).DeadLettered, answer)
	}

	code, out, _ := h.cli(t, "", "dlq", "purge", "--all", "--dry-run")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "would delete 3 dead letters")
	assert.Equal(t, 3, h.Stats(t).DeadLettered)

	code, out, errOut = h.cli(t, "yes\n", "dlq", "purge", "--reason", "RetryPermanentFailure")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "deleted 2 dead letters")
	assert.ElementsMatch(t, []string{"max-1"}, keys(h.listJSON(t)), "the other dead letter was abandoned, not taken")

	code, out, _ = h.cli(t, "", "dlq", "purge", "--all", "--yes")
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "deleted 1 dead letters")
	assert.Equal(t, 0, h.Stats(t).DeadLettered)
	assert.Empty(t, h.activeIDs(t), "a purge sends nothing")
}
