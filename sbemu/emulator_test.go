package sbemu

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/syncbuf"
	"github.com/sbretry/retry/sbemu/broker"
)

func TestStartDefaults(t *testing.T) {
	em := startEmulator(t, Config{})
	addr, ok := em.Addr().(*net.TCPAddr)
	require.True(t, ok)
	assert.True(t, addr.IP.IsLoopback())
	assert.NotZero(t, addr.Port)
	assert.Equal(t,
		"Endpoint=sb://"+addr.String()+";SharedAccessKeyName="+DefaultKeyName+";SharedAccessKey="+DefaultKey+";UseDevelopmentEmulator=true",
		em.ConnectionString())
	_, ok = em.Broker().Queue(DefaultQueueName)
	assert.True(t, ok, "a default queue exists")
	_, ok = em.Broker().Queue(DefaultQueueName + "/$DeadLetterQueue")
	assert.True(t, ok, "with its dead-letter queue")
}

func TestStartErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"invalid queue", Config{Queues: []broker.QueueConfig{{Name: "a/b"}}}},
		{"duplicate queue", Config{Queues: []broker.QueueConfig{{Name: "a"}, {Name: "A"}}}},
		{"bad address", Config{Addr: "256.0.0.1:http"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			em, err := Start(tc.cfg)
			require.Error(t, err)
			assert.Nil(t, em)
			assert.True(t, strings.HasPrefix(err.Error(), "sbemu: "), err.Error())
		})
	}
}

func TestCloseIsIdempotentAndClosesClients(t *testing.T) {
	em, err := Start(Config{})
	require.NoError(t, err)
	client := newClient(t, em)
	sender := newSender(t, client, "queue")
	sendText(t, sender, "x")

	require.NoError(t, em.Close())
	require.NoError(t, em.Close())
	_, err = net.Dial("tcp", em.Addr().String())
	assert.Error(t, err, "no longer listening")

	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	assert.Error(t, sender.SendMessage(ctx, &azservicebus.Message{Body: []byte("y")}, nil), "the connection is gone")
}

func TestLockTokenToDeliveryTagMatchesTheSDK(t *testing.T) {
	token := [16]byte(uuid.MustParse("00112233-4455-6677-8899-aabbccddeeff"))
	tag := lockTokenToDeliveryTag(token)
	// .NET GUID byte order: first three groups little-endian.
	assert.Equal(t, []byte{0x33, 0x22, 0x11, 0x00, 0x55, 0x44, 0x77, 0x66, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}, tag)
	assert.Equal(t, token[:], lockTokenToDeliveryTag([16]byte(tag)), "the swap is its own inverse, as the SDK relies on")
}

func TestLogsNeverContainSecrets(t *testing.T) {
	var logs syncbuf.Buffer
	const key = "super-secret-key-value"
	em := startEmulator(t, Config{
		StrictAuth: true,
		Key:        key,
		Logger:     slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	client := newClient(t, em)
	sendText(t, newSender(t, client, "queue"), "x")

	bad := newClientFromConnectionString(t, strings.Replace(em.ConnectionString(), key, "wrong-key-value", 1))
	require.Error(t, newSender(t, bad, "queue").SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("x")}, nil))

	out := logs.String()
	require.Contains(t, out, "put-token refused", "the refusal is logged")
	for _, secret := range []string{key, "wrong-key-value", "sig=", "SharedAccessSignature sr"} {
		assert.NotContains(t, out, secret)
	}
}
