package conformance

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// clientTimeout bounds one client program's whole run.
const clientTimeout = 2 * time.Minute

// line is one line a client program prints: a check result or a request.
type line struct {
	Check  string `json:"check"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	Ask    string `json:"ask"`
}

// conformanceEmulator serves the entities every client program expects.
func conformanceEmulator(t *testing.T) *sbemu.Emulator {
	return sbemu.StartT(t, sbemu.Config{
		Queues: []broker.QueueConfig{{Name: "js-queue"}, {Name: "js-sessions", RequiresSession: true}},
		Topics: []broker.TopicConfig{{Name: "js-topic", Subscriptions: []broker.SubscriptionConfig{
			{Name: "all"},
			{Name: "blue", Rules: []broker.RuleConfig{{Name: "blue", SQLFilter: "color = 'blue'"}}},
		}}},
	})
}

// runClient runs a client program (its arguments include what it needs to
// reach em), answers its requests, and returns its check results in order;
// a program that fails to run to the end fails the test.
func runClient(t *testing.T, em *sbemu.Emulator, name string, args ...string) []line {
	t.Helper()
	results, err := runClientOnce(t, em, name, args...)
	require.NoError(t, err, "the client program failed")
	return results
}

// runClientOnce is runClient returning the program's error instead.
func runClientOnce(t *testing.T, em *sbemu.Emulator, name string, args ...string) ([]line, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())

	var results []line
	scanner := bufio.NewScanner(stdout)
	for scanner.Scan() {
		var l line
		if err := json.Unmarshal(scanner.Bytes(), &l); err != nil {
			t.Logf("%s: %s", name, scanner.Text()) // not ours: the SDK's own output
			continue
		}
		switch l.Ask {
		case "":
			results = append(results, l)
			continue
		case "expire-locks":
			em.ExpireLocks()
		default:
			t.Errorf("unknown request %q", l.Ask)
		}
		if _, err := fmt.Fprintln(stdin, "ok"); err != nil {
			t.Logf("answering %s: %v", name, err)
		}
	}
	_ = stdin.Close()
	return results, cmd.Wait()
}

// TestJavaScriptSDK runs js/conformance.mjs on @azure/service-bus.
func TestJavaScriptSDK(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed; the JavaScript conformance checks need Node.js 18 or later")
	}
	if _, err := os.Stat(filepath.Join("js", "node_modules", "@azure", "service-bus")); err != nil {
		t.Skip("@azure/service-bus is not installed: run `npm ci` in conformance/js")
	}
	em := conformanceEmulator(t)
	results := runClient(t, em, node, filepath.Join("js", "conformance.mjs"), em.ConnectionString())
	require.NotEmpty(t, results, "the client reported no checks")
	for _, r := range results {
		t.Run(r.Check, func(t *testing.T) {
			assert.True(t, r.OK, r.Detail)
		})
	}
}
