package retryindex_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/retryindex"
	"github.com/sbretry/retry/retryindex/storetest"
)

// TestSQLiteConformance runs the checks every store passes (retryindex/storetest) on the embedded one.
func TestSQLiteConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T, now func() time.Time) retryindex.Store {
		s, err := retryindex.OpenSQLite(filepath.Join(t.TempDir(), "index.db"), &retryindex.SQLiteOptions{Now: now})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}
