package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// childArgsEnv makes the test binary run the command instead of the tests
// (see TestMain): a real process that the crash test can SIGKILL, without
// building the binary separately. The value is the JSON array of
// arguments.
const childArgsEnv = "SBEMU_TEST_CHILD_ARGS"

// runAsChild runs the command with the arguments from childArgsEnv, as
// main does, and returns the exit code.
func runAsChild(encoded string) int {
	var args []string
	if err := json.Unmarshal([]byte(encoded), &args); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, args, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return 0
}

// child is one emulator process on a data directory.
type child struct {
	cmd    *exec.Cmd
	cs     string
	stderr *bytes.Buffer
	exited chan struct{}
}

// startChild starts the emulator process on dir and waits for its
// connection string; it is killed at test end if still running.
func startChild(t *testing.T, dir string) *child {
	t.Helper()
	args, err := json.Marshal([]string{"-addr", "127.0.0.1:0", "-admin-addr", "127.0.0.1:0", "-data", dir, "-queue", "orders"})
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childArgsEnv+"="+string(args))
	c := &child{cmd: cmd, stderr: &bytes.Buffer{}, exited: make(chan struct{})}
	cmd.Stderr = c.stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "Endpoint=") {
				lines <- sc.Text()
			}
		}
		close(lines)
		_ = cmd.Wait() // after stdout is drained, as exec requires
		close(c.exited)
	}()
	t.Cleanup(c.kill)
	select {
	case cs, ok := <-lines:
		require.True(t, ok, "the emulator exited before listening: %s", c.stderr)
		c.cs = cs
	case <-time.After(20 * time.Second):
		t.Fatalf("no connection string within 20s: %s", c.stderr)
	}
	return c
}

// kill sends SIGKILL and waits until the process is gone, so its
// directory lock is released.
func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.exited
}

// crashClient is an SDK client that does not retry: after the SIGKILL a
// retried send could store a second copy, and every call must end soon.
func crashClient(t *testing.T, cs string) *azservicebus.Client {
	t.Helper()
	client, err := azservicebus.NewClientFromConnectionString(cs, &azservicebus.ClientOptions{
		RetryOptions: azservicebus.RetryOptions{MaxRetries: -1},
	})
	require.NoError(t, err)
	return client
}

// ledger records what the emulator acknowledged before it was killed.
type ledger struct {
	mu        sync.Mutex
	sent      map[string]bool // SendMessage returned nil
	completed map[string]bool // CompleteMessage returned nil
	settling  map[string]bool // CompleteMessage was called: gone or not, both are right
	maxSeq    int64           // highest sequence number received
}

// TestSIGKILLLosesNothingAcknowledged runs the emulator as a process with
// -data, sends from several goroutines and completes from another through
// the real SDK, and SIGKILLs the process at a random moment of that; twice,
// restarting on the same directory each time. After every restart each
// acknowledged send must be there unless a complete of it was attempted
// (one that reached the broker but not its answer may or may not have
// happened), no acknowledged complete may come back, and sequence numbers go on
// from where they were.
func TestSIGKILLLosesNothingAcknowledged(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("needs SIGKILL")
	}
	dir := t.TempDir()
	l := &ledger{sent: map[string]bool{}, completed: map[string]bool{}, settling: map[string]bool{}}
	for round := range 2 {
		c := startChild(t, dir)
		if round > 0 {
			verifyLedger(t, c.cs, l)
		}
		// The first round dies among sends, the second among completes.
		killAfter := 50 + rand.IntN(250)
		if round == 1 {
			killAfter = 20 + rand.IntN(100)
		}
		t.Logf("round %d: SIGKILL after %d acknowledged %s", round, killAfter, map[bool]string{true: "completes", false: "sends"}[round == 1])
		crashRound(t, c, l, round, killAfter)
	}
	c := startChild(t, dir)
	verifyLedger(t, c.cs, l)
}

// crashRound sends and completes until killAfter sends (round 0) or
// completes (round 1) were acknowledged, then kills the emulator while
// more are in flight.
func crashRound(t *testing.T, c *child, l *ledger, round, killAfter int) {
	client := crashClient(t, c.cs)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		wg       sync.WaitGroup
		killOnce sync.Once
		acked    int // sends in round 0, completes in round 1
	)
	kill := func() { killOnce.Do(c.kill) }
	const senders = 4
	for w := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sender, err := client.NewSender("orders", nil)
			if err != nil {
				return
			}
			for i := 0; ctx.Err() == nil; i++ {
				id := fmt.Sprintf("r%d-w%d-%d", round, w, i)
				if err := sender.SendMessage(ctx, &azservicebus.Message{Body: []byte(id), MessageID: to.Ptr(id)}, nil); err != nil {
					return // the emulator is gone
				}
				l.mu.Lock()
				l.sent[id] = true
				due := false
				if round == 0 {
					acked++
					due = acked == killAfter
				}
				l.mu.Unlock()
				if due {
					kill()
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		receiver, err := client.NewReceiverForQueue("orders", nil)
		if err != nil {
			return
		}
		for ctx.Err() == nil {
			msgs, err := receiver.ReceiveMessages(ctx, 20, nil)
			if err != nil || len(msgs) == 0 {
				return
			}
			// Settled concurrently, so completes are in flight together
			// when the kill comes.
			var batch sync.WaitGroup
			for _, m := range msgs {
				l.mu.Lock()
				l.maxSeq = max(l.maxSeq, *m.SequenceNumber)
				l.settling[m.MessageID] = true
				l.mu.Unlock()
				batch.Add(1)
				go func() {
					defer batch.Done()
					if err := receiver.CompleteMessage(ctx, m, nil); err == nil {
						l.mu.Lock()
						l.completed[m.MessageID] = true
						due := false
						if round == 1 {
							acked++
							due = acked == killAfter
						}
						l.mu.Unlock()
						if due {
							kill()
						}
					}
				}()
			}
			batch.Wait()
		}
	}()
	select {
	case <-c.exited:
	case <-ctx.Done():
		t.Fatalf("the emulator was not killed: %d acknowledged of %d", acked, killAfter)
	}
	// Calls in flight fail with the connection; end the rest now.
	cancel()
	wg.Wait()
	closeCtx, closeCancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer closeCancel()
	_ = client.Close(closeCtx)
	l.mu.Lock()
	defer l.mu.Unlock()
	require.GreaterOrEqual(t, acked, killAfter)
}

// verifyLedger peeks the whole queue of a restarted emulator and checks it
// against what was acknowledged; then it sends one message and checks its
// sequence number is new.
func verifyLedger(t *testing.T, cs string, l *ledger) {
	t.Helper()
	client := crashClient(t, cs)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	defer func() { _ = client.Close(ctx) }()
	receiver, err := client.NewReceiverForQueue("orders", nil)
	require.NoError(t, err)
	present := map[string]bool{}
	var maxSeq int64
	from := int64(0)
	for {
		page, err := receiver.PeekMessages(ctx, 500, &azservicebus.PeekMessagesOptions{FromSequenceNumber: &from})
		require.NoError(t, err)
		if len(page) == 0 {
			break
		}
		for _, m := range page {
			assert.False(t, present[m.MessageID], "%s stored twice", m.MessageID)
			present[m.MessageID] = true
			maxSeq = max(maxSeq, *m.SequenceNumber)
		}
		from = *page[len(page)-1].SequenceNumber + 1
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	lost, resurrected := 0, 0
	for id := range l.sent {
		if !l.settling[id] && !present[id] {
			lost++
			t.Errorf("acknowledged send %s is missing", id)
		}
	}
	for id := range l.completed {
		if present[id] {
			resurrected++
			t.Errorf("acknowledged complete of %s was undone", id)
		}
	}
	t.Logf("after restart: %d messages present, %d sends and %d completes acknowledged before, %d lost, %d undone",
		len(present), len(l.sent), len(l.completed), lost, resurrected)

	// A probe, not part of the ledger: its number must be new.
	probeID := fmt.Sprintf("probe-%d", len(present))
	sender, err := client.NewSender("orders", nil)
	require.NoError(t, err)
	require.NoError(t, sender.SendMessage(ctx, &azservicebus.Message{Body: []byte(probeID), MessageID: to.Ptr(probeID)}, nil))
	probe, err := receiver.PeekMessages(ctx, 1, &azservicebus.PeekMessagesOptions{FromSequenceNumber: to.Ptr(maxSeq + 1)})
	require.NoError(t, err)
	require.Len(t, probe, 1)
	assert.Equal(t, probeID, probe[0].MessageID)
	assert.Greater(t, *probe[0].SequenceNumber, max(maxSeq, l.maxSeq), "sequence numbers are not reused")
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("verification timed out")
	}
}
