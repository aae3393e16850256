package testcert

import (
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSelfSignedVerifiesForLoopback checks that the CA file verifies the served certificate for both
// loopback names, and for nothing else.
func TestSelfSignedVerifiesForLoopback(t *testing.T) {
	server, caPath := SelfSigned(t)
	require.Len(t, server.Certificates, 1)
	leaf, err := x509.ParseCertificate(server.Certificates[0].Certificate[0])
	require.NoError(t, err)

	raw, err := os.ReadFile(caPath)
	require.NoError(t, err)
	block, _ := pem.Decode(raw)
	require.NotNil(t, block, "the CA file is PEM")
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(raw))

	for _, name := range []string{"localhost", "127.0.0.1"} {
		_, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		assert.NoError(t, err, name)
	}
	_, err = leaf.Verify(x509.VerifyOptions{DNSName: "example.com", Roots: pool})
	assert.Error(t, err, "not valid for other names")
	_, err = leaf.Verify(x509.VerifyOptions{DNSName: "localhost", Roots: pool, CurrentTime: time.Now().Add(2 * time.Hour)})
	assert.Error(t, err, "not valid after the test")
	assert.True(t, leaf.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)))
}
