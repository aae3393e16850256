package console

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
	"github.com/sbretry/retry/sessionstate"
)

// wakeRoutedTopic is the layout docs/console.md gives for releasing a session subscription's sessions:
// the topic events with the session subscription billing and another subscription, audit. Every
// subscription takes the producers' messages (no sbretry-wake-to); billing also takes the wake-ups
// that name it, and no other subscription takes any wake-up.
func wakeRoutedTopic(billingWakeRule bool) sbemu.Config {
	business := broker.RuleConfig{Name: "business", SQLFilter: "[" + inspect.PropWakeTo + "] IS NULL"}
	billing := []broker.RuleConfig{business}
	if billingWakeRule {
		billing = append(billing, broker.RuleConfig{Name: "wake", CorrelationFilter: &broker.CorrelationFilter{
			Properties: map[string]any{inspect.PropWakeTo: "events/Subscriptions/billing"},
		}})
	}
	return sbemu.Config{Topics: []broker.TopicConfig{{Name: "events", DuplicateDetectionWindow: 10 * time.Minute, Subscriptions: []broker.SubscriptionConfig{
		{Name: "billing", RequiresSession: true, Rules: billing},
		{Name: "audit", Rules: []broker.RuleConfig{business}},
	}}}}
}

// waitForPage fetches path until re matches its body, failing after sbtest.Timeout: the consumer's
// progress is seen through the console as an operator would see it.
func waitForPage(t *testing.T, s *site, path string, re *regexp.Regexp) string {
	t.Helper()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(sbtest.Timeout)
	defer deadline.Stop()
	for {
		code, body := s.get(t, path)
		if code == http.StatusOK && re.MatchString(body) {
			return body
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("%s never matched %s; last:\n%s", path, re, body)
		}
	}
}

// TestReleaseASessionOfASubscription: with the real retry.SessionConsumer on a session subscription
// (BlockAfterDeadLetter), a message dead-lettered blocks its session and the next one is deferred
// behind it; the console, given the subscription's WakeTo, lists the session with a release, previews
// it (the wake-up goes to the topic, naming the subscription), and runs it: the wake-up reaches the
// session, the state is written, and the consumer runs the deferred message. The other subscription
// of the topic gets the producer's messages and never the wake-up. The release is audited.
func TestReleaseASessionOfASubscription(t *testing.T) {
	t.Parallel()
	em := sbemu.StartT(t, wakeRoutedTopic(true))
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), &azservicebus.ClientOptions{RetryOptions: sbtest.FastRetries})
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close(sbtest.Context(t)) })
	ctx := sbtest.Context(t)

	ran := make(chan string, 10)
	handler := func(_ context.Context, m *azservicebus.ReceivedMessage) error {
		ran <- m.MessageID
		if m.MessageID == "d1" {
			return retry.Permanent(errors.New("invalid payload"))
		}
		return nil
	}
	connect, err := retry.NewNamespace(em.ConnectionString(), &retry.ConnectOptions{Client: &azservicebus.ClientOptions{RetryOptions: sbtest.FastRetries}}).SessionSubscription("events", "billing")
	require.NoError(t, err)
	sc, err := retry.NewSessionConsumer(connect, handler, &retry.Options{SettleTimeout: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		&retry.SessionOptions{SessionIdleTimeout: 200 * time.Millisecond, BlockAfterDeadLetter: true})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- sc.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("consumer: %v", err)
		}
	}()

	snd, err := client.NewSender("events", nil)
	require.NoError(t, err)
	sid := "s-1"
	for _, id := range []string{"d1", "d2"} {
		require.NoError(t, snd.SendMessage(ctx, &azservicebus.Message{MessageID: &id, SessionID: &sid, Body: []byte(id)}, nil))
	}
	require.NoError(t, snd.Close(ctx))
	assert.Equal(t, "d1", <-ran)

	const path = "events/Subscriptions/billing"
	c, err := New(client, []Entity{{Path: path, SessionConsumer: true, WakeTo: "events"}}, nil)
	require.NoError(t, err)
	s := serve(t, &sbtest.Harness{Em: em, Client: client, Entity: path}, c)
	// Blocked after d1's dead-letter, d2 deferred behind it, and let go by the consumer.
	body := waitForPage(t, s, "/sessions?e="+url.QueryEscape(path), regexp.MustCompile(`data-session="s-1" data-status="dead-lettered"[\s\S]*?1 message \(seq`))
	assert.Contains(t, body, `value="release"`)
	assert.Contains(t, body, "A release sends its wake-up to events carrying sbretry-wake-to=events/Subscriptions/billing")

	code, body := s.post(t, "/action/preview", url.Values{"csrf": {s.token(t, "/")}, "e": {path}, "action": {"release"}, "session": {sid}})
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `<td id="wake-to">events (a topic: the wake-up carries sbretry-wake-to=events/Subscriptions/billing`)
	digest := digestPattern.FindStringSubmatch(body)
	at := regexp.MustCompile(`name="at" value="(\d+)"`).FindStringSubmatch(body)
	require.NotNil(t, digest)
	require.NotNil(t, at)
	code, body = s.post(t, "/action/run", url.Values{"csrf": {s.token(t, "/")}, "e": {path}, "action": {"release"}, "session": {sid}, "at": {at[1]}, "digest": {digest[1]}})
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "Released session s-1 of events/Subscriptions/billing")

	// The consumer takes the session up and runs the deferred message.
	select {
	case id := <-ran:
		assert.Equal(t, "d2", id)
	case <-time.After(sbtest.Timeout):
		t.Fatal("d2 never ran after the release")
	}
	waitForPage(t, s, "/sessions?e="+url.QueryEscape(path), regexp.MustCompile(`id="no-sessions"`))

	// The other subscription has the producer's two messages, and no wake-up.
	ar, err := client.NewReceiverForSubscription("events", "audit", nil)
	require.NoError(t, err)
	defer func() { _ = ar.Close(ctx) }()
	from := int64(0)
	peeked, err := ar.PeekMessages(ctx, 10, &azservicebus.PeekMessagesOptions{FromSequenceNumber: &from})
	require.NoError(t, err)
	var ids []string
	for _, m := range peeked {
		ids = append(ids, m.MessageID)
	}
	assert.Equal(t, []string{"d1", "d2"}, ids)

	pg, err := c.audit.page(0, 10)
	require.NoError(t, err)
	require.NotEmpty(t, pg.Records)
	assert.Equal(t, AuditDone, pg.Records[0].Outcome)
	assert.Equal(t, sid, pg.Records[0].Session)
}

// TestReleaseOfASubscriptionNeedsTheWakeUpInTheSession: when the topic's rules do not bring the
// wake-up to the subscription, the release writes nothing (the session stays as it was) and says the
// wake-up did not reach the session; without WakeTo, the release is refused before anything is read.
func TestReleaseOfASubscriptionNeedsTheWakeUpInTheSession(t *testing.T) {
	t.Parallel()
	em := sbemu.StartT(t, wakeRoutedTopic(false))
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), &azservicebus.ClientOptions{RetryOptions: sbtest.FastRetries})
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close(sbtest.Context(t)) })
	ctx := sbtest.Context(t)
	sid := "s-1"
	raw := blockSubscriptionSession(t, client, sid)

	const path = "events/Subscriptions/billing"
	c, err := New(client, []Entity{{Path: path, SessionConsumer: true, WakeTo: "events"}}, nil)
	require.NoError(t, err)
	s := serve(t, &sbtest.Harness{Em: em, Client: client, Entity: path}, c)
	code, body := s.post(t, "/action/preview", url.Values{"csrf": {s.token(t, "/")}, "e": {path}, "action": {"release"}, "session": {sid}})
	require.Equal(t, http.StatusOK, code, body)
	digest := digestPattern.FindStringSubmatch(body)
	at := regexp.MustCompile(`name="at" value="(\d+)"`).FindStringSubmatch(body)
	require.NotNil(t, digest)
	code, body = s.post(t, "/action/run", url.Values{"csrf": {s.token(t, "/")}, "e": {path}, "action": {"release"}, "session": {sid}, "at": {at[1]}, "digest": {digest[1]}})
	assert.NotEqual(t, http.StatusOK, code, body)
	assert.Contains(t, body, "did not keep the wake-up")
	r, err := client.AcceptSessionForSubscription(ctx, "events", "billing", sid, nil)
	require.NoError(t, err)
	got, err := r.GetSessionState(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, r.Close(ctx))
	assert.Equal(t, raw, got, "the state is as it was")

	plain, err := New(client, []Entity{{Path: path, SessionConsumer: true}}, nil)
	require.NoError(t, err)
	ps := serve(t, &sbtest.Harness{Em: em, Client: client, Entity: path}, plain)
	code, body = ps.post(t, "/action/preview", url.Values{"csrf": {ps.token(t, "/")}, "e": {path}, "action": {"release"}, "session": {sid}})
	assert.Equal(t, http.StatusBadRequest, code, body)
	assert.Contains(t, body, "Entity.WakeTo")
}

// blockSubscriptionSession leaves session sid of events/Subscriptions/billing as a consumer with
// BlockAfterDeadLetter leaves it: its first message dead-lettered and recorded as the hold, the second
// deferred behind it. It returns the record.
func blockSubscriptionSession(t *testing.T, client *azservicebus.Client, sid string) []byte {
	t.Helper()
	ctx := sbtest.Context(t)
	snd, err := client.NewSender("events", nil)
	require.NoError(t, err)
	for _, id := range []string{sid + "-d1", sid + "-d2"} {
		require.NoError(t, snd.SendMessage(ctx, &azservicebus.Message{MessageID: &id, SessionID: &sid, Body: []byte("x")}, nil))
	}
	require.NoError(t, snd.Close(ctx))
	r, err := client.AcceptSessionForSubscription(ctx, "events", "billing", sid, nil)
	require.NoError(t, err)
	defer func() { _ = r.Close(ctx) }()
	var msgs []*azservicebus.ReceivedMessage
	for len(msgs) < 2 {
		got, err := r.ReceiveMessages(ctx, 2-len(msgs), nil)
		require.NoError(t, err)
		msgs = append(msgs, got...)
	}
	state := sessionstate.State{Hold: &sessionstate.Hold{SequenceNumber: *msgs[0].SequenceNumber, MessageID: msgs[0].MessageID, Attempt: 3,
		DeadLetterReason: "Poison", DeadLetteredAt: time.Now().UTC().Truncate(time.Millisecond)},
		Followers: []int64{*msgs[1].SequenceNumber}}
	raw, err := sessionstate.Marshal(state)
	require.NoError(t, err)
	require.NoError(t, r.SetSessionState(ctx, raw, nil))
	reason := "Poison"
	require.NoError(t, r.DeadLetterMessage(ctx, msgs[0], &azservicebus.DeadLetterOptions{Reason: &reason}))
	require.NoError(t, r.DeferMessage(ctx, msgs[1], nil))
	return raw
}
