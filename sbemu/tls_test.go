package sbemu

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"

	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/testcert"
)

// TestTLSListener serves amqps with Config.TLS and checks that a TLS client
// sends and receives through it.
func TestTLSListener(t *testing.T) {
	cfg, caPath := testcert.SelfSigned(t)
	em := startEmulator(t, Config{TLS: cfg})
	pemBytes, err := os.ReadFile(caPath)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(pemBytes))

	conn, err := amqp.Dial(ctxT(t), "amqps://"+em.Addr().String(), &amqp.ConnOptions{
		SASLType:  amqp.SASLTypeAnonymous(),
		TLSConfig: &tls.Config{RootCAs: roots, ServerName: "localhost"},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	session, err := conn.NewSession(ctxT(t), nil)
	require.NoError(t, err)
	sender, err := session.NewSender(ctxT(t), "queue", nil)
	require.NoError(t, err)
	require.NoError(t, sender.Send(ctxT(t), amqp.NewMessage([]byte("over tls")), nil))
	q, _ := em.Broker().Queue("queue")
	assert.Equal(t, 1, q.Stats().Active)
}
