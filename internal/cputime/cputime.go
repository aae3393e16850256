// Package cputime reads the CPU time this process has used, for the benchmarks that report CPU per
// message next to throughput (the root package's and e2e's).
package cputime

import "time"

// Process is the CPU time (user and system) this process has used so far, or zero where the platform
// does not say (benchmarks then report no CPU figure).
func Process() time.Duration { return process() }
