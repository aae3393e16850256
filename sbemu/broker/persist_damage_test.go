package broker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/syncbuf"
)

// testLogger logs as text into a buffer the test can read.
func testLogger() (*slog.Logger, *syncbuf.Buffer) {
	buf := &syncbuf.Buffer{}
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

// fiveSends is a closed data directory whose journal holds exactly five
// records, one send each (seq 1 to 5, bodies "0" to "4"), with the path
// and contents of that journal and the offset of each record.
type fiveSends struct {
	dir, path string
	data      []byte
	starts    []int
}

func newFiveSends(t *testing.T) fiveSends {
	t.Helper()
	dir := t.TempDir()
	b := openPersistBroker(t, dir, newPersistClock(), Options{})
	orders, _ := b.Queue("orders")
	for i := range 5 {
		mustSend(t, orders, newMsg(fmt.Sprint(i), fmt.Sprint(i)))
	}
	b.Close()
	path := currentJournal(t, dir)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	starts := recordStarts(t, data)
	require.Len(t, starts, 5, "one record per send")
	return fiveSends{dir: dir, path: path, data: data, starts: starts}
}

// journalGen is the generation in a journal file's name.
func journalGen(t *testing.T, path string) uint64 {
	t.Helper()
	g, err := strconv.ParseUint(filepath.Base(path)[len("journal-"):], 10, 64)
	require.NoError(t, err)
	return g
}

// midJournalDamage lists damage that is not a torn tail: each case
// rewrites the journal of a fiveSends directory and says at which offset
// the damage is and how many of the five messages precede it.
var midJournalDamage = []struct {
	name   string
	damage func(t *testing.T, f fiveSends) (offset func(f fiveSends) int)
	kept   int
}{
	{"a middle record fails its checksum", func(t *testing.T, f fiveSends) func(fiveSends) int {
		f.data[f.starts[2]+recordHeaderSize+2] ^= 0xff
		require.NoError(t, os.WriteFile(f.path, f.data, 0o644))
		return func(f fiveSends) int { return f.starts[2] }
	}, 2},
	{"a middle header fails its checksum", func(t *testing.T, f fiveSends) func(fiveSends) int {
		f.data[f.starts[2]+5] ^= 0x10
		require.NoError(t, os.WriteFile(f.path, f.data, 0o644))
		return func(f fiveSends) int { return f.starts[2] }
	}, 2},
	{"a middle length reaching past the end of the file", func(t *testing.T, f fiveSends) func(fiveSends) int {
		// Without a header checksum this would pass for a cut-off last
		// record, and the last three sends would vanish silently.
		binary.LittleEndian.PutUint32(f.data[f.starts[2]:], 1<<20)
		require.NoError(t, os.WriteFile(f.path, f.data, 0o644))
		return func(f fiveSends) int { return f.starts[2] }
	}, 2},
	{"a middle record zeroed", func(t *testing.T, f fiveSends) func(fiveSends) int {
		clear(f.data[f.starts[2]:f.starts[3]])
		require.NoError(t, os.WriteFile(f.path, f.data, 0o644))
		return func(f fiveSends) int { return f.starts[2] }
	}, 2},
	{"a record that passes its checksums but does not decode", func(t *testing.T, f fiveSends) func(fiveSends) int {
		// A valid operation first: it is applied before the bad one fails,
		// and a truncation must undo it.
		r := &recordEncoder{}
		r.lastSeq("orders", 1000)
		r.byte(0xee)
		bad := appendFramed(nil, r.buf)
		data := append(append(append([]byte(nil), f.data[:f.starts[2]]...), bad...), f.data[f.starts[2]:]...)
		require.NoError(t, os.WriteFile(f.path, data, 0o644))
		return func(f fiveSends) int { return f.starts[2] }
	}, 2},
	{"a message that passes its checksums but does not decode", func(t *testing.T, f fiveSends) func(fiveSends) int {
		r := &recordEncoder{}
		r.put("orders", 6, &entry{state: stateAvailable, data: []byte{0x00, 0x53, 0x77, 0xff}})
		bad := appendFramed(nil, r.buf)
		data := append(append(append([]byte(nil), f.data[:f.starts[2]]...), bad...), f.data[f.starts[2]:]...)
		require.NoError(t, os.WriteFile(f.path, data, 0o644))
		return func(f fiveSends) int { return f.starts[2] }
	}, 2},
	{"a torn last record with records in a later journal", func(t *testing.T, f fiveSends) func(fiveSends) int {
		require.NoError(t, os.WriteFile(f.path, f.data[:len(f.data)-3], 0o644))
		later := filepath.Join(f.dir, journalName(journalGen(t, f.path)+1))
		require.NoError(t, os.WriteFile(later, append([]byte(journalMagic), f.data[f.starts[3]:f.starts[4]]...), 0o644))
		return func(f fiveSends) int { return f.starts[4] }
	}, 4},
	{"a journal of another format version", func(t *testing.T, f fiveSends) func(fiveSends) int {
		copy(f.data, "SBEMUJ01")
		require.NoError(t, os.WriteFile(f.path, f.data, 0o644))
		return func(fiveSends) int { return 0 }
	}, 0},
}

// TestPersistMidJournalDamageStopsTheStart: damage that a crash cannot
// leave (a bad record with intact ones after it) stops New with a
// DamageError naming the journal and the offset, and leaves the directory
// as it was, so the records after the damage are not lost without a
// trace and a second start says the same.
func TestPersistMidJournalDamageStopsTheStart(t *testing.T) {
	for _, tc := range midJournalDamage {
		t.Run(tc.name, func(t *testing.T) {
			f := newFiveSends(t)
			offset := tc.damage(t, f)(f)
			before := readDir(t, f.dir)

			for attempt := range 2 {
				_, err := New(Options{DataDir: f.dir, Clock: newPersistClock(), Topics: persistTopics}, persistQueues...)
				require.Error(t, err, "attempt %d", attempt)
				assert.ErrorIs(t, err, ErrDamaged)
				assert.ErrorIs(t, err, ErrPersistence)
				var de *DamageError
				require.ErrorAs(t, err, &de)
				assert.Equal(t, f.path, de.Path)
				assert.Equal(t, int64(offset), de.Offset)
				assert.Positive(t, de.Dropped)
				assert.Contains(t, err.Error(), f.path)
				assert.Contains(t, err.Error(), fmt.Sprintf("at offset %d", offset))
				assert.Equal(t, before, readDir(t, f.dir), "a refused start changes nothing")
			}
		})
	}
}

// TestPersistTruncateDamagedJournal: with TruncateDamagedJournal the same
// directories open with every record before the damage and none after
// it, the truncation is logged with file, offset and bytes, the damaged
// files are kept aside, and the directory then opens without the option.
func TestPersistTruncateDamagedJournal(t *testing.T) {
	for _, tc := range midJournalDamage {
		t.Run(tc.name, func(t *testing.T) {
			f := newFiveSends(t)
			offset := tc.damage(t, f)(f)
			damaged, err := os.ReadFile(f.path)
			require.NoError(t, err)
			_, err = New(Options{DataDir: f.dir, Topics: persistTopics}, persistQueues...)
			var de *DamageError
			require.ErrorAs(t, err, &de, "refused without the option")
			log, logged := testLogger()
			mock := newPersistClock()

			b := openPersistBroker(t, f.dir, mock, Options{TruncateDamagedJournal: true, Logger: log})
			orders, _ := b.Queue("orders")
			require.Equal(t, tc.kept, orders.Stats().Active)
			for i, d := range orders.Peek(1, 10) {
				assert.Equal(t, fmt.Sprint(i), body(d), "the records before the damage, in order")
			}
			assert.Equal(t, int64(tc.kept+1), mustSend(t, orders, newMsg("after", "after")),
				"nothing of the records after the damage is applied, not even half of one")
			out := logged.String()
			assert.Contains(t, out, "level=WARN")
			assert.Contains(t, out, "file="+f.path)
			assert.Contains(t, out, fmt.Sprintf("offset=%d", offset))
			assert.Contains(t, out, fmt.Sprintf("bytes=%d", de.Dropped))
			kept, err := os.ReadFile(f.path + damagedSuffix)
			require.NoError(t, err, "the damaged journal is kept aside")
			assert.Equal(t, damaged, kept)
			b.Close()

			b2 := openPersistBroker(t, f.dir, mock, Options{})
			orders2, _ := b2.Queue("orders")
			assert.Equal(t, tc.kept+1, orders2.Stats().Active)
		})
	}
}

// TestPersistDamagedSnapshotStopsTheStart: every damage in the snapshot is
// a DamageError naming it and the offset, with or without
// TruncateDamagedJournal (there is no earlier state to cut back to).
func TestPersistDamagedSnapshotStopsTheStart(t *testing.T) {
	snapshotHeader := len(snapshotMagic) + 8
	cases := []struct {
		name   string
		damage func(data []byte) []byte
		offset func(data []byte) int
	}{
		{"a record fails its checksum", func(d []byte) []byte {
			d[snapshotHeader+recordHeaderSize+3] ^= 0xff
			return d
		}, func([]byte) int { return snapshotHeader }},
		{"a header fails its checksum", func(d []byte) []byte {
			d[snapshotHeader+1] ^= 0x01
			return d
		}, func([]byte) int { return snapshotHeader }},
		{"cut short", func(d []byte) []byte { return d[:len(d)-3] }, func([]byte) int { return snapshotHeader }},
		{"another format version", func(d []byte) []byte {
			copy(d, "SBEMUS01")
			return d
		}, func([]byte) int { return 0 }},
		{"no end marker", func(d []byte) []byte {
			r := &recordEncoder{}
			_ = r.entities(storedEntities{Queues: persistQueues, Topics: persistTopics}) // encodable
			r.lastSeq("orders", 1)
			return appendFramed(d[:snapshotHeader], r.buf)
		}, func(d []byte) int { return len(d) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFiveSends(t)
			// Open once more, so that the five messages are in the snapshot.
			b := openPersistBroker(t, f.dir, newPersistClock(), Options{})
			b.Close()
			path := filepath.Join(f.dir, snapshotFile)
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			data = tc.damage(data)
			require.NoError(t, os.WriteFile(path, data, 0o644))
			for _, truncate := range []bool{false, true} {
				_, err := New(Options{DataDir: f.dir, TruncateDamagedJournal: truncate, Topics: persistTopics}, persistQueues...)
				require.Error(t, err, "TruncateDamagedJournal %v", truncate)
				assert.ErrorIs(t, err, ErrDamaged)
				var de *DamageError
				require.ErrorAs(t, err, &de)
				assert.Equal(t, path, de.Path)
				assert.Equal(t, int64(tc.offset(data)), de.Offset)
				assert.Contains(t, err.Error(), fmt.Sprintf("%s at offset %d", path, tc.offset(data)))
			}
		})
	}
}

// TestPersistTornTailIsLogged: the tail a crash left is cut off without
// an error, but not without a word.
func TestPersistTornTailIsLogged(t *testing.T) {
	f := newFiveSends(t)
	require.NoError(t, os.WriteFile(f.path, f.data[:len(f.data)-3], 0o644))
	log, logged := testLogger()
	b := openPersistBroker(t, f.dir, newPersistClock(), Options{Logger: log})
	orders, _ := b.Queue("orders")
	assert.Equal(t, 4, orders.Stats().Active)
	out := logged.String()
	assert.Contains(t, out, "level=INFO")
	assert.Contains(t, out, "torn tail")
	assert.Contains(t, out, "file="+f.path)
	assert.Contains(t, out, fmt.Sprintf("offset=%d", f.starts[4]))
}

// TestPersistTornTailBeforeAnEmptyLaterJournal: a start that crashed after
// creating the next journal (header only, or part of it) and before its
// snapshot leaves the torn tail of the previous one in the middle of the
// files, but with no record after it: still a torn tail.
func TestPersistTornTailBeforeAnEmptyLaterJournal(t *testing.T) {
	for _, later := range []string{journalMagic, journalMagic[:3], ""} {
		t.Run(fmt.Sprintf("%d header bytes", len(later)), func(t *testing.T) {
			f := newFiveSends(t)
			require.NoError(t, os.WriteFile(f.path, f.data[:len(f.data)-3], 0o644))
			next := filepath.Join(f.dir, journalName(journalGen(t, f.path)+1))
			require.NoError(t, os.WriteFile(next, []byte(later), 0o644))
			b := openPersistBroker(t, f.dir, newPersistClock(), Options{})
			orders, _ := b.Queue("orders")
			assert.Equal(t, 4, orders.Stats().Active)
		})
	}
}

// TestDamageErrorMatching: the error type is reachable with errors.As
// through the wrapping of New, and a decoding failure keeps its cause.
func TestDamageErrorMatching(t *testing.T) {
	cause := fmt.Errorf("%w: unknown operation 238", ErrDamaged)
	err := fmt.Errorf("broker: data directory d: %w", &DamageError{Path: "d/journal-1", Offset: 42, Dropped: 7, Reason: "bad", Err: cause})
	var de *DamageError
	require.True(t, errors.As(err, &de))
	assert.Equal(t, int64(42), de.Offset)
	assert.ErrorIs(t, err, ErrDamaged)
	assert.ErrorIs(t, err, ErrPersistence)
	assert.ErrorIs(t, err, cause)
	assert.Contains(t, err.Error(), "d/journal-1 at offset 42: bad")
	assert.Contains(t, err.Error(), "7 bytes follow")
}

// readDir returns the contents of every file in dir by name.
func readDir(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	des, err := os.ReadDir(dir)
	require.NoError(t, err)
	out := map[string][]byte{}
	for _, de := range des {
		data, err := os.ReadFile(filepath.Join(dir, de.Name()))
		require.NoError(t, err)
		out[de.Name()] = data
	}
	return out
}

// BenchmarkIntactRecordScan measures the search for an intact record
// after damage, which a start with a damaged journal runs over the rest of
// the file: 16 MiB of random bytes (what message bodies after a damaged
// length look like at worst) and of zeros (a file a crash extended).
//
//	go test -run '^$' -bench BenchmarkIntactRecordScan ./sbemu/broker/
func BenchmarkIntactRecordScan(b *testing.B) {
	random := make([]byte, 16<<20)
	for i := range random {
		random[i] = byte(i*2654435761>>13 ^ i>>7)
	}
	for _, tc := range []struct {
		name string
		data []byte
	}{{"random", random}, {"zeros", make([]byte, 16<<20)}} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.data)))
			for b.Loop() {
				if intactRecordIn(tc.data) {
					b.Fatal("found a record")
				}
			}
		})
	}
}
