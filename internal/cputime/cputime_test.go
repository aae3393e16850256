package cputime

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestProcessGrowsWithWork spins until the process's CPU time has moved, bounded by a number of rounds
// rather than by a clock, and checks that it never goes back.
func TestProcessGrowsWithWork(t *testing.T) {
	if runtime.GOOS == "windows" || runtime.GOOS == "plan9" || runtime.GOOS == "js" || runtime.GOOS == "wasip1" {
		t.Skip("not measured on this platform")
	}
	start := Process()
	assert.Positive(t, start, "the test binary has used some CPU before this test")
	now := start
	sum := 0
	for round := 0; round < 1<<30 && now == start; round++ {
		sum += round % 7
		if round%(1<<16) == 0 {
			now = Process()
		}
	}
	assert.Greater(t, now, start, "CPU time moved after spinning (sum %d)", sum)
}
