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

// TestQuickstart runs the quickstart against the in-process emulator, as `go run` does, and checks what
// it promises: flaky messages retried until they succeed, the poison message dead-lettered and read back
// from the dead-letter queue, a summary.
func TestQuickstart(t *testing.T) {
	em, err := startEmulator()
	require.NoError(t, err)
	defer func() { require.NoError(t, em.Close()) }()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	dlqAlert = emulatorAlert(em, "quickstart")
	defer func() { dlqAlert = nil }()
	require.NoError(t, run(ctx, &out, em.ConnectionString(), "quickstart"))
	text := out.String()
	t.Log("\n" + text)
	assert.Regexp(t, `order-3\s+4\s+completed`, text)
	assert.Regexp(t, `poison\s+5\s+dead-lettered`, text)
	assert.Contains(t, text, "summary: 12 deliveries, 3 completed, 8 retries scheduled, 1 dead-lettered")
	assert.Contains(t, text, "alert: 1 message(s) in the dead-letter queue of quickstart, 1 new")
	assert.Contains(t, text, "inspector: dead-lettered after attempt 5: RetryMaxAttemptsExceeded (payment service unavailable)")
	assert.Equal(t, 1, strings.Count(text, `dead-letter queue: poison attempt=5 reason=RetryMaxAttemptsExceeded description="payment service unavailable"`))

	out.Reset()
	require.NoError(t, runTopic(ctx, &out, em.ConnectionString()))
	t.Log("\n" + out.String())
	assert.Contains(t, out.String(), "received: audit    attempt 1; billing  attempt 1; billing  attempt 2; billing  attempt 3\n",
		"audit got the event once, billing its three attempts")
}
