package retryindex

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// crashChildEnv makes the test binary write to the index named by its value instead of running the
// tests (see TestMain): a real process that the crash test kills with SIGKILL mid-write.
const crashChildEnv = "RETRYINDEX_CRASH_CHILD"

// runCrashChild writes batches of 50 scheduled retries to the index forever through a Recorder's
// store path (Apply), printing the number of events committed after each commit, until it is killed.
func runCrashChild() int {
	s, err := OpenSQLite(os.Getenv(crashChildEnv), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx := context.Background()
	for b := 0; ; b++ {
		batch := make([]Record, 50)
		for i := range batch {
			n := b*len(batch) + i
			batch[i] = rec(fmt.Sprintf("crash-%d", n), int64(n+1), KindScheduled, 1, time.Duration(n)*time.Millisecond)
			batch[i].Error = strings.Repeat("x", 200)
		}
		if err := s.Apply(ctx, batch); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		fmt.Printf("committed %d\n", (b+1)*len(batch))
	}
}

// TestIndexSurvivesKill9 kills a process that writes to the index mid-write, then reopens the file:
// every batch the process reported committed is there, the database is intact, and it takes writes.
func TestIndexSurvivesKill9(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "index.db")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+path)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	committed := make(chan int, 1)
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stdout)
		reported := false
		for sc.Scan() {
			n, err := strconv.Atoi(strings.TrimPrefix(sc.Text(), "committed "))
			if err == nil && n >= 2000 && !reported {
				reported = true
				committed <- n
			}
		}
		_ = cmd.Wait()
	}()
	var n int
	timeout := time.NewTimer(60 * time.Second)
	defer timeout.Stop()
	select {
	case n = <-committed:
	case <-exited:
		t.Fatalf("the writer exited: %s", stderr.String())
	case <-timeout.C:
		t.Fatal("the writer committed too little within 60 s")
	}
	// Killed while it keeps writing: the next transaction is somewhere between begin and commit.
	require.NoError(t, cmd.Process.Kill())
	<-exited

	s, err := OpenSQLite(path, nil)
	require.NoError(t, err)
	defer func() { _ = s.Close() }()
	var check string
	require.NoError(t, s.read.QueryRow(`PRAGMA integrity_check`).Scan(&check))
	assert.Equal(t, "ok", check)
	c, err := s.Counts(context.Background(), nil)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, c.ByState[StatePending], int64(n), "every reported commit survived")
	assert.Zero(t, c.ByState[StatePending]%50, "no batch is half there")
	ans, err := s.Lookup(context.Background(), fmt.Sprintf("crash-%d", n-1), nil)
	require.NoError(t, err)
	require.Len(t, ans.Events, 1)
	assert.Equal(t, StatePending, ans.Events[0].State)
	require.NoError(t, s.Apply(context.Background(), []Record{rec("after", 1, KindSucceeded, 1, 0)}))
}
