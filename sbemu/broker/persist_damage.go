package broker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
)

// Reading a data directory back, and the rule that decides which damage a
// start may cut off silently.
//
// The journal is written by appending one batch of records at a time and
// fsyncing it; a change is acknowledged only after the fsync of its batch
// returned, and the next batch is written only after that. A crash (a
// SIGKILL, a power loss) in the middle of a write can therefore leave only
// the end of the log unfinished: the last record cut short, or its bytes
// only partly on disk, and possibly the file extended with zeros the data
// never reached. Those records were never acknowledged. So:
//
// A torn tail is damage at the end of the journal: the first record that
// cannot be read (the file ends inside its header or inside the payload
// its intact header announces, or its header or its payload fails its
// checksum) with no intact record after it: none starting at any byte
// offset further on in its file, none in a later journal file. A start
// cuts a torn tail off, logs it (Info) and goes on. The header's own
// checksum is what makes looking for an intact record cheap (eight bytes
// per offset) and what keeps a damaged length from passing for a cut-off
// record.
//
// Mid-journal damage is anything else: a bad record with an intact one
// after it; a record whose checksums pass but which does not decode, or
// holds a message that does not (written whole by a broker, so a bug or a
// file from another version, never a crash); a journal file whose header is not this version's. The
// records after such damage were written after the damaged one was
// synced, so they may have been acknowledged, and dropping them would
// lose what clients were told had happened. A start refuses such a
// directory with a [*DamageError] naming the file and the offset, unless
// [Options.TruncateDamagedJournal] asks for the journal to be cut at the
// last good record; then it logs what it dropped (Warn: file, offset,
// bytes) and keeps the damaged files as <name>.damaged next to the new
// snapshot.
//
// A power loss during the write of a batch that spans several disk pages
// can, on some file systems, leave a damaged page with intact ones after
// it. That looks like mid-journal damage and stops the start too: the
// journal cannot tell it from a bad disk. It is safe to truncate then,
// since the whole batch was unacknowledged, but only the operator can know
// it was a power loss.
//
// A snapshot is written to a temporary file, fsynced and only then renamed
// into place, so no crash damages it: every damage there is an error, and
// TruncateDamagedJournal does not apply (the logs it replaced are gone, so
// there is no good record to cut back to).

// ErrDamaged wraps every report of a data directory whose files do not
// read back as they were written; [*DamageError] says where. It wraps
// [ErrPersistence].
var ErrDamaged = fmt.Errorf("%w: damaged data directory", ErrPersistence)

// DamageError reports damage in a file of [Options.DataDir] that a crash
// cannot explain (see persist_damage.go): mid-journal damage, or any
// damage in the snapshot. [New] returns it, wrapped, and does not start,
// because starting would silently drop records that may have been
// acknowledged. Match it with [errors.As]; it also matches [ErrDamaged]
// and [ErrPersistence] with [errors.Is].
type DamageError struct {
	// Path is the damaged file.
	Path string
	// Offset is the byte offset in Path of the first record that cannot
	// be read; the records before it are intact.
	Offset int64
	// Dropped is how many bytes from Offset on would be lost by
	// truncating there: the rest of Path and the records of every later
	// journal file (their 8-byte file headers not counted).
	Dropped int64
	// Reason says what is wrong at Offset.
	Reason string
	// Err is the decoding error of a record whose checksums pass, nil for
	// other damage.
	Err error
}

// Error names the file, the offset and the way out.
func (e *DamageError) Error() string {
	msg := fmt.Sprintf("broker: damaged %s at offset %d: %s", e.Path, e.Offset, e.Reason)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	if filepath.Base(e.Path) == snapshotFile {
		return msg + "; the snapshot cannot be repaired: restore the directory from a backup or delete it"
	}
	return fmt.Sprintf("%s; this is not a torn tail (%d bytes follow), so acknowledged records may be behind it:"+
		" restore the directory, or start with TruncateDamagedJournal (sbemu -truncate-damaged-journal) to drop them",
		msg, e.Dropped)
}

// Unwrap returns [ErrDamaged] and, for a record that does not decode, the
// decoding error.
func (e *DamageError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrDamaged, e.Err}
	}
	return []error{ErrDamaged}
}

// journalDamage is where replaying the logs stopped before their end.
type journalDamage struct {
	DamageError
	gen     uint64   // generation of Path
	later   []uint64 // generations after gen, whose bytes count in Dropped
	torn    bool     // a torn tail: cut off silently
	applied bool     // the record passed its checksums and was perhaps half applied
}

// blank reports whether data is all zero bytes (or empty): what a file
// extended by a crash before its data reached the disk holds.
func blank(data []byte) bool {
	for _, c := range data {
		if c != 0 {
			return false
		}
	}
	return true
}

// zeroHeaderSum is the header checksum of an empty record: the only
// header whose first eight bytes are zero.
var zeroHeaderSum = crc32.Checksum(make([]byte, 8), castagnoli)

// intactRecordIn reports whether an intact record (header and payload
// passing their checksums) starts at any byte offset of data.
func intactRecordIn(data []byte) bool {
	for p := 0; p+recordHeaderSize <= len(data); p++ {
		// The length first: most offsets of arbitrary bytes announce more
		// than is left, and are rejected without a checksum.
		if n := binary.LittleEndian.Uint32(data[p:]); uint64(n) > uint64(len(data)-p-recordHeaderSize) {
			continue
		}
		// Zeros (a file a crash extended) without a checksum each: a zero
		// length and payload sum need zeroHeaderSum to be a record.
		if binary.LittleEndian.Uint64(data[p:]) == 0 && binary.LittleEndian.Uint32(data[p+8:]) != zeroHeaderSum {
			continue
		}
		if _, _, fault := readFrame(data[p:]); fault == frameOK {
			return true
		}
	}
	return false
}

// replayJournal applies the records of one log file's contents, those
// before byte offset stopAt only when stopAt is not negative, and returns
// where it stopped early, or nil when it read them all. The damage
// returned is a torn-tail candidate when no intact record follows it in
// this file; loadImage decides with the later files.
func (img *image) replayJournal(path string, data []byte, stopAt int64) *journalDamage {
	damage := func(off int, reason string) *journalDamage {
		return &journalDamage{DamageError: DamageError{Path: path, Offset: int64(off), Dropped: int64(len(data) - off), Reason: reason}}
	}
	if len(data) < len(journalMagic) {
		// A crash while the file was created: nothing went into it.
		if blank(data) || string(data) == journalMagic[:len(data)] {
			return nil
		}
		return damage(0, "not a journal file")
	}
	if magic := string(data[:len(journalMagic)]); magic != journalMagic {
		return damage(0, fmt.Sprintf("not a journal file of this version (header %q, want %q)", magic, journalMagic))
	}
	for off := len(journalMagic); off < len(data); {
		if stopAt >= 0 && int64(off) >= stopAt {
			return nil
		}
		payload, size, fault := readFrame(data[off:])
		switch fault {
		case frameOK:
			if err := img.apply(payload); err != nil {
				d := damage(off, "the record passes its checksums but does not decode")
				d.Err, d.applied = err, true
				return d
			}
			off += size
			continue
		default:
			d := damage(off, fault.String())
			d.torn = !intactRecordIn(data[off+1:])
			return d
		}
	}
	return nil
}

// replaySnapshot applies a snapshot file's contents and returns its
// generation. Unlike a log, a snapshot must be intact: it was renamed into
// place only after it was synced. Damage is a [*DamageError].
func (img *image) replaySnapshot(path string, data []byte) (uint64, error) {
	damage := func(off int, reason string, err error) error {
		return &DamageError{Path: path, Offset: int64(off), Dropped: int64(len(data) - off), Reason: reason, Err: err}
	}
	const headerSize = len(snapshotMagic) + 8
	if len(data) < headerSize {
		return 0, damage(0, "the snapshot header is incomplete", nil)
	}
	if magic := string(data[:len(snapshotMagic)]); magic != snapshotMagic {
		return 0, damage(0, fmt.Sprintf("not a snapshot of this version (header %q, want %q)", magic, snapshotMagic), nil)
	}
	gen := binary.LittleEndian.Uint64(data[len(snapshotMagic):])
	for off := headerSize; off < len(data); {
		payload, size, fault := readFrame(data[off:])
		if fault != frameOK {
			return 0, damage(off, fault.String(), nil)
		}
		if err := img.apply(payload); err != nil {
			return 0, damage(off, "the record passes its checksums but does not decode", err)
		}
		off += size
	}
	if !img.complete {
		return 0, damage(len(data), "the snapshot ends before its end marker", nil)
	}
	return gen, nil
}

// loadImage replays the snapshot and the logs after it. It returns the
// highest generation found, so the next one is new, and where the logs
// stopped early (nil if they did not). With stop, it replays the logs only
// up to that damage, without it: the second pass of a truncation after a
// record that failed halfway through its application.
func loadImage(dir string, stop *journalDamage) (*image, uint64, *journalDamage, error) {
	img := newImage()
	var snapGen uint64
	snapPath := filepath.Join(dir, snapshotFile)
	data, err := os.ReadFile(snapPath)
	switch {
	case err == nil:
		if snapGen, err = img.replaySnapshot(snapPath, data); err != nil {
			return nil, 0, nil, err
		}
		img.snapshot, img.snapshotGen, img.snapshotSize = true, snapGen, int64(len(data))
	case !errors.Is(err, fs.ErrNotExist):
		return nil, 0, nil, persistErr("reading snapshot", err)
	}
	gens, err := journalGenerations(dir)
	if err != nil {
		return nil, 0, nil, err
	}
	top := snapGen
	var found *journalDamage
	for _, g := range gens {
		top = max(top, g)
		// Older logs are already in the snapshot.
		if g < snapGen {
			continue
		}
		path := filepath.Join(dir, journalName(g))
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, 0, nil, persistErr("reading journal", err)
		}
		switch {
		case found != nil:
			// After the damage: dropped too, and an intact record here
			// means the damage was not at the end of the journal.
			found.later = append(found.later, g)
			found.Dropped += int64(max(len(data)-len(journalMagic), 0))
			if len(data) > len(journalMagic) && intactRecordIn(data[len(journalMagic):]) {
				found.torn = false
			}
		case stop != nil && g > stop.gen:
		default:
			stopAt := int64(-1)
			if stop != nil && g == stop.gen {
				stopAt = stop.Offset
			}
			if d := img.replayJournal(path, data, stopAt); d != nil {
				d.gen = g
				found = d
			}
			img.logs = append(img.logs, replayedLog{gen: g, size: int64(len(data))})
		}
	}
	return img, top, found, nil
}

// handleDamage applies the torn-tail rule to where replaying the logs
// stopped: it returns the image to start from, and the generations whose
// files are kept as <name>.damaged, or the [*DamageError] that stops the
// start.
func handleDamage(opts Options, log *slog.Logger, img *image, d *journalDamage) (*image, []uint64, error) {
	if d == nil {
		return img, nil, nil
	}
	if d.torn {
		log.Info("broker: cut off the torn tail of the journal, records a crash left unfinished and never acknowledged",
			"file", d.Path, "offset", d.Offset, "bytes", d.Dropped, "reason", d.Reason)
		return img, nil, nil
	}
	if !opts.TruncateDamagedJournal {
		derr := d.DamageError
		return nil, nil, &derr
	}
	if d.applied {
		// The bad record may have been half applied: replay again, up to it.
		var err error
		if img, _, _, err = loadImage(opts.DataDir, d); err != nil {
			return nil, nil, err
		}
	}
	damaged := append([]uint64{d.gen}, d.later...)
	log.Warn("broker: truncated the damaged journal at its last good record (TruncateDamagedJournal); records after it are lost",
		"file", d.Path, "offset", d.Offset, "bytes", d.Dropped, "reason", d.Reason, "laterFiles", len(d.later),
		"keptAs", d.Path+damagedSuffix)
	return img, damaged, nil
}

// damagedSuffix is appended to the name of a journal file that a
// truncation cut short, which is kept for inspection; nothing reads it.
const damagedSuffix = ".damaged"
