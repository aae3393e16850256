package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/syncbuf"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// running is one in-process run of the command.
type running struct {
	cs     string
	log    *syncbuf.Buffer
	cancel context.CancelFunc
	done   chan error
}

// startRunning runs the command with args and waits for its connection
// string; stop ends it. The test fails if it is still running at the end.
func startRunning(t *testing.T, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	r := &running{log: &syncbuf.Buffer{}, cancel: cancel, done: make(chan error, 1)}
	go func() {
		r.done <- run(ctx, append([]string{"-addr", "127.0.0.1:0", "-admin-addr", "127.0.0.1:0"}, args...), pw, r.log)
		_ = pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(20 * time.Second):
			t.Error("run did not return after cancellation")
		}
	})
	line, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err, "no connection string: %s", r.log)
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	r.cs = strings.TrimSpace(line)
	return r
}

// wait returns run's error, which must come within 20 s.
func (r *running) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return")
		return nil
	}
}

// fastClient is an SDK client with few, fast retries.
func fastClient(t *testing.T, cs string) *azservicebus.Client {
	t.Helper()
	client, err := azservicebus.NewClientFromConnectionString(cs, &azservicebus.ClientOptions{
		RetryOptions: azservicebus.RetryOptions{MaxRetries: 2, RetryDelay: 10 * time.Millisecond, MaxRetryDelay: 50 * time.Millisecond},
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.Close(ctx)
	})
	return client
}

// peekBodies returns the bodies of every message in the queue.
func peekBodies(t *testing.T, ctx context.Context, client *azservicebus.Client, queue string) []string {
	t.Helper()
	receiver, err := client.NewReceiverForQueue(queue, nil)
	require.NoError(t, err)
	msgs, err := receiver.PeekMessages(ctx, 100, nil)
	require.NoError(t, err)
	var bodies []string
	for _, m := range msgs {
		bodies = append(bodies, string(m.Body))
	}
	return bodies
}

// journalRecords returns the path of the one journal file in dir and the
// offset of each record in it (the framing of sbemu/broker/journal.go:
// an 8-byte file header, then records of a 12-byte header whose first
// four bytes are the payload's length).
func journalRecords(t *testing.T, dir string) (string, []int) {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "journal-*"))
	require.NoError(t, err)
	require.Len(t, paths, 1)
	data, err := os.ReadFile(paths[0])
	require.NoError(t, err)
	var starts []int
	for off := 8; off+12 <= len(data); off += 12 + int(binary.LittleEndian.Uint32(data[off:])) {
		starts = append(starts, off)
	}
	return paths[0], starts
}

// TestRunRefusesADamagedJournalUnlessTold damages the middle of the
// journal of a stopped emulator: the next start fails naming the file and
// the offset; -truncate-damaged-journal starts with the messages before
// the damage and logs what it dropped.
func TestRunRefusesADamagedJournalUnlessTold(t *testing.T) {
	dir := t.TempDir()
	first := startRunning(t, "-data", dir, "-queue", "orders")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sender, err := fastClient(t, first.cs).NewSender("orders", nil)
	require.NoError(t, err)
	for i := range 5 {
		require.NoError(t, sender.SendMessage(ctx, &azservicebus.Message{Body: []byte(fmt.Sprint(i)), MessageID: to.Ptr(fmt.Sprint(i))}, nil))
	}
	first.cancel()
	require.NoError(t, first.wait(t))

	path, starts := journalRecords(t, dir)
	require.Len(t, starts, 5, "one record per send")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	data[starts[2]+12+3] ^= 0xff
	require.NoError(t, os.WriteFile(path, data, 0o644))

	err = run(ctx, []string{"-addr", "127.0.0.1:0", "-admin-addr", "127.0.0.1:0", "-data", dir, "-queue", "orders"}, io.Discard, io.Discard)
	require.Error(t, err)
	var de *broker.DamageError
	require.ErrorAs(t, err, &de)
	assert.Contains(t, err.Error(), fmt.Sprintf("%s at offset %d", path, starts[2]))
	assert.Contains(t, err.Error(), "-truncate-damaged-journal")
	assert.Equal(t, 2, exitCode(err))

	second := startRunning(t, "-data", dir, "-queue", "orders", "-truncate-damaged-journal")
	assert.Equal(t, []string{"0", "1"}, peekBodies(t, ctx, fastClient(t, second.cs), "orders"))
	log := second.log.String()
	assert.Contains(t, log, "level=WARN")
	assert.Contains(t, log, "file="+path)
	assert.Contains(t, log, fmt.Sprintf("offset=%d", starts[2]))
	assert.Contains(t, log, fmt.Sprintf("bytes=%d", len(data)-starts[2]))
	assert.FileExists(t, path+".damaged")
}

// TestRunExitsWhenTheJournalFails: a failed fsync while serving fails the
// send that needed it and stops the command with exit status 1, without a
// signal, and the error names the journal file.
func TestRunExitsWhenTheJournalFails(t *testing.T) {
	testHookStarted = func(em *sbemu.Emulator) {
		assert.NoError(t, em.Broker().InjectJournalFault(broker.JournalSyncFault))
	}
	t.Cleanup(func() { testHookStarted = nil })
	dir := t.TempDir()
	r := startRunning(t, "-data", dir, "-queue", "orders")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sender, err := fastClient(t, r.cs).NewSender("orders", nil)
	require.NoError(t, err)
	require.Error(t, sender.SendMessage(ctx, &azservicebus.Message{Body: []byte("lost")}, nil))

	err = r.wait(t)
	require.Error(t, err)
	assert.ErrorIs(t, err, errJournalStopped)
	assert.ErrorIs(t, err, broker.ErrInjectedFault)
	assert.Contains(t, err.Error(), filepath.Join(dir, "journal-"))
	assert.Equal(t, 1, exitCode(err))
	assert.Contains(t, r.log.String(), "level=ERROR")
}

// TestExitCodes: the statuses the package documentation promises.
func TestExitCodes(t *testing.T) {
	assert.Equal(t, 0, exitCode(nil))
	assert.Equal(t, 0, exitCode(flag.ErrHelp))
	assert.Equal(t, 1, exitCode(fmt.Errorf("x: %w", errJournalStopped)))
	assert.Equal(t, 2, exitCode(errors.New("sbemu: listening: address in use")))
}
