package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/retryindex"
)

// runFailingConsumer sends ids and runs a consumer over them until each has an outcome: a message
// named poison-… is dead-lettered (a permanent failure), fine-… succeeds, and any other fails, its
// retry scheduled an hour ahead. hooks are the consumer's (a recorder's, or none: then it keeps no
// index, as a consumer whose recorder lost every record leaves it).
func runFailingConsumer(t *testing.T, h *harness, hooks retry.Hooks, ids ...string) {
	t.Helper()
	for _, id := range ids {
		h.Send(t, sbtest.Message(id))
	}
	connect, err := retry.NewNamespace(h.Em.ConnectionString(), &retry.ConnectOptions{Client: &azservicebus.ClientOptions{RetryOptions: sbtest.FastRetries}}).Queue(sbtest.Queue)
	require.NoError(t, err)
	out := sbtest.NewOutcomes()
	onProcessed := hooks.OnProcessed
	hooks.OnProcessed = func(p retry.ProcessedParams) {
		if onProcessed != nil {
			onProcessed(p)
		}
		out.Hook(p)
	}
	c, err := retry.NewConsumer(connect, func(_ context.Context, m *azservicebus.ReceivedMessage) error {
		switch {
		case strings.HasPrefix(m.MessageID, "poison-"):
			return retry.Permanent(errBoom)
		case strings.HasPrefix(m.MessageID, "fine-"):
			return nil
		}
		return errBoom
	}, &retry.Options{Backoff: backoff.Constant{Interval: time.Hour}, SettleTimeout: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Hooks: hooks})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	out.WaitFor(t, "an outcome for each", func(ps []retry.ProcessedParams) bool { return len(ps) >= len(ids) })
	cancel()
	require.NoError(t, <-ran)
}

// emptyIndexWithLosses makes an index file whose consumer feed noted n lost records.
func emptyIndexWithLosses(t *testing.T, n int64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "index.db")
	store, err := retryindex.OpenSQLite(path, nil)
	require.NoError(t, err)
	require.NoError(t, store.NoteLost(sbtest.Context(t), "consumer billing-1", n))
	require.NoError(t, store.Close())
	return path
}

// index rebuild repairs an index whose recorder lost records: the events it missed are read from the
// broker (the pending retry with its due time and sequence number, as status without --index says,
// and the dead letter), and the answers no longer warn of losses.
func TestIndexRebuildRepairsLostRecords(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	runFailingConsumer(t, h, retry.Hooks{}, "order-1", "poison-1")
	path := emptyIndexWithLosses(t, 2)

	code, before, _ := cliNoEntity(t, "", "status", "--index", path, "order-1")
	assert.Equal(t, exitNotFound, code)
	assert.Contains(t, before, "LOST 2 records")

	code, out, errOut := h.cli(t, "", "index", "rebuild", "--index", path)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "rebuilt index "+path+" from the broker")
	assert.Contains(t, out, "read 1 message of orders, read 1 message of orders/$DeadLetterQueue")
	assert.Contains(t, out, "losses noted before the rebuild cleared")

	code, fromBroker, errOut := h.cli(t, "", "status", "order-1")
	require.Equal(t, exitOK, code, errOut)
	code, fromIndex, errOut := cliNoEntity(t, "", "status", "--index", path, "order-1")
	require.Equal(t, exitOK, code, errOut)
	b, i := pendingLineRE.FindStringSubmatch(fromBroker), pendingLineRE.FindStringSubmatch(fromIndex)
	require.NotNil(t, b, fromBroker)
	require.NotNil(t, i, fromIndex)
	assert.Equal(t, b[1:], i[1:], "due time, attempt and sequence number")
	assert.NotContains(t, fromIndex, "LOST")
	assert.Contains(t, fromIndex, "tailer orders last wrote")

	code, fromIndex, errOut = cliNoEntity(t, "", "status", "--index", path, "poison-1")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, fromIndex, "dead-lettered")
}

// index tail feeds the index from the broker until interrupted, saying on stderr what each poll that
// found something wrote; interrupted, it exits 0. An index file that does not exist yet is created.
func TestIndexTailFeedsUntilInterrupted(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	runFailingConsumer(t, h, retry.Hooks{}, "order-1", "poison-1")
	path := filepath.Join(t.TempDir(), "new.db")

	polled := make(chan struct{})
	errOut := &signalWriter{on: "records written", ch: polled}
	var out bytes.Buffer
	a := &app{stdin: strings.NewReader(""), stdout: &out, stderr: errOut, getenv: func(string) string { return "" }, now: time.Now}
	ctx, cancel := context.WithCancel(sbtest.Context(t))
	done := make(chan int, 1)
	go func() {
		done <- a.run(ctx, []string{"--connection-string", h.Em.ConnectionString(), "--queue", sbtest.Queue, "index", "tail", "--index", path, "--interval", "1h"})
	}()
	select {
	case <-polled:
	case code := <-done:
		t.Fatalf("tail ended with %d before its first poll: %s", code, errOut.String())
	}
	cancel()
	assert.Equal(t, exitOK, <-done, errOut.String())
	assert.Contains(t, errOut.String(), "feeding index "+path+" from orders and orders/$DeadLetterQueue every 1h0m0s")
	assert.Contains(t, errOut.String(), "read 1 message of orders, read 1 message of orders/$DeadLetterQueue; 2 records written")

	code, fromIndex, stderr := cliNoEntity(t, "", "status", "--index", path, "order-1")
	require.Equal(t, exitOK, code, stderr)
	assert.Contains(t, fromIndex, "will be retried at")
}

// The commands refuse what they cannot do, before reading anything.
func TestIndexFeedUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--queue", "orders", "index"}, "index needs a subcommand: rebuild or tail"},
		{[]string{"--queue", "orders", "index", "rebuild"}, "index rebuild needs --index FILE"},
		{[]string{"--queue", "orders", "index", "tail", "--index", "x.db", "--interval", "0s"}, "--interval must be positive"},
		{[]string{"--queue", "orders", "--session-consumer", "index", "rebuild", "--index", "x.db"}, "a session consumer keeps its holds in its sessions"},
		{[]string{"--queue", "orders", "index", "rebuild", "--index", "x.db", "extra"}, "index rebuild takes no arguments"},
		{[]string{"--queue", "orders", "index", "tail", "--index", "x.db", "--json"}, "--json is for index rebuild"},
	} {
		code, _, errOut := cliNoEntity(t, "", tc.args...)
		assert.Equal(t, exitUsage, code, tc.args)
		assert.Contains(t, errOut, tc.want, tc.args)
	}
}

// signalWriter collects what is written and closes ch the first time it contains on.
type signalWriter struct {
	mu   sync.Mutex
	b    bytes.Buffer
	on   string
	ch   chan struct{}
	done bool
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.b.Write(p)
	if !w.done && strings.Contains(w.b.String(), w.on) {
		w.done = true
		close(w.ch)
	}
	return n, err
}

func (w *signalWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// A URL given to --index is never echoed, whatever its scheme's case: it may carry a password.
func TestIndexURLNeverEchoed(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"status", "--index", "mysql://ops:hunter2@db.internal/idx", "order-1"},
		{"--queue", "orders", "index", "rebuild", "--index", "MySQL://ops:hunter2@db.internal/idx", "--connection-string", "Endpoint=sb://127.0.0.1:1/;SharedAccessKeyName=k;SharedAccessKey=v"},
		{"status", "--index", "Postgres://ops:hunter2@127.0.0.1:1/idx?connect_timeout=1", "order-1"},
	} {
		code, out, errOut := cliNoEntity(t, "", args...)
		assert.NotEqual(t, exitOK, code, args)
		assert.NotContains(t, out+errOut, "hunter2", args)
	}
}

// index tail fails at once, exit 1, when its first read fails (here, an entity that does not exist),
// instead of reporting the failure every interval and exiting 0 when interrupted.
func TestIndexTailFailsWhenItsFirstReadFails(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	path := filepath.Join(t.TempDir(), "index.db")
	code, _, errOut := cliNoEntity(t, "", "--connection-string", h.Em.ConnectionString(), "--queue", "no-such-queue", "index", "tail", "--index", path, "--interval", "1h")
	assert.Equal(t, exitError, code, errOut)
	assert.Contains(t, errOut, "reading no-such-queue and no-such-queue/$DeadLetterQueue into index "+path)
}

// index rebuild --json says the same in one object.
func TestIndexRebuildJSON(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	runFailingConsumer(t, h, retry.Hooks{}, "order-1")
	path := filepath.Join(t.TempDir(), "index.db")
	code, out, errOut := h.cli(t, "", "index", "rebuild", "--index", path, "--json")
	require.Equal(t, exitOK, code, errOut)
	var got struct {
		Index         string         `json:"index"`
		Peeked        map[string]int `json:"peeked"`
		Recorded      int            `json:"recorded"`
		LossesCleared bool           `json:"lossesCleared"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	assert.Equal(t, path, got.Index)
	assert.Equal(t, map[string]int{"orders": 1}, got.Peeked, "an entity with nothing read is left out")
	assert.Equal(t, 1, got.Recorded)
	assert.True(t, got.LossesCleared)
}

// index rebuild on the subscription layout: the copies are in the retry queue, the dead letters in two
// dead-letter queues whose sequence numbers collide. Each event is read from where it is, and status
// from the index says what status from the broker says.
func TestIndexRebuildSubscriptionLayout(t *testing.T) {
	t.Parallel()
	h := newSubscriptionHarness(t)
	h.seed(t, "pending-1", "perm-1", "max-1")
	path := filepath.Join(t.TempDir(), "index.db")
	code, out, errOut := h.cli(t, "", "index", "rebuild", "--index", path)
	require.Equal(t, exitOK, code, errOut)
	for _, entity := range []string{sbtest.RetryQueue, sbtest.RetryQueue + "/$DeadLetterQueue", sbtest.SubscriptionPath + "/$DeadLetterQueue"} {
		assert.Contains(t, out, "of "+entity, "rebuild reads %s", entity)
	}

	code, fromBroker, errOut := h.cli(t, "", "status", "pending-1")
	require.Equal(t, exitOK, code, errOut)
	code, fromIndex, errOut := cliNoEntity(t, "", "status", "--index", path, "pending-1")
	require.Equal(t, exitOK, code, errOut)
	retried := regexp.MustCompile(`will be retried at (\S+) \(attempt (\d+)\), .*?sequence number (\d+) in ` + regexp.QuoteMeta(sbtest.RetryQueue))
	b, i := retried.FindStringSubmatch(fromBroker), retried.FindStringSubmatch(fromIndex)
	require.NotNil(t, b, fromBroker)
	require.NotNil(t, i, fromIndex)
	assert.Equal(t, b[1:], i[1:], "due time, attempt and sequence number in the retry queue")

	reason := regexp.MustCompile(`dead-lettered at \S+: (\w+) \(attempt (\d+)\)`)
	for _, id := range []string{"perm-1", "max-1"} {
		code, fromBroker, _ = h.cli(t, "", "status", id)
		require.Equal(t, exitOK, code)
		code, fromIndex, _ = cliNoEntity(t, "", "status", "--index", path, id)
		require.Equal(t, exitOK, code, fromIndex)
		b, i = reason.FindStringSubmatch(fromBroker), reason.FindStringSubmatch(fromIndex)
		require.NotNil(t, b, fromBroker)
		require.NotNil(t, i, fromIndex)
		assert.Equal(t, b[1:], i[1:], "%s: reason and attempt", id)
	}
}
