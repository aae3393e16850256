package broker

import (
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
)

// What a failed write or fsync of the journal does, and how tests cause
// one.
//
// The journal never retries. After a failed fsync, Linux may already have
// dropped the dirty pages it could not write and marked them clean, so a
// second fsync can succeed without the data; after a failed write the
// file may hold part of the batch. Either way the log no longer matches
// what the broker holds in memory, and the first failure is sticky: the
// journal cuts its file back to the last synced record (journal.go,
// cutBack), logs the error once at Error level, closes the channel of
// [Broker.JournalFailed] and writes nothing more.
//
// The broker then stops loudly rather than serving a state its disk does
// not have. Its calls keep running in memory (they never promised
// durability: that promise is [Broker.Sync], [Broker.AfterSync] and
// [Broker.WaitStored]), but from the failure on those three report the
// error, for every change, including those that were already waiting for
// the failed batch. The AMQP server and the administration API send every
// answer from them, so a send, a settlement, a management request and an
// administration call each get an error, and a receive link is detached
// instead of transferring its next message: no client is told of a
// change after the failure, and the failed change itself is never
// acknowledged.
// cmd/sbemu exits when the journal fails. Reopening the directory starts
// from what was acknowledged.

// journalFile is the journal's open log as the journal goroutine uses it:
// an *os.File, wrapped by journalFaults so that tests can make a write or
// an fsync fail.
type journalFile interface {
	Write(p []byte) (int, error)
	Sync() error
	Truncate(size int64) error
	Close() error
}

// JournalFault is a failure of the journal file that
// [Broker.InjectJournalFault] arms for the next write or fsync.
type JournalFault int

const (
	// JournalWriteFault makes the next write of the journal file fail
	// after half of its bytes reached the file, as a full disk or a
	// failing device leaves a short write.
	JournalWriteFault JournalFault = iota + 1
	// JournalSyncFault makes the next fsync of the journal file fail after
	// its write succeeded, as an I/O error the disk reports at flush
	// time.
	JournalSyncFault
)

// ErrInjectedFault is the cause of a failure armed with
// [Broker.InjectJournalFault]; it is also a [syscall.EIO], the error a
// real device failure returns.
var ErrInjectedFault = fmt.Errorf("broker: injected journal fault: %w", syscall.EIO)

// InjectJournalFault arms f for the journal's next write (or fsync) of
// records, once. The failure stops the journal as a real one would (see
// [Broker.JournalFailed]): the changes that write was to make durable are
// never acknowledged, and nor is any later one. Arming again before the
// fault fired replaces it. It returns an error wrapping
// [ErrInvalidConfig] without [Options.DataDir] or for an unknown f.
func (b *Broker) InjectJournalFault(f JournalFault) error {
	if b.persist == nil {
		return fmt.Errorf("%w: InjectJournalFault needs a data directory (Options.DataDir)", ErrInvalidConfig)
	}
	if f != JournalWriteFault && f != JournalSyncFault {
		return fmt.Errorf("%w: unknown journal fault %d", ErrInvalidConfig, f)
	}
	b.persist.j.faults.armed.Store(int32(f))
	return nil
}

// JournalFailed returns a channel that is closed when the journal stops
// after a failed write, fsync or encoding of a change; [Broker.Sync] then
// returns the error. Without [Options.DataDir] it returns nil, a channel
// that never becomes ready. cmd/sbemu exits when it closes.
func (b *Broker) JournalFailed() <-chan struct{} {
	if b.persist == nil {
		return nil
	}
	return b.persist.j.failed
}

// journalFaults is the armed fault of one journal, shared by the files of
// every generation it writes.
type journalFaults struct {
	armed atomic.Int32 // a JournalFault, or 0
}

// wrap returns f as the journal writes it: through the armed faults.
func (jf *journalFaults) wrap(f *os.File) journalFile { return &faultyFile{File: f, faults: jf} }

// faultyFile is an *os.File whose next Write or Sync may fail on demand.
type faultyFile struct {
	*os.File
	faults *journalFaults
}

// Write writes p, or half of it and fails when a write fault is armed.
func (f *faultyFile) Write(p []byte) (int, error) {
	if f.faults.armed.CompareAndSwap(int32(JournalWriteFault), 0) {
		n, err := f.File.Write(p[:len(p)/2])
		if err != nil {
			return n, err
		}
		return n, ErrInjectedFault
	}
	return f.File.Write(p)
}

// Sync fsyncs the file, or fails without syncing when a sync fault is
// armed.
func (f *faultyFile) Sync() error {
	if f.faults.armed.CompareAndSwap(int32(JournalSyncFault), 0) {
		return ErrInjectedFault
	}
	return f.File.Sync()
}
