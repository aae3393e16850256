package ledger

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWriterAndTailRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.log")
	tail := NewTail(path)
	n, err := tail.Read()
	require.NoError(t, err, "a missing file is an empty log")
	assert.Zero(t, n)

	w, err := OpenWriter(path)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			assert.NoError(t, w.Success("m-1", 2, int64(i)))
			assert.NoError(t, w.Processed("m-1", 2, int64(i), "completed", true, false))
			assert.NoError(t, w.SettleFailed("m-1", 2, "complete"))
		})
	}
	wg.Wait()
	require.NoError(t, w.Close())

	n, err = tail.Read()
	require.NoError(t, err)
	assert.Equal(t, 150, n)
	l := tail.Log()
	require.Len(t, l.Successes, 50)
	assert.Equal(t, Success{ID: "m-1", Attempt: 2, Seq: l.Successes[0].Seq, PID: os.Getpid(), UnixMS: l.Successes[0].UnixMS, Record: l.Successes[0].Record}, l.Successes[0])
	assert.InDelta(t, time.Now().UnixMilli(), l.Successes[0].UnixMS, 60000)
	require.Len(t, l.Processed, 50)
	assert.True(t, l.Processed[0].Inherited)
	assert.False(t, l.Processed[0].PossibleDuplicate)
	assert.Equal(t, "completed", l.Processed[0].Outcome)
	require.Len(t, l.SettleFailures, 50)
	assert.Equal(t, "complete", l.SettleFailures[0].Operation)
}

func TestTailKeepsAnIncompleteLastLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.log")
	require.NoError(t, os.WriteFile(path, []byte("S a 1 7 100 5\nS b 1 "), 0o644))
	tail := NewTail(path)
	n, err := tail.Read()
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.True(t, tail.Partial(), "a record cut by a kill")

	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.WriteString("8 100 6\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	n, err = tail.Read()
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.False(t, tail.Partial())
	assert.Equal(t, []Success{{ID: "a", Attempt: 1, Seq: 7, PID: 100, UnixMS: 5}, {ID: "b", Attempt: 1, Seq: 8, PID: 100, UnixMS: 6, Record: 1}}, tail.Log().Successes)
}

func TestAddRejectsMalformedRecords(t *testing.T) {
	for _, line := range []string{"", "S a 1", "X a 1 2 3 4", "P a 1 2 completed 0 0 1", "S a 1 7 100"} {
		var l Log
		assert.Error(t, l.Add(line), "%q", line)
	}
}

func TestSessionRecordsAreSuccessesAndEventsInOrder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.log")
	w, err := OpenWriter(path)
	require.NoError(t, err)
	require.NoError(t, w.Processed("s001-00000", 1, 3, "retry-scheduled", false, false))
	require.NoError(t, w.SessionSuccess("s001-00000", "s001", 0, 2, 3))
	require.NoError(t, w.SessionDeadLettered("s001-00001", "s001", 1, 1, "RetryPermanentFailure"))
	require.NoError(t, w.Close())

	tail := NewTail(path)
	n, err := tail.Read()
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	l := tail.Log()
	require.Len(t, l.Session, 2)
	ok, dl := l.Session[0], l.Session[1]
	assert.Equal(t, SessionEvent{ID: "s001-00000", Session: "s001", Index: 0, Attempt: 2, Seq: 3, PID: os.Getpid(), UnixMS: ok.UnixMS, Record: 1}, ok)
	assert.Equal(t, SessionEvent{ID: "s001-00001", Session: "s001", Index: 1, Attempt: 1, DeadLettered: true, Reason: "RetryPermanentFailure",
		Seq: -1, PID: os.Getpid(), UnixMS: dl.UnixMS, Record: 2}, dl)
	assert.Equal(t, []Success{{ID: "s001-00000", Attempt: 2, Seq: 3, PID: os.Getpid(), UnixMS: ok.UnixMS, Record: 1}}, l.Successes,
		"an O record is a success too")
	assert.Equal(t, 0, l.Processed[0].Record)
}
