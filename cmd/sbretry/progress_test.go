package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestProgressLines(t *testing.T) {
	t.Parallel()
	var b stringsBuilder
	p := newProgress(&b, "redrive", 40)
	for i := 1; i <= 40; i++ {
		p.update(i)
	}
	assert.Equal(t, 10, countLines(b.String()), "a line per tenth in a log: %q", b.String())
	assert.Contains(t, b.String(), "sbretry: redrive 40/40\n")
}
