package main

import (
	"bufio"
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry/internal/sbtest"
)

func TestMain(m *testing.M) {
	if args := os.Getenv(childArgsEnv); args != "" {
		os.Exit(runAsChild(args))
	}
	// The crash test loses connections on purpose, which leaks the SDK's renewal goroutines.
	goleak.VerifyTestMain(m, sbtest.IgnoreSDKLeak())
}

func TestRunServesQueuesUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-queue", "orders", "-queue", "payments", "-lock-duration", "10s"}, pw, io.Discard)
		_ = pw.Close()
	}()

	line, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err)
	cs := strings.TrimSpace(line)
	require.True(t, strings.HasPrefix(cs, "Endpoint=sb://127.0.0.1:"), cs)
	assert.Contains(t, cs, "UseDevelopmentEmulator=true")
	go func() { _, _ = io.Copy(io.Discard, pr) }()

	client, err := azservicebus.NewClientFromConnectionString(cs, nil)
	require.NoError(t, err)
	opCtx, opCancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer opCancel()
	for _, q := range []string{"orders", "payments"} {
		sender, err := client.NewSender(q, nil)
		require.NoError(t, err)
		require.NoError(t, sender.SendMessage(opCtx, &azservicebus.Message{Body: []byte(q)}, nil))
		receiver, err := client.NewReceiverForQueue(q, nil)
		require.NoError(t, err)
		msgs, err := receiver.ReceiveMessages(opCtx, 1, nil)
		require.NoError(t, err)
		require.Len(t, msgs, 1)
		assert.Equal(t, q, string(msgs[0].Body))
		require.NoError(t, receiver.CompleteMessage(opCtx, msgs[0], nil))
		require.NoError(t, sender.Close(opCtx))
		require.NoError(t, receiver.Close(opCtx))
	}
	require.NoError(t, client.Close(opCtx))

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return after cancellation")
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{"unknown flag", []string{"-nope"}},
		{"stray argument", []string{"extra"}},
		{"empty queue", []string{"-queue", ""}},
		{"negative lock", []string{"-addr", "127.0.0.1:0", "-lock-duration", "-1s"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := run(context.Background(), tc.args, io.Discard, io.Discard)
			require.Error(t, err)
		})
	}
}

// TestRunLoadsMicrosoftConfig starts the binary's run on the sample
// Config.json and receives through a subscription it defines.
func TestRunLoadsMicrosoftConfig(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-config", "../../sbemu/testdata/Config.json", "-queue", "extra"}, pw, io.Discard)
		_ = pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err)
	go func() { _, _ = io.Copy(io.Discard, pr) }()

	client, err := azservicebus.NewClientFromConnectionString(strings.TrimSpace(line), nil)
	require.NoError(t, err)
	opCtx, opCancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer opCancel()
	for _, target := range []string{"order-events", "extra"} {
		sender, err := client.NewSender(target, nil)
		require.NoError(t, err)
		require.NoError(t, sender.SendMessage(opCtx, &azservicebus.Message{Body: []byte(target)}, nil))
		require.NoError(t, sender.Close(opCtx))
	}
	receiver, err := client.NewReceiverForSubscription("order-events", "everything", nil)
	require.NoError(t, err)
	msgs, err := receiver.ReceiveMessages(opCtx, 1, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	assert.Equal(t, "order-events", string(msgs[0].Body))
	require.NoError(t, receiver.Close(opCtx))
	require.NoError(t, client.Close(opCtx))

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return after cancellation")
	}
}

func TestRunReportsConfigErrors(t *testing.T) {
	err := run(context.Background(), []string{"-addr", "127.0.0.1:0", "-config", "does-not-exist.json"}, io.Discard, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "does-not-exist.json")
}

// startRun runs the command with args until the test ends and returns the
// connection string it printed.
func startRun(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"-addr", "127.0.0.1:0"}, args...), pw, io.Discard)
		_ = pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Error("run did not return after cancellation")
		}
	})
	line, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err)
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	return strings.TrimSpace(line)
}

// TestRunAppliesLimitFlags checks that a limit flag reaches the emulator:
// a peek over -max-peek-count is refused naming the limit.
func TestRunAppliesLimitFlags(t *testing.T) {
	cs := startRun(t, "-max-peek-count", "1", "-keep-locks-on-disconnect", "-idle-timeout", "30s")
	// The SDK recovers the connection and retries after a status 400, so
	// its retries are made fast here.
	client, err := azservicebus.NewClientFromConnectionString(cs, &azservicebus.ClientOptions{
		RetryOptions: azservicebus.RetryOptions{MaxRetries: 1, RetryDelay: 10 * time.Millisecond, MaxRetryDelay: 10 * time.Millisecond},
	})
	require.NoError(t, err)
	opCtx, opCancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer opCancel()
	defer func() { _ = client.Close(opCtx) }()
	receiver, err := client.NewReceiverForQueue("queue", nil)
	require.NoError(t, err)
	_, err = receiver.PeekMessages(opCtx, 1, nil)
	require.NoError(t, err)
	_, err = receiver.PeekMessages(opCtx, 2, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "peek count limit of 1")
	require.NoError(t, receiver.Close(opCtx))
}
