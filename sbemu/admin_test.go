package sbemu

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
)

// newAdminClient is the one line a test needs to reach the emulator's
// administration API with the real SDK.
func newAdminClient(t testing.TB, em *Emulator) *admin.Client {
	t.Helper()
	ac, err := admin.NewClientFromConnectionString(em.ConnectionString(), em.AdminClientOptions())
	require.NoError(t, err)
	return ac
}

// requireStatus asserts that err is an *azcore.ResponseError with status.
func requireStatus(t *testing.T, err error, status int) {
	t.Helper()
	require.Error(t, err)
	var re *azcore.ResponseError
	require.True(t, errors.As(err, &re), "want *azcore.ResponseError, got %T: %v", err, err)
	assert.Equal(t, status, re.StatusCode, "error: %v", err)
}

func TestAdminQueueLifecycle(t *testing.T) {
	em := startEmulator(t, Config{})
	ac := newAdminClient(t, em)
	ctx := ctxT(t)

	created, err := ac.CreateQueue(ctx, "orders", &admin.CreateQueueOptions{Properties: &admin.QueueProperties{
		LockDuration:                        to.Ptr("PT30S"),
		MaxDeliveryCount:                    to.Ptr(int32(7)),
		RequiresDuplicateDetection:          to.Ptr(true),
		DuplicateDetectionHistoryTimeWindow: to.Ptr("PT20M"),
		DefaultMessageTimeToLive:            to.Ptr("P1D"),
		DeadLetteringOnMessageExpiration:    to.Ptr(true),
		UserMetadata:                        to.Ptr("team=billing"),
	}})
	require.NoError(t, err)
	assert.Equal(t, "orders", created.QueueName)
	assert.Equal(t, "PT30S", *created.LockDuration)
	assert.EqualValues(t, 7, *created.MaxDeliveryCount)
	assert.True(t, *created.RequiresDuplicateDetection)
	assert.Equal(t, "PT20M", *created.DuplicateDetectionHistoryTimeWindow)
	assert.Equal(t, "P1D", *created.DefaultMessageTimeToLive)
	assert.Equal(t, "team=billing", *created.UserMetadata)

	// The broker serves it at once, with the settings given.
	cfg, ok := em.Broker().QueueConfig("orders")
	require.True(t, ok)
	assert.Equal(t, 30*time.Second, cfg.LockDuration)
	assert.Equal(t, 20*time.Minute, cfg.DuplicateDetectionWindow)
	assert.Equal(t, 24*time.Hour, cfg.DefaultTTL)

	_, err = ac.CreateQueue(ctx, "ORDERS", nil)
	requireStatus(t, err, http.StatusConflict)

	got, err := ac.GetQueue(ctx, "orders", nil)
	require.NoError(t, err)
	require.NotNil(t, got)
	assert.EqualValues(t, 7, *got.MaxDeliveryCount)
	assert.Equal(t, admin.EntityStatusActive, *got.Status)

	missing, err := ac.GetQueue(ctx, "nope", nil)
	require.NoError(t, err, "the SDK turns 404 into a nil response")
	assert.Nil(t, missing)

	props := got.QueueProperties
	props.MaxDeliveryCount = to.Ptr(int32(3))
	props.LockDuration = to.Ptr("PT1M")
	updated, err := ac.UpdateQueue(ctx, "orders", props, nil)
	require.NoError(t, err)
	assert.EqualValues(t, 3, *updated.MaxDeliveryCount)
	assert.Equal(t, "PT1M", *updated.LockDuration)
	cfg, _ = em.Broker().QueueConfig("orders")
	assert.Equal(t, 3, cfg.MaxDeliveryCount)

	props.RequiresDuplicateDetection = to.Ptr(false)
	_, err = ac.UpdateQueue(ctx, "orders", props, nil)
	requireStatus(t, err, http.StatusBadRequest)
	_, err = ac.UpdateQueue(ctx, "nope", props, nil)
	requireStatus(t, err, http.StatusNotFound)

	var names []string
	pager := ac.NewListQueuesPager(&admin.ListQueuesOptions{MaxPageSize: 1})
	for pager.More() {
		page, err := pager.NextPage(ctx)
		require.NoError(t, err)
		for _, q := range page.Queues {
			names = append(names, q.QueueName)
		}
	}
	assert.Equal(t, []string{DefaultQueueName, "orders"}, names, "paged one by one")

	_, err = ac.DeleteQueue(ctx, "orders", nil)
	require.NoError(t, err)
	_, ok = em.Broker().Queue("orders")
	assert.False(t, ok)
	_, err = ac.DeleteQueue(ctx, "orders", nil)
	requireStatus(t, err, http.StatusNotFound)
}

func TestAdminQueueRuntimeProperties(t *testing.T) {
	em := startEmulator(t, Config{Queues: []broker.QueueConfig{{Name: "work"}}})
	ac := newAdminClient(t, em)
	client := newClient(t, em)
	ctx := ctxT(t)

	sender := newSender(t, client, "work")
	for _, body := range []string{"a", "b", "c"} {
		sendText(t, sender, body)
	}
	_, err := sender.ScheduleMessages(ctx, []*azservicebus.Message{{Body: []byte("later")}}, time.Now().Add(time.Hour), nil)
	require.NoError(t, err)
	receiver := newReceiver(t, client, "work", nil)
	msg := receiveOne(t, receiver)
	require.NoError(t, receiver.DeadLetterMessage(ctx, msg, &azservicebus.DeadLetterOptions{Reason: to.Ptr("bad")}))

	rt, err := ac.GetQueueRuntimeProperties(ctx, "work", nil)
	require.NoError(t, err)
	require.NotNil(t, rt)
	assert.EqualValues(t, 2, rt.ActiveMessageCount)
	assert.EqualValues(t, 1, rt.ScheduledMessageCount)
	assert.EqualValues(t, 1, rt.DeadLetterMessageCount)
	assert.EqualValues(t, 0, rt.TransferMessageCount)
	assert.EqualValues(t, 0, rt.TransferDeadLetterMessageCount)
	assert.EqualValues(t, 4, rt.TotalMessageCount)
	assert.Positive(t, rt.SizeInBytes)
	assert.False(t, rt.CreatedAt.IsZero())

	var listed []admin.QueueRuntimePropertiesItem
	pager := ac.NewListQueuesRuntimePropertiesPager(nil)
	for pager.More() {
		page, err := pager.NextPage(ctx)
		require.NoError(t, err)
		listed = append(listed, page.QueueRuntimeProperties...)
	}
	require.Len(t, listed, 1)
	assert.EqualValues(t, 1, listed[0].DeadLetterMessageCount)

	missing, err := ac.GetQueueRuntimeProperties(ctx, "nope", nil)
	require.NoError(t, err)
	assert.Nil(t, missing)

}

// TestAdminDeleteQueueWithLockedMessages: a queue whose messages are locked
// by a receiver is deleted all the same, as on Service Bus (the SDK's live
// test TestAdminClient_GetQueueRuntimeProperties deletes one), and the
// receiver's settlement then fails with the queue gone.
func TestAdminDeleteQueueWithLockedMessages(t *testing.T) {
	em := startEmulator(t, Config{Queues: []broker.QueueConfig{{Name: "work"}}})
	ac := newAdminClient(t, em)
	client := newClient(t, em)
	ctx := ctxT(t)
	sendText(t, newSender(t, client, "work"), "in flight")
	receiver := newReceiver(t, client, "work", nil)
	locked := receiveOne(t, receiver)

	_, err := ac.DeleteQueue(ctx, "work", nil)
	require.NoError(t, err)
	got, err := ac.GetQueue(ctx, "work", nil)
	require.NoError(t, err)
	assert.Nil(t, got, "the queue is gone")
	err = receiver.CompleteMessage(ctx, locked, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "amqp:not-found")
}

func TestAdminTopicsSubscriptionsAndRules(t *testing.T) {
	em := startEmulator(t, Config{Queues: []broker.QueueConfig{{Name: "audit"}}})
	ac := newAdminClient(t, em)
	client := newClient(t, em)
	ctx := ctxT(t)

	_, err := ac.CreateTopic(ctx, "events", &admin.CreateTopicOptions{Properties: &admin.TopicProperties{
		RequiresDuplicateDetection: to.Ptr(true),
	}})
	require.NoError(t, err)
	_, err = ac.CreateTopic(ctx, "events", nil)
	requireStatus(t, err, http.StatusConflict)
	_, err = ac.CreateTopic(ctx, "audit", nil)
	requireStatus(t, err, http.StatusConflict)

	sub, err := ac.CreateSubscription(ctx, "events", "billing", &admin.CreateSubscriptionOptions{Properties: &admin.SubscriptionProperties{
		MaxDeliveryCount: to.Ptr(int32(4)),
		LockDuration:     to.Ptr("PT45S"),
		DefaultRule: &admin.RuleProperties{
			Name:   "invoices",
			Filter: &admin.CorrelationFilter{Subject: to.Ptr("invoice"), ApplicationProperties: map[string]any{"region": "eu"}},
		},
	}})
	require.NoError(t, err)
	assert.EqualValues(t, 4, *sub.MaxDeliveryCount)
	assert.Equal(t, "PT45S", *sub.LockDuration)
	_, err = ac.CreateSubscription(ctx, "events", "all", &admin.CreateSubscriptionOptions{Properties: &admin.SubscriptionProperties{
		ForwardDeadLetteredMessagesTo: to.Ptr("audit"),
	}})
	require.NoError(t, err)
	_, err = ac.CreateSubscription(ctx, "events", "all", nil)
	requireStatus(t, err, http.StatusConflict)
	_, err = ac.CreateSubscription(ctx, "nope", "x", nil)
	requireStatus(t, err, http.StatusNotFound)

	got, err := ac.GetSubscription(ctx, "events", "all", nil)
	require.NoError(t, err)
	require.NotNil(t, got)
	assert.Contains(t, *got.ForwardDeadLetteredMessagesTo, "/audit")
	// What GetSubscription reports can be sent back as an update: the
	// forwarding URL it reports names the same target.
	subProps := got.SubscriptionProperties
	subProps.MaxDeliveryCount = to.Ptr(int32(20))
	updatedSub, err := ac.UpdateSubscription(ctx, "events", "all", subProps, nil)
	require.NoError(t, err)
	assert.EqualValues(t, 20, *updatedSub.MaxDeliveryCount)
	subProps.ForwardDeadLetteredMessagesTo = nil
	_, err = ac.UpdateSubscription(ctx, "events", "all", subProps, nil)
	requireStatus(t, err, http.StatusBadRequest)

	topic, err := ac.GetTopic(ctx, "events", nil)
	require.NoError(t, err)
	topicProps := topic.TopicProperties
	topicProps.DefaultMessageTimeToLive = to.Ptr("PT1H")
	updatedTopic, err := ac.UpdateTopic(ctx, "events", topicProps, nil)
	require.NoError(t, err)
	assert.Equal(t, "PT1H", *updatedTopic.DefaultMessageTimeToLive)
	assert.True(t, *updatedTopic.RequiresDuplicateDetection)

	// Rules: list, add, get, update, delete.
	rule, err := ac.GetRule(ctx, "events", "billing", "invoices", nil)
	require.NoError(t, err)
	require.NotNil(t, rule)
	cf, ok := rule.Filter.(*admin.CorrelationFilter)
	require.True(t, ok, "filter %T", rule.Filter)
	assert.Equal(t, "invoice", *cf.Subject)
	assert.Equal(t, map[string]any{"region": "eu"}, cf.ApplicationProperties)

	_, err = ac.CreateRule(ctx, "events", "billing", &admin.CreateRuleOptions{
		Name:   to.Ptr("urgent"),
		Filter: &admin.SQLFilter{Expression: "priority > 2"},
		Action: &admin.SQLAction{Expression: "SET routed = 'urgent'"},
	})
	require.NoError(t, err)
	_, err = ac.CreateRule(ctx, "events", "billing", &admin.CreateRuleOptions{Name: to.Ptr("urgent")})
	requireStatus(t, err, http.StatusConflict)
	_, err = ac.CreateRule(ctx, "events", "billing", &admin.CreateRuleOptions{Name: to.Ptr("broken"), Filter: &admin.SQLFilter{Expression: "x ="}})
	requireStatus(t, err, http.StatusBadRequest)

	var ruleNames []string
	rules := ac.NewListRulesPager("events", "billing", nil)
	for rules.More() {
		page, err := rules.NextPage(ctx)
		require.NoError(t, err)
		for _, r := range page.Rules {
			ruleNames = append(ruleNames, r.Name)
		}
	}
	assert.Equal(t, []string{"invoices", "urgent"}, ruleNames)

	urgent, err := ac.GetRule(ctx, "events", "billing", "urgent", nil)
	require.NoError(t, err)
	assert.Equal(t, &admin.SQLFilter{Expression: "priority > 2"}, urgent.Filter)
	assert.Equal(t, &admin.SQLAction{Expression: "SET routed = 'urgent'"}, urgent.Action)
	_, err = ac.UpdateRule(ctx, "events", "billing", admin.RuleProperties{Name: "urgent", Filter: &admin.SQLFilter{Expression: "priority > 5"}})
	require.NoError(t, err)
	urgent, err = ac.GetRule(ctx, "events", "billing", "urgent", nil)
	require.NoError(t, err)
	assert.Equal(t, &admin.SQLFilter{Expression: "priority > 5"}, urgent.Filter)
	assert.Nil(t, urgent.Action)
	def, err := ac.GetRule(ctx, "events", "all", "$Default", nil)
	require.NoError(t, err)
	assert.IsType(t, &admin.TrueFilter{}, def.Filter)

	// The rules route messages through the broker.
	sender := newSender(t, client, "events")
	require.NoError(t, sender.SendMessage(ctx, &azservicebus.Message{Body: []byte("x"), Subject: to.Ptr("invoice"),
		ApplicationProperties: map[string]any{"region": "eu"}}, nil))
	require.NoError(t, sender.SendMessage(ctx, &azservicebus.Message{Body: []byte("y"), Subject: to.Ptr("other")}, nil))
	_, err = sender.ScheduleMessages(ctx, []*azservicebus.Message{{Body: []byte("z")}}, time.Now().Add(time.Hour), nil)
	require.NoError(t, err)

	rt, err := ac.GetSubscriptionRuntimeProperties(ctx, "events", "billing", nil)
	require.NoError(t, err)
	assert.EqualValues(t, 1, rt.ActiveMessageCount)
	rt, err = ac.GetSubscriptionRuntimeProperties(ctx, "events", "all", nil)
	require.NoError(t, err)
	assert.EqualValues(t, 2, rt.ActiveMessageCount)
	assert.EqualValues(t, 2, rt.TotalMessageCount)
	trt, err := ac.GetTopicRuntimeProperties(ctx, "events", nil)
	require.NoError(t, err)
	assert.EqualValues(t, 1, trt.ScheduledMessageCount, "scheduled messages wait in the topic")
	assert.EqualValues(t, 2, trt.SubscriptionCount)
	assert.EqualValues(t, 1, trt.SQLFilterCount+trt.CorrelationFilterCount-2, "invoices and urgent on billing, $Default on all")

	// Dead-letter one on the subscription: its count moves.
	receiver, err := client.NewReceiverForSubscription("events", "billing", nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = receiver.Close(ctxT(t)) })
	msg := receiveOne(t, receiver)
	require.NoError(t, receiver.DeadLetterMessage(ctx, msg, nil))
	rt, err = ac.GetSubscriptionRuntimeProperties(ctx, "events", "billing", nil)
	require.NoError(t, err)
	assert.EqualValues(t, 1, rt.DeadLetterMessageCount)
	assert.EqualValues(t, 0, rt.ActiveMessageCount)

	subRuntime := map[string]int32{}
	srp := ac.NewListSubscriptionsRuntimePropertiesPager("events", nil)
	for srp.More() {
		page, err := srp.NextPage(ctx)
		require.NoError(t, err)
		for _, s := range page.SubscriptionRuntimeProperties {
			subRuntime[s.SubscriptionName] = s.DeadLetterMessageCount
		}
	}
	assert.Equal(t, map[string]int32{"billing": 1, "all": 0}, subRuntime)
	trp := ac.NewListTopicsRuntimePropertiesPager(nil)
	require.True(t, trp.More())
	topicPage, err := trp.NextPage(ctx)
	require.NoError(t, err)
	require.Len(t, topicPage.TopicRuntimeProperties, 1)
	assert.EqualValues(t, 1, topicPage.TopicRuntimeProperties[0].ScheduledMessageCount)

	var subNames []string
	subs := ac.NewListSubscriptionsPager("events", nil)
	for subs.More() {
		page, err := subs.NextPage(ctx)
		require.NoError(t, err)
		for _, s := range page.Subscriptions {
			subNames = append(subNames, s.SubscriptionName)
		}
	}
	assert.Equal(t, []string{"billing", "all"}, subNames)

	var topics []string
	tp := ac.NewListTopicsPager(nil)
	for tp.More() {
		page, err := tp.NextPage(ctx)
		require.NoError(t, err)
		for _, tt := range page.Topics {
			topics = append(topics, tt.TopicName)
		}
	}
	assert.Equal(t, []string{"events"}, topics)

	// Deletion: rules, subscriptions, then the topic.
	_, err = ac.DeleteRule(ctx, "events", "billing", "urgent", nil)
	require.NoError(t, err)
	_, err = ac.DeleteRule(ctx, "events", "billing", "urgent", nil)
	requireStatus(t, err, http.StatusNotFound)
	_, err = ac.DeleteQueue(ctx, "audit", nil)
	requireStatus(t, err, http.StatusConflict)
	assert.Contains(t, err.Error(), "forwards to")
	_, err = ac.DeleteSubscription(ctx, "events", "all", nil)
	require.NoError(t, err)
	_, err = ac.DeleteQueue(ctx, "audit", nil)
	require.NoError(t, err)
	_, err = ac.DeleteTopic(ctx, "events", nil)
	require.NoError(t, err)
	gone, err := ac.GetTopic(ctx, "events", nil)
	require.NoError(t, err)
	assert.Nil(t, gone)
}

func TestAdminNamespaceProperties(t *testing.T) {
	em := startEmulator(t, Config{})
	ac := newAdminClient(t, em)
	props, err := ac.GetNamespaceProperties(ctxT(t), nil)
	require.NoError(t, err)
	assert.Equal(t, "Standard", props.SKU)
	assert.False(t, props.CreatedTime.IsZero())
}

func TestAdminStrictAuth(t *testing.T) {
	em := startEmulator(t, Config{StrictAuth: true})
	ac := newAdminClient(t, em)
	_, err := ac.GetQueue(ctxT(t), DefaultQueueName, nil)
	require.NoError(t, err, "the SDK signs with the connection string's key")

	wrong := "Endpoint=sb://" + em.Addr().String() + ";SharedAccessKeyName=" + DefaultKeyName + ";SharedAccessKey=wrong;UseDevelopmentEmulator=true"
	bad, err := admin.NewClientFromConnectionString(wrong, em.AdminClientOptions())
	require.NoError(t, err)
	_, err = bad.GetQueue(ctxT(t), DefaultQueueName, nil)
	requireStatus(t, err, http.StatusUnauthorized)
	assert.NotContains(t, err.Error(), "wrong")

	req, err := http.NewRequestWithContext(ctxT(t), http.MethodGet, em.AdminEndpoint()+DefaultQueueName, nil)
	require.NoError(t, err)
	resp, err := em.AdminHTTPClient().Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "no Authorization header")
}

func TestAdminCertificateIsTrustedOnlyWithTheEmulatorsPool(t *testing.T) {
	em := startEmulator(t, Config{})
	req, err := http.NewRequestWithContext(ctxT(t), http.MethodGet, em.AdminEndpoint()+"$namespaceinfo", nil)
	require.NoError(t, err)
	plain := &http.Client{Transport: &http.Transport{}}
	defer plain.CloseIdleConnections()
	_, err = plain.Do(req)
	require.Error(t, err, "a self-signed certificate is not trusted by default")

	resp, err := em.AdminHTTPClient().Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

func TestFormatISODuration(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{0, "PT0S"}, {30 * time.Second, "PT30S"}, {time.Minute, "PT1M"}, {90 * time.Minute, "PT1H30M"},
		{14 * 24 * time.Hour, "P14D"}, {36 * time.Hour, "P1DT12H"}, {500 * time.Millisecond, "PT0.5S"},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			assert.Equal(t, tc.want, formatISODuration(tc.d))
			back, err := parseISODuration(tc.want)
			require.NoError(t, err)
			assert.Equal(t, tc.d, back)
		})
	}
}

// TestAdminInMemoryInsideSynctest reaches the admin API of an in-memory
// emulator inside a testing/synctest bubble: TLS over a pipe, no socket, and
// the counts read before and after a scheduled message falls due an hour
// later in fake time.
func TestAdminInMemoryInsideSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		em, err := Start(Config{InMemory: true})
		require.NoError(t, err)
		defer func() { require.NoError(t, em.Close()) }()
		assert.Equal(t, "https://"+InMemoryHost+"/", em.AdminEndpoint())
		ac := newAdminClient(t, em)
		ctx := context.Background()

		_, err = ac.CreateQueue(ctx, "later", nil)
		require.NoError(t, err)
		client := newInMemoryClient(t, em)
		defer func() { _ = client.Close(ctx) }()
		sender, err := client.NewSender("later", nil)
		require.NoError(t, err)
		defer func() { _ = sender.Close(ctx) }()
		_, err = sender.ScheduleMessages(ctx, []*azservicebus.Message{{Body: []byte("x")}}, time.Now().Add(time.Hour), nil)
		require.NoError(t, err)

		rt, err := ac.GetQueueRuntimeProperties(ctx, "later", nil)
		require.NoError(t, err)
		assert.EqualValues(t, 1, rt.ScheduledMessageCount)
		// The receive returns when the message is due, an hour later in the
		// bubble's fake time; nothing waits for real time.
		receiver, err := client.NewReceiverForQueue("later", nil)
		require.NoError(t, err)
		defer func() { _ = receiver.Close(ctx) }()
		start := time.Now()
		msgs, err := receiver.ReceiveMessages(ctx, 1, nil)
		require.NoError(t, err)
		require.Len(t, msgs, 1)
		assert.GreaterOrEqual(t, time.Since(start), time.Hour-time.Second)
		rt, err = ac.GetQueueRuntimeProperties(ctx, "later", nil)
		require.NoError(t, err)
		assert.EqualValues(t, 0, rt.ScheduledMessageCount)
		assert.EqualValues(t, 1, rt.ActiveMessageCount, "locked messages count as active")
	})
}

// TestAdminDeleteWhileLinksAreOpen: a sender attached before its queue is
// deleted is refused afterwards (the SDK then re-attaches and is told the
// entity does not exist), and a new receiver is refused at its put-token,
// as for any unknown entity.
func TestAdminDeleteWhileLinksAreOpen(t *testing.T) {
	em := startEmulator(t, Config{Queues: []broker.QueueConfig{{Name: "doomed"}}})
	ac := newAdminClient(t, em)
	client := newClient(t, em)
	ctx := ctxT(t)
	sender := newSender(t, client, "doomed")
	sendText(t, sender, "before")

	_, err := ac.DeleteQueue(ctx, "doomed", nil)
	require.NoError(t, err)
	err = sender.SendMessage(ctx, &azservicebus.Message{Body: []byte("after")}, nil)
	require.Error(t, err, "the send is refused and the SDK's re-attach finds no entity")
	assert.Contains(t, err.Error(), "could not be found")

	receiver, err := client.NewReceiverForQueue("doomed", nil)
	require.NoError(t, err)
	defer func() { _ = receiver.Close(ctx) }()
	_, err = receiver.ReceiveMessages(ctx, 1, nil)
	requireCode(t, err, azservicebus.CodeNotFound)
}

func TestAudienceCovers(t *testing.T) {
	tests := []struct {
		name               string
		audience, resource string
		want               bool
	}{
		{"the request URL itself", "https://ns:5672/orders?api-version=2024-05", "https://ns:5672/orders", true},
		{"a namespace token", "sb://ns:5672/", "https://ns:5672/orders", true},
		{"a parent entity", "https://ns/events", "https://ns/events/Subscriptions/billing", true},
		{"case is ignored", "HTTPS://NS/Orders", "https://ns/orders", true},
		{"a sibling", "https://ns/orders", "https://ns/orders2", false},
		{"another namespace", "https://other/", "https://ns/orders", false},
		{"empty", "", "https://ns/orders", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, audienceCovers(tc.audience, tc.resource))
		})
	}
}

// TestAdminHealthProbe: GET /health without credentials answers 200, as
// Microsoft's emulator does; a signed request for /health still reaches an
// entity named "health".
func TestAdminHealthProbe(t *testing.T) {
	em := startEmulator(t, Config{StrictAuth: true, Queues: []broker.QueueConfig{{Name: "health"}}})
	hc := em.AdminHTTPClient()
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		req, err := http.NewRequestWithContext(ctxT(t), method, em.AdminEndpoint()+"health", nil)
		require.NoError(t, err)
		resp, err := hc.Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		assert.Equal(t, http.StatusOK, resp.StatusCode, method)
		if method == http.MethodGet {
			assert.Equal(t, "Healthy\n", string(body))
		}
	}

	q, err := newAdminClient(t, em).GetQueue(ctxT(t), "health", nil)
	require.NoError(t, err)
	require.NotNil(t, q, "the SDK's signed GET /health is the queue")
	assert.Equal(t, "health", q.QueueName)
}

// TestAdminRuleParameters: a rule's SQL filter and action parameters are
// kept, reported as given, and used: the filter selects by them and the
// action sets them (the SDK's live test TestAdminClient_CreateRules
// writes such rules); a filter naming a parameter it lacks is refused.
func TestAdminRuleParameters(t *testing.T) {
	em := startEmulator(t, Config{Topics: []broker.TopicConfig{{Name: "events", Subscriptions: []broker.SubscriptionConfig{{Name: "eu", Rules: []broker.RuleConfig{{Name: "none", SQLFilter: "1=0"}}}}}}})
	ac := newAdminClient(t, em)
	ctx := ctxT(t)
	at := time.Date(2001, 1, 1, 1, 2, 3, 0, time.UTC)
	filter := &admin.SQLFilter{Expression: "region = @region AND amount > @min", Parameters: map[string]any{"@region": "eu", "@min": int64(10), "@ratio": 0.5, "@on": true, "@at": at}}
	action := &admin.SQLAction{Expression: "SET routed = @to SET sys.Label = @label", Parameters: map[string]any{"@to": "eu-desk", "@label": "routed"}}
	_, err := ac.CreateRule(ctx, "events", "eu", &admin.CreateRuleOptions{Name: to.Ptr("by-region"), Filter: filter, Action: action})
	require.NoError(t, err)
	got, err := ac.GetRule(ctx, "events", "eu", "by-region", nil)
	require.NoError(t, err)
	assert.Equal(t, filter, got.Filter)
	assert.Equal(t, action, got.Action)

	client := newClient(t, em)
	sender := newSender(t, client, "events")
	for _, m := range []*azservicebus.Message{
		{Body: []byte("small"), ApplicationProperties: map[string]any{"region": "eu", "amount": 5}},
		{Body: []byte("us"), ApplicationProperties: map[string]any{"region": "us", "amount": 50}},
		{Body: []byte("match"), ApplicationProperties: map[string]any{"region": "eu", "amount": 50}},
	} {
		require.NoError(t, sender.SendMessage(ctx, m, nil))
	}
	r := newSubscriptionReceiver(t, client, "events", "eu", nil)
	msg := receiveOne(t, r)
	assert.Equal(t, "match", string(msg.Body))
	assert.Equal(t, "eu-desk", msg.ApplicationProperties["routed"])
	assert.Equal(t, "routed", *msg.Subject)
	require.NoError(t, r.CompleteMessage(ctx, msg, nil))

	_, err = ac.CreateRule(ctx, "events", "eu", &admin.CreateRuleOptions{Name: to.Ptr("broken"), Filter: &admin.SQLFilter{Expression: "region = @nowhere"}})
	requireStatus(t, err, http.StatusBadRequest)
}
