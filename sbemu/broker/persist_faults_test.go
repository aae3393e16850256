package broker

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// syncErr is Sync bounded in time, for a journal that should answer at
// once.
func syncErr(t *testing.T, b *Broker) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := b.Sync(ctx)
	require.NotErrorIs(t, err, context.DeadlineExceeded, "Sync hung")
	return err
}

// afterSyncErr waits for the callback of AfterSync.
func afterSyncErr(t *testing.T, b *Broker) error {
	t.Helper()
	got := make(chan error, 1)
	b.AfterSync(func(err error) { got <- err })
	select {
	case err := <-got:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("AfterSync never called back")
		return nil
	}
}

var faultCases = []struct {
	name  string
	fault JournalFault
}{
	{"write fails after half of it", JournalWriteFault},
	{"fsync fails", JournalSyncFault},
}

// TestJournalFaultFailsTheSendForGood: after a failed write or fsync the
// change that needed it is never acknowledged, nor is any later one, even
// though the file works again (a retried fsync may succeed without the
// data Linux dropped): the journal stops, loudly. The log is cut back to
// what was acknowledged, so a reopened broker has the acknowledged send
// and neither failed one.
func TestJournalFaultFailsTheSendForGood(t *testing.T) {
	for _, tc := range faultCases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			mock := newPersistClock()
			log, logged := testLogger()
			b := openPersistBroker(t, dir, mock, Options{Logger: log})
			orders, _ := b.Queue("orders")
			mustSend(t, orders, newMsg("kept", "kept"))
			require.NoError(t, syncErr(t, b))
			path := currentJournal(t, dir)
			acknowledged, err := os.ReadFile(path)
			require.NoError(t, err)

			require.NoError(t, b.InjectJournalFault(tc.fault))
			mustSend(t, orders, newMsg("lost", "lost"))
			err = syncErr(t, b)
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrPersistence)
			assert.ErrorIs(t, err, ErrInjectedFault)
			assert.Contains(t, err.Error(), path, "the error names the journal file")
			assert.Error(t, afterSyncErr(t, b))
			select {
			case <-b.JournalFailed():
			default:
				t.Fatal("JournalFailed is not closed")
			}
			assert.Contains(t, logged.String(), "level=ERROR")

			// The fault fired once; the file would work again, the journal
			// does not.
			mustSend(t, orders, newMsg("later", "later"))
			assert.Error(t, syncErr(t, b), "a change after the failure is not acknowledged either")
			assert.Error(t, afterSyncErr(t, b))
			now, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.Equal(t, acknowledged, now, "the log is cut back to the acknowledged records")
			b.Close()
			assert.Error(t, syncErr(t, b), "Close reports the failure")

			b2 := openPersistBroker(t, dir, mock, Options{})
			orders2, _ := b2.Queue("orders")
			var bodies []string
			for _, d := range orders2.Peek(1, 10) {
				bodies = append(bodies, body(d))
			}
			assert.Equal(t, []string{"kept"}, bodies)
		})
	}
}

// TestJournalFaultFailsTheSettlement: a complete whose record cannot be
// written is never acknowledged and, after a reopen, has not happened.
func TestJournalFaultFailsTheSettlement(t *testing.T) {
	for _, tc := range faultCases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			mock := newPersistClock()
			b := openPersistBroker(t, dir, mock, Options{})
			orders, _ := b.Queue("orders")
			mustSend(t, orders, newMsg("m", "m"))
			d := mustReceive(t, orders, PeekLock)
			require.NoError(t, syncErr(t, b))

			require.NoError(t, b.InjectJournalFault(tc.fault))
			require.NoError(t, orders.Complete(d.LockToken), "applied in memory")
			require.Error(t, afterSyncErr(t, b), "but never acknowledged")
			b.Close()

			b2 := openPersistBroker(t, dir, mock, Options{})
			orders2, _ := b2.Queue("orders")
			assert.Equal(t, 1, orders2.Stats().Active, "the message is back, its delivery counted")
		})
	}
}

// TestJournalFaultStopsDeliveries: once the journal stopped, no message is
// handed out for transfer, not even one restored at open that needs no
// wait for the disk.
func TestJournalFaultStopsDeliveries(t *testing.T) {
	dir := t.TempDir()
	mock := newPersistClock()
	b := openPersistBroker(t, dir, mock, Options{})
	orders, _ := b.Queue("orders")
	mustSend(t, orders, newMsg("old", "old"))
	b.Close()

	b2 := openPersistBroker(t, dir, mock, Options{})
	orders2, _ := b2.Queue("orders")
	require.NoError(t, b2.InjectJournalFault(JournalSyncFault))
	mustSend(t, orders2, newMsg("new", "new"))
	require.Error(t, syncErr(t, b2))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 2 {
		d := mustReceive(t, orders2, PeekLock)
		err := b2.WaitStored(ctx, d)
		require.Error(t, err, "message %q", body(d))
		assert.ErrorIs(t, err, ErrInjectedFault)
	}
}

// TestInjectJournalFaultNeedsADataDirectory: the seam exists only where
// there is a journal; an unknown fault is refused too.
func TestInjectJournalFaultNeedsADataDirectory(t *testing.T) {
	b, err := New(Options{}, QueueConfig{Name: "q"})
	require.NoError(t, err)
	defer b.Close()
	assert.ErrorIs(t, b.InjectJournalFault(JournalSyncFault), ErrInvalidConfig)
	assert.Nil(t, b.JournalFailed())

	p, err := New(Options{DataDir: t.TempDir()}, QueueConfig{Name: "q"})
	require.NoError(t, err)
	defer p.Close()
	assert.ErrorIs(t, p.InjectJournalFault(JournalFault(99)), ErrInvalidConfig)
	require.NoError(t, syncErr(t, p))
}
