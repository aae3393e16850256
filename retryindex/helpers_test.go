package retryindex

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/sbtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		os.Exit(runCrashChild())
	}
	code := m.Run()
	removeBenchIndex()
	if code == 0 {
		if err := goleak.Find(sbtest.IgnoreSDKLeak()); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// t0 is the fixed time the table tests start at.
var t0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

// openTemp opens a fresh index in the test's temporary directory, closed when the test ends.
func openTemp(tb testing.TB, opts *SQLiteOptions) (*SQLite, string) {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "index.db")
	s, err := OpenSQLite(path, opts)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = s.Close() })
	return s, path
}

// envOf is the envelope of a chain started on "orders" at sequence number seq by message id.
func envOf(id string, seq int64) envelope.Envelope {
	return envelope.Envelope{Source: "orders", FirstSequenceNumber: seq, OriginalMessageID: id, Key: id, CorrelationID: id}
}

// rec is a consumer record of kind k for the chain of (id, seq), at attempt n, at t0 plus at.
func rec(id string, seq int64, k Kind, n int, at time.Duration) Record {
	env := envOf(id, seq)
	r := Record{Chain: env.ChainID(), OriginalID: id, Key: id, CorrelationID: id, Source: "orders", Kind: k, Attempt: n,
		At: t0.Add(at), Process: "test/1", Feed: FeedConsumer, SequenceNumber: -1}
	switch k {
	case KindScheduled:
		r.NextAttempt, r.NextDue, r.Entity = n+1, t0.Add(at+time.Hour), "orders"
	case KindHeld:
		r.NextAttempt, r.NextDue, r.Entity = n, t0.Add(at+time.Minute), "orders"
	}
	return r
}

// fixedClock returns t as now.
func fixedClock(t time.Time) func() time.Time { return func() time.Time { return t } }
