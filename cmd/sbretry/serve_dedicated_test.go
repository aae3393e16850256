package main

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sbretry/retry/internal/sbtest"
)

// TestServeIndexDedicatedNeedsAnIndex: --index-dedicated reaches console.Options.IndexDedicated,
// whose refusal without an index is a usage error.
func TestServeIndexDedicatedNeedsAnIndex(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	code, _, stderr := cliNoEntity(t, "", "--connection-string", h.Em.ConnectionString(), "--queue", sbtest.Queue, "serve", "--index-dedicated")
	assert.Equal(t, exitUsage, code, stderr)
	assert.Contains(t, stderr, "IndexDedicated needs an Index")
}
