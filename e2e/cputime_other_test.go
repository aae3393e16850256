//go:build !unix

package e2e

import "time"

// processCPU is not measured on this platform; benchmarks then report no CPU figure.
func processCPU() time.Duration { return 0 }
