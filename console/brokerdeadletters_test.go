package console

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
)

// TestBrokerDeadLetters: messages Service Bus dead-letters itself carry none of the retry library's
// metadata. The emulator makes both kinds the service makes: a message abandoned until it runs out of
// deliveries (MaxDeliveryCount 2: MaxDeliveryCountExceeded) and one whose time to live passes in a
// queue that dead-letters on expiration (TTLExpiredException), each with the broker's description.
// The console groups them by the broker's reason and description, says Service Bus dead-lettered them,
// filters them by reason, and redrives them like its own: fresh first deliveries with the body and the
// properties, no time to live, gone from the dead-letter queue.
func TestBrokerDeadLetters(t *testing.T) {
	t.Parallel()
	mock := clock.NewMock()
	mock.Set(time.Now())
	em := sbemu.StartT(t, sbemu.Config{Clock: mock, Queues: []broker.QueueConfig{{
		Name: sbtest.Queue, MaxDeliveryCount: 2, DeadLetterOnExpiration: true, DuplicateDetectionWindow: 10 * time.Minute,
	}}})
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), &azservicebus.ClientOptions{RetryOptions: sbtest.FastRetries})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), sbtest.Timeout)
		defer cancel()
		_ = client.Close(ctx)
	})
	h := &sbtest.Harness{Em: em, Client: client, Entity: sbtest.Queue, SendTo: sbtest.Queue}
	ctx := sbtest.Context(t)
	q, ok := em.Broker().Queue(sbtest.Queue)
	require.True(t, ok)

	// Two messages abandoned until the broker dead-letters them.
	mdc := []*azservicebus.Message{sbtest.Message("mdc-1"), sbtest.Message("mdc-2")}
	for _, m := range mdc {
		m.ApplicationProperties = map[string]any{"tenant": "acme"}
	}
	h.Send(t, mdc...)
	r, err := client.NewReceiverForQueue(sbtest.Queue, nil)
	require.NoError(t, err)
	for delivery := 1; delivery <= 2; delivery++ {
		var got []*azservicebus.ReceivedMessage
		for len(got) < 2 {
			msgs, err := r.ReceiveMessages(ctx, 2-len(got), nil)
			require.NoError(t, err)
			got = append(got, msgs...)
		}
		for _, m := range got {
			assert.Equal(t, uint32(delivery), m.DeliveryCount)
			require.NoError(t, r.AbandonMessage(ctx, m, nil))
		}
	}
	require.NoError(t, r.Close(ctx))
	// One that expires.
	ttl := time.Minute
	expiring := sbtest.Message("ttl-1")
	expiring.TimeToLive = &ttl
	h.Send(t, expiring)
	mock.Add(2 * time.Minute)
	require.Equal(t, 3, q.Stats().DeadLettered, "the emulator dead-lettered all three")

	in, err := inspect.New(client, sbtest.Queue, nil)
	require.NoError(t, err)
	list, err := in.DeadLetters(ctx, inspect.DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, list.Items, 3)
	for _, d := range list.Items {
		assert.Equal(t, inspect.ByServiceBus, d.DeadLetteredBy(), d.MessageID)
		assert.Empty(t, d.LastError, "no metadata of ours")
		_, ours := d.Message.ApplicationProperties[envelope.PropDeadLetterReason]
		assert.False(t, ours)
	}
	assert.Equal(t, "MaxDeliveryCountExceeded", list.Items[0].Reason)
	assert.Equal(t, "Message could not be consumed after 2 delivery attempts.", list.Items[0].Description)
	assert.Equal(t, "TTLExpiredException", list.Items[2].Reason)

	s := serve(t, h, mustConsole(t, h, nil))
	code, body := s.get(t, "/deadletters?e=orders")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "3 dead letters in 2 failure groups")
	assert.Contains(t, body, `<td class="num">2</td><td>MaxDeliveryCountExceeded</td><td class="by">Service Bus</td>`)
	assert.Contains(t, body, `<td class="num">1</td><td>TTLExpiredException</td><td class="by">Service Bus</td>`)
	assert.Contains(t, body, "Message could not be consumed after &lt;n&gt; delivery attempts.")
	assert.Contains(t, body, "The message expired and was dead lettered.")
	code, body = s.get(t, "/message?e=orders&ref="+url.QueryEscape(list.Items[0].Ref().String()))
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `<td id="dead-lettered-by">Service Bus</td>`)

	// The MaxDeliveryCountExceeded group is redriven as a group.
	groups := s.groups(t)
	require.Len(t, groups, 2)
	code, body = s.get(t, "/group?e=orders&g="+groups[0])
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `id="group-by">Dead-lettered by Service Bus: the broker's own reason`)
	assert.Contains(t, body, "Message could not be consumed after 2 delivery attempts.")
	code, body, digest, refs := s.preview(t, url.Values{"action": {"redrive"}, "g": {groups[0]}})
	require.Equal(t, http.StatusOK, code, body)
	assert.Len(t, refs, 2)
	assert.Contains(t, body, "MaxDeliveryCountExceeded")
	code, body = s.run(t, url.Values{"action": {"redrive"}, "g": {groups[0]}}, digest)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "Resubmitted 2 of 2")

	// The expired one, by a filter on the broker's reason. The group's redrive may have had it
	// delivered to its receiver after its last receive returned (the SDK releases such a message, but
	// a release racing the link's close can leave it locked until its lock expires): the lock duration
	// passes first, on the emulator's clock.
	mock.Add(time.Minute + time.Second)
	code, body, digest, refs = s.preview(t, url.Values{"action": {"redrive"}, "match": {"1"}, "reason": {"ttlexpiredexception"}})
	require.Equal(t, http.StatusOK, code, body)
	require.Len(t, refs, 1)
	code, body = s.run(t, url.Values{"action": {"redrive"}, "ref": refs, "matched": {"reason is ttlexpiredexception"}}, digest)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "Resubmitted 1 of 1")

	// The fresh deliveries: bodies and properties kept, no time to live (the original's has passed),
	// so the time that expired ttl-1 does not expire its redrive.
	mock.Add(2 * time.Minute)
	assert.Equal(t, broker.Stats{Active: 3}, q.Stats())
	r, err = client.NewReceiverForQueue(sbtest.Queue, nil)
	require.NoError(t, err)
	defer func() { _ = r.Close(ctx) }()
	var fresh []*azservicebus.ReceivedMessage
	for len(fresh) < 3 {
		msgs, err := r.ReceiveMessages(ctx, 3-len(fresh), nil)
		require.NoError(t, err)
		fresh = append(fresh, msgs...)
	}
	var ids []string
	for _, m := range fresh {
		ids = append(ids, originalID(m))
		assert.True(t, strings.HasPrefix(m.MessageID, "sbretry-resubmit-"), m.MessageID)
		assert.Equal(t, `{"id":"`+originalID(m)+`"}`, string(m.Body))
		assert.Equal(t, uint32(1), m.DeliveryCount, "a fresh first delivery")
		env, err := envelope.Decode(m)
		require.NoError(t, err)
		assert.Equal(t, 1, env.Redrives)
		if originalID(m) != "ttl-1" {
			assert.Equal(t, "acme", m.ApplicationProperties["tenant"])
		}
	}
	assert.ElementsMatch(t, []string{"mdc-1", "mdc-2", "ttl-1"}, ids)
}

// mustConsole is a console on the harness's entity.
func mustConsole(t *testing.T, h *sbtest.Harness, opts *Options) *Console {
	t.Helper()
	c, err := New(h.Client, entitiesOf(h), opts)
	require.NoError(t, err)
	return c
}
