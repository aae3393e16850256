package main

import (
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/retryindex"
)

// pendingLineRE finds "will be retried at T (attempt N), …; sequence number S in orders" in status's
// answer, from the broker or from the index alike.
var pendingLineRE = regexp.MustCompile(`will be retried at (\S+) \(attempt (\d+)\), .*?sequence number (\d+) in orders`)

// TestIndexAgreesWithTheBroker is the whole path as a user takes it: a real consumer on the emulator
// keeps an index file through retryindex.Recorder.Hooks while its handler fails some messages; then
// status with --index answers as status without it (a peek of the broker) does: the same due time,
// attempt and sequence number for the pending retry, the same reason for the dead letter.
func TestIndexAgreesWithTheBroker(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	path := filepath.Join(t.TempDir(), "index.db")
	store, err := retryindex.OpenSQLite(path, nil)
	require.NoError(t, err)
	defer func() { _ = store.Close() }()
	rec, err := retryindex.NewRecorder(store, &retryindex.RecorderOptions{Process: "billing-1"})
	require.NoError(t, err)

	runFailingConsumer(t, h, rec.Hooks(retry.Hooks{}), "order-1", "poison-1", "fine-1")
	require.NoError(t, rec.Close(sbtest.Context(t)))

	// "will be retried at T (attempt 2), in …; sequence number S in orders": the same from both.
	code, fromBroker, errOut := h.cli(t, "", "status", "order-1")
	require.Equal(t, exitOK, code, errOut)
	code, fromIndex, errOut := cliNoEntity(t, "", "status", "--index", path, "order-1")
	require.Equal(t, exitOK, code, errOut)
	b, i := pendingLineRE.FindStringSubmatch(fromBroker), pendingLineRE.FindStringSubmatch(fromIndex)
	require.NotNil(t, b, fromBroker)
	require.NotNil(t, i, fromIndex)
	assert.Equal(t, b[1:], i[1:], "due time, attempt and sequence number")
	assert.Contains(t, fromIndex, "from index "+path+", as of ")
	assert.Contains(t, fromIndex, "feeds: consumer billing-1 last wrote ")

	reason := regexp.MustCompile(`dead-lettered at \S+: (\w+) \(attempt (\d+)\)`)
	code, fromBroker, _ = h.cli(t, "", "status", "poison-1")
	require.Equal(t, exitOK, code)
	code, fromIndex, _ = cliNoEntity(t, "", "status", "--index", path, "poison-1")
	require.Equal(t, exitOK, code)
	b, i = reason.FindStringSubmatch(fromBroker), reason.FindStringSubmatch(fromIndex)
	require.NotNil(t, b, fromBroker)
	require.NotNil(t, i, fromIndex)
	assert.Equal(t, b[1:], i[1:], "reason and attempt")

	// A first attempt's success is no retry state: the index says what it searched.
	code, fromIndex, _ = cliNoEntity(t, "", "status", "--index", path, "fine-1")
	assert.Equal(t, exitNotFound, code)
	assert.Contains(t, fromIndex, "no trace in the index")
	assert.Contains(t, fromIndex, "a message that succeeded at its first attempt is not recorded")
}
