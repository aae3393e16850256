package broker

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPersistResumeContinuesTheLog: a start on a directory holding a
// snapshot and its log writes no snapshot and starts no new generation;
// it appends to that log, and the next start reads both.
func TestPersistResumeContinuesTheLog(t *testing.T) {
	dir := t.TempDir()
	mock := newPersistClock()
	b := openPersistBroker(t, dir, mock, Options{})
	orders, _ := b.Queue("orders")
	for i := range 3 {
		mustSend(t, orders, newMsg(fmt.Sprint(i), fmt.Sprint(i)))
	}
	b.Close()
	log := currentJournal(t, dir)

	b2 := openPersistBroker(t, dir, mock, Options{})
	assert.Zero(t, b2.JournalStats().Snapshots, "no snapshot before serving")
	assert.Equal(t, log, currentJournal(t, dir), "the same log goes on")
	orders2, _ := b2.Queue("orders")
	d := mustReceive(t, orders2, PeekLock)
	require.NoError(t, orders2.Complete(d.LockToken))
	mustSend(t, orders2, newMsg("3", "3"))
	want := dumpState(t, b2)
	b2.Close()

	b3 := openPersistBroker(t, dir, mock, Options{})
	assert.Equal(t, want, dumpState(t, b3))
	_, err := os.Stat(filepath.Join(dir, snapshotFile))
	assert.NoError(t, err)
}

// TestPersistResumeJournalsReturnedLocks: the locks a start ends (a
// message locked at the stop comes back, or is dead-lettered once it used
// up MaxDeliveryCount) are changes of that run, journaled in the log it
// continues, so the start after it finds the same state: the same
// dead-letter sequence numbers, the same delivery counts.
func TestPersistResumeJournalsReturnedLocks(t *testing.T) {
	dir := t.TempDir()
	mock := newPersistClock()
	b := openPersistBroker(t, dir, mock, Options{})
	orders, _ := b.Queue("orders")
	mustSend(t, orders, newMsg("a", "a"))
	mustSend(t, orders, newMsg("b", "b"))
	b.Close()
	// orders has MaxDeliveryCount 3: three restarts with "a" locked
	// dead-letter it at the third.
	for range 3 {
		b = openPersistBroker(t, dir, mock, Options{})
		q, _ := b.Queue("orders")
		d := mustReceive(t, q, PeekLock)
		require.Equal(t, "a", body(d))
		b.Close()
	}
	b = openPersistBroker(t, dir, mock, Options{})
	q, _ := b.Queue("orders")
	dlq, _ := b.Queue("orders" + DeadLetterSuffix)
	require.Equal(t, 1, dlq.Stats().Active, "dead-lettered by the start")
	d := mustReceive(t, q, PeekLock)
	require.Equal(t, "b", body(d))
	require.NoError(t, q.DeadLetter(d.LockToken, "test", "", nil))
	want := dumpState(t, b)
	b.Close()

	b = openPersistBroker(t, dir, mock, Options{})
	assert.Equal(t, want, dumpState(t, b), "the start's own changes were durable")
}
