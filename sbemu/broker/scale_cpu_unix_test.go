//go:build unix

package broker

import (
	"syscall"
	"time"
)

// processCPU is the CPU time the process has used so far, user and
// system, every goroutine and the collector included.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
