package broker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
)

// The journal is the file side of persistence (persist.go decides what goes
// in it): an append-only log of records, written and fsynced by one
// goroutine, and a snapshot that replaces the log from time to time.
//
// Group commit: the broker appends a record under its mutex, which only
// copies bytes into a buffer, and goes on. The journal goroutine takes
// everything buffered, writes it with one write and one fsync, and then
// tells every waiter whose change is now on disk ([Broker.AfterSync]). While
// it waits for the disk, more records pile up, and the next fsync covers all
// of them, so concurrent senders share fsyncs without any timer or batching
// delay: under no load a record is synced at once, under load one fsync
// covers as many changes as arrived during the previous one.
//
// Files in the data directory:
//
//	snapshot              the state after every record of journal-<gen>s older than its gen
//	journal-<gen>         records made after the snapshot of that generation
//	snapshot.tmp          a snapshot being written; ignored and replaced
//	journal-<gen>.damaged a log that TruncateDamagedJournal cut short, kept for inspection; ignored
//	lock                  held (flock) by the broker using the directory
//
// A record is framed as length (uint32, little-endian), CRC-32C of the
// payload (uint32), CRC-32C of those eight header bytes (uint32) and the
// payload. The header's own checksum lets a reader trust a length before
// the payload it announces is there: a record torn by a crash (its length
// reaching past the end of the file) is told apart from a damaged length
// in the middle of the log. Which damage a start may cut off silently (a
// torn tail, never acknowledged, because acknowledgements wait for the
// fsync that follows the write) and which stops it is decided in
// persist_damage.go.
//
// A failed write or fsync stops the journal for good (persist_faults.go
// says why and what the broker does then).
//
// Compaction: when the log has grown by [Options.CompactAfter] bytes (and at
// least by the size of the last snapshot, so rewriting stays proportional
// to the writing), the broker encodes its whole state under its mutex and
// hands it over together with the log position it corresponds to. The
// goroutine syncs the old log up to that position, creates journal-<gen+1>
// for everything after it, writes the snapshot to snapshot.tmp, fsyncs it,
// renames it over snapshot, fsyncs the directory, and only then deletes the
// old log. A crash at any step leaves either the old snapshot with both
// logs, or the new snapshot with the new log (plus a stale old log that the
// next start deletes).

const (
	journalMagic  = "SBEMUJ02" // first bytes of every journal file
	snapshotMagic = "SBEMUS02" // first bytes of the snapshot, followed by its generation
	snapshotFile  = "snapshot"
	snapshotTemp  = "snapshot.tmp"
	lockFile      = "lock"

	// recordHeaderSize is the length and the two checksums in front of
	// each payload.
	recordHeaderSize = 12
	// maxRecordSize refuses absurd lengths read from a damaged file before
	// allocating for them; real records are far smaller (one broker call,
	// or up to snapshotChunk bytes of a snapshot).
	maxRecordSize = 1 << 30

	// DefaultCompactAfter is the journal growth that triggers a snapshot
	// when [Options.CompactAfter] is zero.
	DefaultCompactAfter = 64 << 20
)

// castagnoli is the CRC-32C table; CRC-32C has hardware support on amd64
// and arm64, so checksumming costs little next to the fsync.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// journalName is the file name of generation gen's log; zero-padded so the
// names sort in generation order.
func journalName(gen uint64) string { return fmt.Sprintf("journal-%016d", gen) }

// JournalStats counts the journal's work since the broker opened its data
// directory, for benchmarks and tests: Records/Syncs is the group-commit
// factor. All zero without [Options.DataDir].
type JournalStats struct {
	// Records is the number of records appended (about one per broker call
	// that changed durable state).
	Records int64
	// Bytes is the size of those records, headers included.
	Bytes int64
	// Syncs is the number of fsyncs of the journal file that made records
	// durable.
	Syncs int64
	// Snapshots is the number of snapshots written, including one
	// written when the directory was opened (only a directory whose
	// layout cannot be continued as it is gets one then, see
	// openLocked).
	Snapshots int64
}

// journal owns the open log file and the goroutine that writes it. Lock
// order: the broker's mutex, then j.mu; the goroutine never takes the
// broker's mutex.
type journal struct {
	dir          string
	compactAfter int64
	log          *slog.Logger
	faults       journalFaults // armed by Broker.InjectJournalFault
	failed       chan struct{} // closed when err is set (Broker.JournalFailed)

	mu       sync.Mutex
	pending  []byte // framed records appended and not yet taken by the goroutine
	appended int64  // logical position after the last appended record
	durable  int64  // logical position up to which everything is on disk
	waiters  []syncWaiter
	err      error // sticky: the first write or fsync failure
	snap     *snapshotRequest
	grown    int64 // bytes appended since the last snapshot request
	lastSnap int64 // size of the last snapshot
	closing  bool
	stats    JournalStats

	wake chan struct{} // buffered: something to do
	done chan struct{} // closed when the goroutine returns

	// Owned by the goroutine (and by openJournal before it starts).
	file     journalFile
	gen      uint64
	fileSize int64 // bytes of file known to be on disk: its header and every synced record
	spare    []byte
}

// syncWaiter is a callback for the moment position pos is durable.
type syncWaiter struct {
	pos int64
	fn  func(error)
}

// snapshotRequest is a snapshot of the state at logical position at.
type snapshotRequest struct {
	at   int64
	data []byte // framed records, without the file header
}

// journalState is where a journal starts: the log of generation gen, of
// size bytes (its header included) when it is continued, the size of the
// snapshot it follows, and whether that snapshot was written by this
// start (counted in [JournalStats.Snapshots]).
type journalState struct {
	gen             uint64
	compactAfter    int64
	lastSnap        int64
	size            int64 // 0: a new log, its header only
	snapshotWritten bool
}

// newJournal starts the journal goroutine on f, an open log file as st
// describes it. A continued log counts as grown by its records, so it is
// compacted when it would have been without the restart.
func newJournal(dir string, f *os.File, st journalState, log *slog.Logger) *journal {
	size := max(st.size, int64(len(journalMagic)))
	j := &journal{
		dir:          dir,
		compactAfter: st.compactAfter,
		log:          log,
		failed:       make(chan struct{}),
		lastSnap:     st.lastSnap,
		grown:        size - int64(len(journalMagic)),
		wake:         make(chan struct{}, 1),
		done:         make(chan struct{}),
		gen:          st.gen,
		fileSize:     size,
	}
	j.file = j.faults.wrap(f)
	if st.snapshotWritten {
		j.stats.Snapshots = 1
	}
	go j.run()
	return j
}

// appendRecord frames payload as one record and buffers it for the
// goroutine, and returns the logical position after it: the record is
// durable once that position is. It never blocks on the disk.
func (j *journal) appendRecord(payload []byte) int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closing || j.err != nil {
		return j.appended
	}
	n := len(j.pending)
	j.pending = appendFramed(j.pending, payload)
	size := int64(len(j.pending) - n)
	j.appended += size
	j.grown += size
	j.stats.Records++
	j.stats.Bytes += size
	j.signal()
	return j.appended
}

// appendFramed appends one record (header and payload) to dst.
func appendFramed(dst, payload []byte) []byte {
	var h [recordHeaderSize]byte
	putRecordHeader(h[:], payload)
	dst = append(dst, h[:]...)
	return append(dst, payload...)
}

// putRecordHeader fills the recordHeaderSize bytes of h for payload.
func putRecordHeader(h, payload []byte) {
	binary.LittleEndian.PutUint32(h, uint32(len(payload)))
	binary.LittleEndian.PutUint32(h[4:], crc32.Checksum(payload, castagnoli))
	binary.LittleEndian.PutUint32(h[8:], crc32.Checksum(h[:8], castagnoli))
}

// signal wakes the goroutine; j.mu must be held.
func (j *journal) signal() {
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

// wantSnapshot reports whether the log has grown enough to be compacted
// and no snapshot is waiting to be written.
func (j *journal) wantSnapshot() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.snap == nil && !j.closing && j.err == nil && j.grown >= max(j.compactAfter, j.lastSnap)
}

// requestSnapshot hands over a snapshot of the state after every record
// appended so far; the caller holds the broker's mutex, so no record can
// slip in between.
func (j *journal) requestSnapshot(data []byte) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closing || j.err != nil {
		return
	}
	j.snap = &snapshotRequest{at: j.appended, data: data}
	j.grown = 0
	j.lastSnap = int64(len(data))
	j.signal()
}

// afterSync calls fn once everything appended so far is durable, with nil,
// or with the journal's error if it failed. fn runs at once on the
// caller's goroutine when there is nothing to wait for, else on the
// journal goroutine, so it must not block.
func (j *journal) afterSync(fn func(error)) {
	j.afterPosition(-1, fn)
}

// afterPosition is afterSync for the records up to logical position pos
// only; a negative pos means everything appended so far.
func (j *journal) afterPosition(pos int64, fn func(error)) {
	j.mu.Lock()
	if pos < 0 {
		pos = j.appended
	}
	if j.err != nil || j.durable >= pos {
		err := j.err
		j.mu.Unlock()
		fn(err)
		return
	}
	// Waiters stay sorted by position, so the goroutine releases a prefix.
	i := len(j.waiters)
	for i > 0 && j.waiters[i-1].pos > pos {
		i--
	}
	j.waiters = slices.Insert(j.waiters, i, syncWaiter{pos: pos, fn: fn})
	j.mu.Unlock()
}

// fail stops the journal with err: nothing more is written and every
// waiter, present and future, gets err.
func (j *journal) fail(err error) {
	j.mu.Lock()
	j.setErr(err)
	j.signal()
	j.mu.Unlock()
}

// setErr records the journal's first failure, logs it and closes
// j.failed; later failures are consequences of the first and are
// dropped. j.mu must be held.
func (j *journal) setErr(err error) {
	if err == nil || j.err != nil {
		return
	}
	j.err = err
	close(j.failed)
	j.log.Error("broker: the journal stopped; every acknowledgement fails until the broker is reopened on its directory",
		"dir", j.dir, "err", err)
}

// failure returns the error that stopped the journal, or nil.
func (j *journal) failure() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.err
}

// statsNow returns a copy of the counters.
func (j *journal) statsNow() JournalStats {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.stats
}

// close writes and syncs what is buffered, stops the goroutine and closes
// the file. It returns the journal's error, if any. Idempotent.
func (j *journal) close() error {
	j.mu.Lock()
	j.closing = true
	j.signal()
	j.mu.Unlock()
	<-j.done
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.file != nil {
		if err := j.file.Close(); err != nil {
			j.setErr(persistErr("closing journal", err))
		}
		j.file = nil
	}
	return j.err
}

// run is the journal goroutine: one write and one fsync for everything
// buffered, then the callbacks of every waiter that became durable.
func (j *journal) run() {
	defer close(j.done)
	for {
		j.mu.Lock()
		for len(j.pending) == 0 && j.snap == nil && !j.closing {
			j.mu.Unlock()
			<-j.wake
			j.mu.Lock()
		}
		if len(j.pending) == 0 && j.snap == nil && j.closing {
			j.mu.Unlock()
			return
		}
		data, end, snap, failed := j.pending, j.appended, j.snap, j.err != nil
		j.pending, j.snap = j.spare[:0], nil
		j.mu.Unlock()

		var err error
		syncs := int64(0)
		if !failed {
			syncs, err = j.writeOut(data, end, snap)
		}
		// Reuse the buffer unless one burst made it large.
		if cap(data) <= 4<<20 {
			j.spare = data[:0]
		} else {
			j.spare = nil
		}

		j.mu.Lock()
		j.setErr(err)
		if j.err == nil {
			j.durable = end
		}
		j.stats.Syncs += syncs
		if snap != nil && err == nil {
			j.stats.Snapshots++
		}
		n := 0
		for n < len(j.waiters) && (j.err != nil || j.waiters[n].pos <= j.durable) {
			n++
		}
		ready := make([]syncWaiter, n)
		copy(ready, j.waiters)
		j.waiters = append(j.waiters[:0], j.waiters[n:]...)
		ferr := j.err
		j.mu.Unlock()
		for _, w := range ready {
			w.fn(ferr)
		}
	}
}

// writeOut writes data, which ends at logical position end, to the log
// and fsyncs it; with a snapshot request it rotates the log at the
// request's position first. It returns the number of fsyncs of the log.
func (j *journal) writeOut(data []byte, end int64, snap *snapshotRequest) (int64, error) {
	var syncs int64
	if snap != nil {
		cut := len(data) - int(end-snap.at)
		if cut > 0 {
			if err := j.writeSync(data[:cut]); err != nil {
				return syncs, err
			}
			syncs++
		}
		data = data[cut:]
		if err := j.rotate(snap.data); err != nil {
			return syncs, err
		}
	}
	if len(data) == 0 {
		return syncs, nil
	}
	if err := j.writeSync(data); err != nil {
		return syncs, err
	}
	return syncs + 1, nil
}

// writeSync appends data to the log file and fsyncs it. On failure it
// cuts the file back to what was synced before (see cutBack).
func (j *journal) writeSync(data []byte) error {
	if _, err := j.file.Write(data); err != nil {
		j.cutBack()
		return persistErr("writing journal "+j.path(), err)
	}
	if err := j.file.Sync(); err != nil {
		j.cutBack()
		return persistErr("syncing journal "+j.path(), err)
	}
	j.fileSize += int64(len(data))
	return nil
}

// cutBack truncates the log to its synced size after a failed write or
// fsync, so the records of the failed batch, whose waiters all get the
// error, do not come back at the next start as if they had been
// acknowledged. Best effort: if the file cannot be cut either, those
// records may survive, as any change that was applied but not yet
// acknowledged may survive a crash.
func (j *journal) cutBack() {
	if err := j.file.Truncate(j.fileSize); err == nil {
		_ = j.file.Sync()
	}
}

// path is the file name of the current log.
func (j *journal) path() string { return filepath.Join(j.dir, journalName(j.gen)) }

// rotate starts the next generation's log and writes snapshot (the state
// at the end of the current log) as that generation's snapshot, then
// deletes the old log.
func (j *journal) rotate(snapshot []byte) error {
	gen := j.gen + 1
	f, err := createJournalFile(j.dir, gen)
	if err != nil {
		return err
	}
	old, oldGen := j.file, j.gen
	j.file, j.gen, j.fileSize = j.faults.wrap(f), gen, int64(len(journalMagic))
	_ = old.Close() // synced above; nothing is lost if closing fails
	if err := writeSnapshot(j.dir, gen, snapshot); err != nil {
		return err
	}
	// The new snapshot covers the old log: it may go. A failure only
	// leaves a file the next start deletes.
	_ = os.Remove(filepath.Join(j.dir, journalName(oldGen)))
	return nil
}

// createJournalFile creates generation gen's empty log (its header only),
// durable together with its directory entry.
func createJournalFile(dir string, gen uint64) (*os.File, error) {
	path := filepath.Join(dir, journalName(gen))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, persistErr("creating journal "+path, err)
	}
	if _, err := f.Write([]byte(journalMagic)); err != nil {
		_ = f.Close()
		return nil, persistErr("writing journal header of "+path, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return nil, persistErr("syncing journal "+path, err)
	}
	if err := syncDir(dir); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// writeSnapshot replaces the snapshot atomically: temporary file, fsync,
// rename, fsync of the directory.
func writeSnapshot(dir string, gen uint64, records []byte) error {
	tmp := filepath.Join(dir, snapshotTemp)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return persistErr("creating snapshot "+tmp, err)
	}
	header := binary.LittleEndian.AppendUint64([]byte(snapshotMagic), gen)
	_, err = f.Write(header)
	if err == nil {
		_, err = f.Write(records)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return persistErr("writing snapshot "+tmp, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, snapshotFile)); err != nil {
		return persistErr("installing snapshot "+tmp, err)
	}
	return syncDir(dir)
}

// syncDir fsyncs a directory, making created, renamed and removed entries
// durable.
func syncDir(dir string) error {
	// Windows cannot open a directory for syncing; NTFS journals the
	// rename itself.
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return persistErr("opening data directory", err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	// Some file systems cannot sync a directory; the rename is then as
	// durable as they make it.
	if err != nil && !errors.Is(err, os.ErrInvalid) {
		return persistErr("syncing data directory", err)
	}
	return nil
}
