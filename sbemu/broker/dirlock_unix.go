//go:build unix

package broker

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockDir takes an exclusive advisory lock on dir, so two brokers never
// write one journal. The kernel drops it when the process dies, so a crash
// never leaves the directory locked. The returned function releases it.
func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, persistErr("opening lock file", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("%w: data directory %s is in use by another broker: %w", ErrPersistence, dir, err)
	}
	return func() { _ = f.Close() }, nil
}
