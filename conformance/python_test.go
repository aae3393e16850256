package conformance

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// pythonTLSAddr is where the Python run listens. The SDK Debian ships
// (azure-servicebus 7.8.2, python3-azure) predates the connection string's
// UseDevelopmentEmulator setting: it always speaks AMQP over TLS to port
// 5671 of the endpoint host (a custom endpoint switches it to websockets),
// so the emulator serves TLS there with a certificate made for the test.
const pythonTLSAddr = "127.0.0.1:5671"

// TestPythonSDK runs python/conformance.py on azure-servicebus.
func TestPythonSDK(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed; the Python conformance checks need it with azure-servicebus (Debian: apt-get install python3-azure)")
	}
	// Debian's package lives in the system interpreter's path, which another
	// python3 on PATH may not see.
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		python = "/usr/bin/python3"
	}
	if out, err := exec.Command(python, "-c", "import azure.servicebus").CombinedOutput(); err != nil {
		t.Skipf("azure-servicebus is not importable by %s (Debian: apt-get install python3-azure): %s", python, out)
	}
	if ln, err := net.Listen("tcp", pythonTLSAddr); err != nil {
		t.Skipf("port %s is taken, and this SDK version can only use it: %v", pythonTLSAddr, err)
	} else {
		_ = ln.Close()
	}
	tlsCfg, ca := selfSignedTLS(t)
	em := sbemu.StartT(t, sbemu.Config{
		Addr:   pythonTLSAddr,
		TLS:    tlsCfg,
		Queues: []broker.QueueConfig{{Name: "py-queue"}},
		Topics: []broker.TopicConfig{{Name: "py-topic", Subscriptions: []broker.SubscriptionConfig{
			{Name: "all"},
			{Name: "blue", Rules: []broker.RuleConfig{{Name: "blue", SQLFilter: "color = 'blue'"}}},
		}}},
	})
	// "localhost" matches the certificate; the SDK adds port 5671 itself.
	conn := "Endpoint=sb://localhost/;SharedAccessKeyName=" + sbemu.DefaultKeyName + ";SharedAccessKey=" + sbemu.DefaultKey
	results := runClient(t, em, python, filepath.Join("python", "conformance.py"), conn, ca)
	require.NotEmpty(t, results, "the client reported no checks")
	for _, r := range results {
		t.Run(r.Check, func(t *testing.T) {
			assert.True(t, r.OK, r.Detail)
		})
	}
}
