package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/sbretry/retry/retryindex"
)

// What a producer wrote (ids, a dead-letter reason, an error) reaches the terminal quoted, never as
// the escape sequences it holds (found by a review).
func TestIndexEventIsEscaped(t *testing.T) {
	var b bytes.Buffer
	e := retryindex.Event{State: retryindex.StateDeadLettered, OriginalID: "ord\x1b]0;pwned\x07-1", Key: "k\x1b[2J", CorrelationID: "c",
		Reason: "r\x1b[2J", LastError: "boom\x1b[31m", Updated: time.Now(), Attempt: 1,
		History: []retryindex.Attempt{{At: time.Now(), Attempt: 1, Kind: retryindex.KindDeadLettered, Reason: "r\x1b[2J", Error: "e\x07", Process: "p\x1b"}}}
	writeIndexEvent(&b, e, time.Now())
	assert.NotContains(t, b.String(), "\x1b")
	assert.NotContains(t, b.String(), "\x07")
	assert.Contains(t, b.String(), `"ord\x1b]0;pwned\a-1"`)
}
