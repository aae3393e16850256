package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestQuickstart runs the quickstart as `go run` would and checks what it promises: flaky messages
// retried until they succeed, the poison message dead-lettered, a summary.
func TestQuickstart(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	require.NoError(t, run(ctx, &out))
	text := out.String()
	assert.Contains(t, text, "order-3  attempt 4  completed")
	assert.Contains(t, text, "poison   attempt 5  dead-lettered (RetryMaxAttemptsExceeded)")
	assert.Contains(t, text, "summary: 12 deliveries, 3 completed, 8 retries scheduled, 1 dead-lettered")
	assert.Equal(t, 1, strings.Count(text, "dead-letter queue: poison-attempt-5"))
}
