package sbemu

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

// signSAS builds a token the way the SDK's sas package does.
func signSAS(audience, keyName, key string, expiry time.Time) string {
	sr := strings.ToLower(url.QueryEscape(audience))
	se := fmt.Sprint(expiry.Unix())
	mac := hmac.New(sha256.New, []byte(key))
	mac.Write([]byte(sr + "\n" + se))
	sig := url.QueryEscape(base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	return fmt.Sprintf("SharedAccessSignature sr=%s&sig=%s&se=%s&skn=%s", sr, sig, se, keyName)
}

func TestVerifySAS(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	const aud = "amqp://127.0.0.1:5672/orders"
	tests := []struct {
		name    string
		token   string
		wantErr string
	}{
		{"valid", signSAS(aud, "root", "secret", now.Add(time.Hour)), ""},
		{"wrong key", signSAS(aud, "root", "other", now.Add(time.Hour)), "does not match"},
		{"wrong key name", signSAS(aud, "someone", "secret", now.Add(time.Hour)), "unknown key name"},
		{"expired", signSAS(aud, "root", "secret", now.Add(-time.Second)), "ExpiredToken: The token is expired. Expiration time: '2023-11-14T22:13:19Z'"},
		{"other audience", signSAS("amqp://127.0.0.1:5672/other", "root", "secret", now.Add(time.Hour)), "different audience"},
		{"namespace token", signSAS("sb://127.0.0.1:5672/", "root", "secret", now.Add(time.Hour)), ""},
		{"bare host, as the SDK's SAS helper signs it", signSAS("127.0.0.1:5672", "root", "secret", now.Add(time.Hour)), ""},
		{"a name that merely starts the same", signSAS("sb://127.0.0.1:5672/ord", "root", "secret", now.Add(time.Hour)), "different audience"},
		{"a child of the resource", signSAS(aud+"/$management", "root", "secret", now.Add(time.Hour)), "different audience"},
		{"another namespace", signSAS("sb://127.0.0.2:5672/", "root", "secret", now.Add(time.Hour)), "different audience"},
		{"not a SAS", "Bearer abc", "not a SharedAccessSignature"},
		{"missing fields", "SharedAccessSignature sr=x&se=1", "lacks"},
		{"malformed field", "SharedAccessSignature sr", "malformed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := verifySAS(tc.token, "root", "secret", aud, now)
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
			assert.NotContains(t, err.Error(), "secret", "errors never echo the key")
			assert.Contains(t, err.Error(), "sbemu: ")
		})
	}
}

func TestSDKStrictAuthAcceptsTheRightKey(t *testing.T) {
	em := startEmulator(t, Config{StrictAuth: true, KeyName: "app", Key: "correct-horse"})
	client := newClient(t, em)
	sendText(t, newSender(t, client, "queue"), "authorized")
	receiver := newReceiver(t, client, "queue", nil)
	require.NoError(t, receiver.CompleteMessage(ctxT(t), receiveOne(t, receiver), nil))
}

func TestSDKStrictAuthRejectsWrongKey(t *testing.T) {
	em := startEmulator(t, Config{StrictAuth: true, KeyName: "app", Key: "correct-horse"})
	cs := strings.Replace(em.ConnectionString(), "SharedAccessKey=correct-horse", "SharedAccessKey=battery-staple", 1)
	require.NotEqual(t, em.ConnectionString(), cs)
	client := newClientFromConnectionString(t, cs)

	err := newSender(t, client, "queue").SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("x")}, nil)
	requireCode(t, err, azservicebus.CodeUnauthorizedAccess)

	_, err = newReceiver(t, client, "queue", nil).ReceiveMessages(ctxT(t), 1, nil)
	requireCode(t, err, azservicebus.CodeUnauthorizedAccess)

	q, _ := em.Broker().Queue("queue")
	assert.Zero(t, q.Stats().Active, "nothing was stored")
}

func TestSDKLaxAuthAcceptsAnyKey(t *testing.T) {
	em := startEmulator(t, Config{KeyName: "app", Key: "correct-horse"})
	cs := strings.Replace(em.ConnectionString(), "SharedAccessKey=correct-horse", "SharedAccessKey=anything", 1)
	client := newClientFromConnectionString(t, cs)
	sendText(t, newSender(t, client, "queue"), "fine")
}

// TestStrictAuthRefusesAttachWithoutToken checks that, with StrictAuth, a
// connection that never presented a token cannot attach to any entity: a
// queue, its dead-letter queue, a topic, a subscription or a management
// node.
func TestStrictAuthRefusesAttachWithoutToken(t *testing.T) {
	em := startEmulator(t, Config{
		StrictAuth: true,
		Queues:     []broker.QueueConfig{{Name: "q"}},
		Topics:     []broker.TopicConfig{{Name: "t", Subscriptions: []broker.SubscriptionConfig{{Name: "s"}}}},
	})
	session := dialAMQP(t, em)
	for _, addr := range []string{"q", "q/$DeadLetterQueue", "t/Subscriptions/s", "q/$management"} {
		_, err := session.NewReceiver(ctxT(t), addr, nil)
		var refused *amqp.Error
		require.ErrorAs(t, err, &refused, addr)
		assert.Equal(t, amqp.ErrCond(condUnauthorized), refused.Condition, addr)
	}
	_, err := session.NewSender(ctxT(t), "t", nil)
	var refused *amqp.Error
	require.ErrorAs(t, err, &refused)
	assert.Equal(t, amqp.ErrCond(condUnauthorized), refused.Condition)
}

// TestSDKStrictAuthTopics sends to a topic and receives from a
// subscription with verified tokens: the SDK asks for a token per entity
// path, subscriptions included.
func TestSDKStrictAuthTopics(t *testing.T) {
	em := startEmulator(t, Config{StrictAuth: true, KeyName: "app", Key: "correct-horse",
		Topics: []broker.TopicConfig{{Name: "t", Subscriptions: []broker.SubscriptionConfig{{Name: "s"}}}}})
	client := newClient(t, em)
	sendText(t, newSender(t, client, "t"), "authorized")
	r := newSubscriptionReceiver(t, client, "t", "s", nil)
	require.NoError(t, r.CompleteMessage(ctxT(t), receiveOne(t, r), nil))
}

// sasConnectionString is a connection string carrying a ready-made token,
// as users get them from a token service: the SDK presents that token,
// unchanged, for every entity (azservicebus v1.11.0 internal/sas,
// TokenProviderWithSAS).
func sasConnectionString(em *Emulator, token string) string {
	return "Endpoint=sb://" + em.Addr().String() + ";SharedAccessSignature=" + token + ";UseDevelopmentEmulator=true"
}

// signSASAsIs signs sr exactly as given (escaped but not lower-cased, unlike
// the SDK's signer), for audiences whose case matters to the test.
func signSASAsIs(audience, keyName, key string, expiry time.Time) string {
	sr := url.QueryEscape(audience)
	se := fmt.Sprint(expiry.Unix())
	mac := hmac.New(sha256.New, []byte(key))
	mac.Write([]byte(sr + "\n" + se))
	sig := url.QueryEscape(base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	return fmt.Sprintf("SharedAccessSignature sr=%s&sig=%s&se=%s&skn=%s", sr, sig, se, keyName)
}

// TestSDKStrictAuthAcceptsANamespaceToken gives the SDK a
// "SharedAccessSignature=" connection string whose token is for the whole
// namespace (sr=sb://host/): Service Bus accepts a token for any prefix of
// the resource, so sending, receiving, settling and reading a queue's and
// a subscription's dead-letter queue all work. Before, every put-token was
// refused with "different audience".
func TestSDKStrictAuthAcceptsANamespaceToken(t *testing.T) {
	em := startEmulator(t, Config{StrictAuth: true, KeyName: "app", Key: "correct-horse",
		Queues: []broker.QueueConfig{{Name: "orders"}},
		Topics: []broker.TopicConfig{{Name: "events", Subscriptions: []broker.SubscriptionConfig{{Name: "billing"}}}}})
	token := signSAS("sb://"+em.Addr().String()+"/", "app", "correct-horse", time.Now().Add(time.Hour))
	client := newClientFromConnectionString(t, sasConnectionString(em, token))

	sendText(t, newSender(t, client, "orders"), "to the queue")
	r := newReceiver(t, client, "orders", nil)
	require.NoError(t, r.DeadLetterMessage(ctxT(t), receiveOne(t, r), nil))
	dlq := newReceiver(t, client, "orders", &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	require.NoError(t, dlq.CompleteMessage(ctxT(t), receiveOne(t, dlq), nil))

	sendText(t, newSender(t, client, "events"), "to the topic")
	sub := newSubscriptionReceiver(t, client, "events", "billing", nil)
	require.NoError(t, sub.CompleteMessage(ctxT(t), receiveOne(t, sub), nil))
}

// TestSDKStrictAuthEntityTokenCoversOnlyItsEntity checks that prefixes are
// matched by path segment and without regard to case: a token for
// sb://host/Orders is good for "orders" (and its dead-letter queue) but not
// for "orders2", whose name merely starts with the same letters.
func TestSDKStrictAuthEntityTokenCoversOnlyItsEntity(t *testing.T) {
	em := startEmulator(t, Config{StrictAuth: true, KeyName: "app", Key: "correct-horse",
		Queues: []broker.QueueConfig{{Name: "orders"}, {Name: "orders2"}}})
	token := signSASAsIs("sb://"+em.Addr().String()+"/Orders", "app", "correct-horse", time.Now().Add(time.Hour))
	client := newClientFromConnectionString(t, sasConnectionString(em, token))

	sendText(t, newSender(t, client, "orders"), "mine")
	dlq := newReceiver(t, client, "orders", &azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter})
	_, err := dlq.PeekMessages(ctxT(t), 1, nil)
	require.NoError(t, err, "the dead-letter queue lies under the token's entity")

	err = newSender(t, client, "orders2").SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("not mine")}, nil)
	requireCode(t, err, azservicebus.CodeUnauthorizedAccess)
	q, _ := em.Broker().Queue("orders2")
	assert.Zero(t, q.Stats().Active)
}

// FuzzVerifySAS feeds arbitrary tokens and resources to the checker: it
// never panics, never accepts a token it did not sign with the key, and
// never echoes the key or a signature in its error.
func FuzzVerifySAS(f *testing.F) {
	now := time.Unix(1_700_000_000, 0)
	f.Add(signSAS("sb://ns/", "root", "secret", now.Add(time.Hour)), "amqp://ns/orders")
	f.Add("SharedAccessSignature sr=%zz&sig=%&se=-1&skn=root", "")
	f.Add("SharedAccessSignature sr=a&sig=b&se=99999999999999999999&skn=root&&", "/")
	f.Fuzz(func(t *testing.T, token, resource string) {
		_, err := verifySAS(token, "root", "secret", resource, now)
		if err == nil {
			return
		}
		assert.NotContains(t, err.Error(), "secret")
		// The key name is echoed (it is not a secret), so a signature that
		// happens to occur in it is not a leak.
		if _, sig, ok := strings.Cut(token, "sig="); ok && !strings.Contains(err.Error(), "unknown key name") {
			sig, _, _ = strings.Cut(sig, "&")
			if len(sig) > 8 {
				assert.NotContains(t, err.Error(), sig)
			}
		}
	})
}
