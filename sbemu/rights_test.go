package sbemu

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

// reducedRights are policies with fewer rights than the root key, as the
// SDK's test namespace has them.
func reducedRights() []AuthorizationRule {
	return []AuthorizationRule{
		{KeyName: "SendOnly", PrimaryKey: "send-key", SecondaryKey: "send-key-2", Rights: []AccessRight{RightSend}},
		{KeyName: "ListenOnly", PrimaryKey: "listen-key", Rights: []AccessRight{RightListen}},
		{KeyName: "ListenAndSend", PrimaryKey: "both-key", Rights: []AccessRight{RightListen, RightSend}},
	}
}

// keyConnectionString is em's connection string with another key.
func keyConnectionString(em *Emulator, keyName, key string) string {
	return "Endpoint=sb://" + em.Addr().String() + ";SharedAccessKeyName=" + keyName + ";SharedAccessKey=" + key + ";UseDevelopmentEmulator=true"
}

func TestStartRefusesBadAuthorizationRules(t *testing.T) {
	tests := []struct {
		name string
		rule AuthorizationRule
		want string
	}{
		{"no key name", AuthorizationRule{PrimaryKey: "k", Rights: []AccessRight{RightSend}}, "empty KeyName"},
		{"the root key's name", AuthorizationRule{KeyName: strings.ToLower(DefaultKeyName), PrimaryKey: "k", Rights: []AccessRight{RightSend}}, "taken"},
		{"no primary key", AuthorizationRule{KeyName: "k", Rights: []AccessRight{RightSend}}, "empty PrimaryKey"},
		{"unknown right", AuthorizationRule{KeyName: "k", PrimaryKey: "k", Rights: []AccessRight{"Own"}}, "unknown access right"},
		{"no rights", AuthorizationRule{KeyName: "k", PrimaryKey: "k"}, "no access rights"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Start(Config{AuthorizationRules: []AuthorizationRule{tc.rule}})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestSDKRightsOfPolicies: under StrictAuth a key with Listen only cannot
// send, one with Send only cannot receive or peek but can schedule, each
// refused in Service Bus's words as CodeUnauthorizedAccess (the SDK's live
// tests TestClientUnauthorizedCreds and TestReceiverUnauthorizedCreds); a
// policy's secondary key works as its primary does.
func TestSDKRightsOfPolicies(t *testing.T) {
	em := startEmulator(t, Config{StrictAuth: true, AuthorizationRules: reducedRights()})
	listen := newClientFromConnectionString(t, keyConnectionString(em, "ListenOnly", "listen-key"))
	send := newClientFromConnectionString(t, keyConnectionString(em, "SendOnly", "send-key-2"))

	err := newSender(t, listen, "queue").SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("x")}, nil)
	requireCode(t, err, azservicebus.CodeUnauthorizedAccess)
	assert.Contains(t, err.Error(), "Description: Unauthorized access. 'Send' claim(s) are required to perform this operation")

	sendText(t, newSender(t, send, "queue"), "sent with Send")
	seqs, err := newSender(t, send, "queue").ScheduleMessages(ctxT(t), []*azservicebus.Message{{Body: []byte("later")}}, time.Now().Add(time.Hour), nil)
	require.NoError(t, err, "scheduling needs Send")
	assert.Len(t, seqs, 1)

	_, err = newReceiver(t, send, "queue", nil).ReceiveMessages(ctxT(t), 1, nil)
	requireCode(t, err, azservicebus.CodeUnauthorizedAccess)
	assert.Contains(t, err.Error(), "Description: Unauthorized access. 'Listen' claim(s) are required to perform this operation")
	_, err = newReceiver(t, send, "queue", nil).PeekMessages(ctxT(t), 1, nil)
	requireCode(t, err, azservicebus.CodeUnauthorizedAccess)

	r := newReceiver(t, listen, "queue", nil)
	msg := receiveOne(t, r)
	assert.Equal(t, "sent with Send", string(msg.Body))
	require.NoError(t, r.CompleteMessage(ctxT(t), msg, nil))
}

// TestSDKExpiredTokenIsRefusedAtPutToken: an expired shared access
// signature is refused at put-token with 401 and Service Bus's
// description, which the SDK reports as CodeUnauthorizedAccess.
func TestSDKExpiredTokenIsRefusedAtPutToken(t *testing.T) {
	em := startEmulator(t, Config{StrictAuth: true})
	expired := signSAS("sb://"+em.Addr().String()+"/", DefaultKeyName, DefaultKey, time.Now().Add(-10*time.Minute))
	client := newClientFromConnectionString(t, sasConnectionString(em, expired))
	err := newSender(t, client, "queue").SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("x")}, nil)
	requireCode(t, err, azservicebus.CodeUnauthorizedAccess)
	assert.Contains(t, err.Error(), "rpc: failed, status code 401 and description: ExpiredToken: The token is expired. Expiration time:")
	_, err = newReceiver(t, client, "queue", nil).ReceiveMessages(ctxT(t), 1, nil)
	requireCode(t, err, azservicebus.CodeUnauthorizedAccess)
}

// putTokenOfType presents a token of tokenType with an expiration, as the
// SDK does for a token credential's JWT, and returns the status.
func putTokenOfType(t *testing.T, session *amqp.Session, name, tokenType string, expiration any) int32 {
	t.Helper()
	reply := amqpRequest(t, session, "$cbs", &amqp.Message{
		ApplicationProperties: map[string]any{"operation": "put-token", "type": tokenType, "name": name, "expiration": expiration},
		Value:                 "eyJhbGciOi.not-a-real.jwt",
	})
	status, _ := reply.ApplicationProperties["status-code"].(int32)
	return status
}

// TestAMQPUnverifiedJWT: StrictAuth refuses a JWT unless
// AcceptUnverifiedJWT, which lets it attach with every right until the
// expiry the client named, and refuses one already expired.
func TestAMQPUnverifiedJWT(t *testing.T) {
	future := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	strict := startEmulator(t, Config{StrictAuth: true})
	name := "amqp://" + strict.Addr().String() + "/queue"
	assert.Equal(t, int32(401), putTokenOfType(t, dialAMQP(t, strict), name, "jwt", future))

	em := startEmulator(t, Config{StrictAuth: true, AcceptUnverifiedJWT: true})
	session := dialAMQP(t, em)
	name = "amqp://" + em.Addr().String() + "/queue"
	assert.Equal(t, int32(401), putTokenOfType(t, session, name, "jwt", "1"), "expired in 1970")
	assert.Equal(t, int32(202), putTokenOfType(t, session, name, "jwt", future))
	sender, err := session.NewSender(ctxT(t), "queue", nil)
	require.NoError(t, err, "the JWT grants Send")
	require.NoError(t, sender.Send(ctxT(t), amqp.NewMessage([]byte("x")), nil))

	// The administration API takes the JWT as the Authorization header's
	// whole value, as the SDK sends it.
	for _, tc := range []struct {
		em   *Emulator
		want int
	}{{strict, http.StatusUnauthorized}, {em, http.StatusOK}} {
		req, err := http.NewRequestWithContext(ctxT(t), http.MethodGet, tc.em.AdminEndpoint()+"queue?api-version=2024-05", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "eyJhbGciOi.not-a-real.jwt")
		resp, err := tc.em.AdminHTTPClient().Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		assert.Equal(t, tc.want, resp.StatusCode)
	}
}

// TestAdminWithoutManage: a key without Manage is refused by the
// administration API in Service Bus's words (the SDK's live tests
// TestAdminClient_LackPermissions_*), but still reads a missing queue as
// missing.
func TestAdminWithoutManage(t *testing.T) {
	em := startEmulator(t, Config{StrictAuth: true, AuthorizationRules: reducedRights(),
		Queues: []broker.QueueConfig{{Name: "q"}}, Topics: []broker.TopicConfig{{Name: "t", Subscriptions: []broker.SubscriptionConfig{{Name: "s"}}}}})
	ac, err := admin.NewClientFromConnectionString(keyConnectionString(em, "ListenAndSend", "both-key"), em.AdminClientOptions())
	require.NoError(t, err)
	ctx := ctxT(t)

	missing, err := ac.GetQueue(ctx, "missing", nil)
	require.NoError(t, err)
	assert.Nil(t, missing)
	_, err = ac.GetQueue(ctx, "q", nil)
	requireStatus(t, err, 401)
	assert.Contains(t, err.Error(), "<Detail>Manage,EntityRead claims required for this operation")
	_, err = ac.NewListQueuesPager(nil).NextPage(ctx)
	requireStatus(t, err, 401)
	_, err = ac.CreateQueue(ctx, "new", nil)
	requireStatus(t, err, 401)
	assert.Contains(t, err.Error(), "Authorization failed for specified action: Manage,EntityWrite")
	_, err = ac.DeleteQueue(ctx, "q", nil)
	requireStatus(t, err, 401)
	assert.Contains(t, err.Error(), "Authorization failed for specified action: Manage,EntityDelete.")
	_, err = ac.GetSubscription(ctx, "t", "missing", nil)
	requireStatus(t, err, 401)
	assert.Contains(t, err.Error(), "401 SubCode=40100: Unauthorized : Unauthorized access for 'GetSubscription'")
	_, err = ac.NewListSubscriptionsPager("t", nil).NextPage(ctx)
	assert.Contains(t, err.Error(), "Unauthorized access for 'EnumerateSubscriptions' operation")

	root := newAdminClient(t, em)
	_, err = root.GetQueue(ctx, "q", nil)
	require.NoError(t, err, "the root key has Manage")
}

// TestAdminEntityAuthorizationRules: a queue's own authorization rules are
// stored and reported as given (keys generated when left out), replaced
// by an update, refused when malformed, and, under StrictAuth, sign tokens
// for that queue only, with their rights.
func TestAdminEntityAuthorizationRules(t *testing.T) {
	em := startEmulator(t, Config{StrictAuth: true, Queues: []broker.QueueConfig{{Name: "other"}}})
	ac := newAdminClient(t, em)
	ctx := ctxT(t)
	rules := []admin.AuthorizationRule{
		{AccessRights: []admin.AccessRight{admin.AccessRightSend}, KeyName: to.Ptr("sender"), PrimaryKey: to.Ptr("entity-key"), SecondaryKey: to.Ptr("entity-key-2")},
		{AccessRights: []admin.AccessRight{admin.AccessRightListen}, KeyName: to.Ptr("generated")},
	}
	created, err := ac.CreateQueue(ctx, "q", &admin.CreateQueueOptions{Properties: &admin.QueueProperties{AuthorizationRules: rules}})
	require.NoError(t, err)
	require.Len(t, created.AuthorizationRules, 2)
	assert.Equal(t, rules[0], created.AuthorizationRules[0], "reported as given, without times")
	assert.NotEmpty(t, *created.AuthorizationRules[1].PrimaryKey, "a key left out is generated")
	assert.NotEqual(t, *created.AuthorizationRules[1].PrimaryKey, *created.AuthorizationRules[1].SecondaryKey)
	got, err := ac.GetQueue(ctx, "q", nil)
	require.NoError(t, err)
	assert.Equal(t, created.AuthorizationRules, got.AuthorizationRules)

	client := newClientFromConnectionString(t, keyConnectionString(em, "sender", "entity-key-2"))
	sendText(t, newSender(t, client, "q"), "signed with the queue's own key")
	_, err = newReceiver(t, client, "q", nil).ReceiveMessages(ctxT(t), 1, nil)
	requireCode(t, err, azservicebus.CodeUnauthorizedAccess)
	err = newSender(t, client, "other").SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("x")}, nil)
	requireCode(t, err, azservicebus.CodeUnauthorizedAccess)

	got.AuthorizationRules = got.AuthorizationRules[1:]
	updated, err := ac.UpdateQueue(ctx, "q", got.QueueProperties, nil)
	require.NoError(t, err)
	assert.Equal(t, got.AuthorizationRules, updated.AuthorizationRules)
	err = newSender(t, newClientFromConnectionString(t, keyConnectionString(em, "sender", "entity-key")), "q").
		SendMessage(ctxT(t), &azservicebus.Message{Body: []byte("x")}, nil)
	requireCode(t, err, azservicebus.CodeUnauthorizedAccess)

	for name, bad := range map[string]admin.AuthorizationRule{
		"unknown right": {AccessRights: []admin.AccessRight{"Own"}, KeyName: to.Ptr("k")},
		"no key name":   {AccessRights: []admin.AccessRight{admin.AccessRightSend}},
		"no rights":     {KeyName: to.Ptr("k")},
	} {
		t.Run(name, func(t *testing.T) {
			props := got.QueueProperties
			props.AuthorizationRules = []admin.AuthorizationRule{bad}
			_, err := ac.UpdateQueue(ctx, "q", props, nil)
			requireStatus(t, err, 400)
		})
	}
}
