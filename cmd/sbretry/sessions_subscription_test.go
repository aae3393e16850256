package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
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

// billingPath is the session subscription of wakeRoutedTopic.
const billingPath = "events/Subscriptions/billing"

// wakeRoutedTopic is the layout docs/console.md gives for releasing a session subscription's
// sessions: the topic events with the session subscription billing and another one, audit. Both take
// the producers' messages (no sbretry-wake-to); billing also takes, with wakeRule, the wake-ups that
// name it, and no subscription takes any other wake-up.
func wakeRoutedTopic(t *testing.T, wakeRule bool) (*sbemu.Emulator, *azservicebus.Client) {
	t.Helper()
	business := broker.RuleConfig{Name: "business", SQLFilter: "[" + inspect.PropWakeTo + "] IS NULL"}
	billing := []broker.RuleConfig{business}
	if wakeRule {
		billing = append(billing, broker.RuleConfig{Name: "wake", CorrelationFilter: &broker.CorrelationFilter{
			Properties: map[string]any{inspect.PropWakeTo: billingPath},
		}})
	}
	em := sbemu.StartT(t, sbemu.Config{Topics: []broker.TopicConfig{{Name: "events", DuplicateDetectionWindow: 10 * time.Minute, Subscriptions: []broker.SubscriptionConfig{
		{Name: "billing", RequiresSession: true, Rules: billing},
		{Name: "audit", Rules: []broker.RuleConfig{business}},
	}}}})
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), &azservicebus.ClientOptions{RetryOptions: sbtest.FastRetries})
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close(sbtest.Context(t)) })
	return em, client
}

// subscriptionCLI runs the command on the session subscription billing.
func subscriptionCLI(t *testing.T, em *sbemu.Emulator, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	full := append([]string{"--connection-string", em.ConnectionString(), "--topic", "events", "--subscription", "billing"}, args...)
	code, stdout, stderr = cliNoEntity(t, "", full...)
	t.Logf("sbretry %v -> %d\nstdout:\n%sstderr:\n%s", args, code, stdout, stderr)
	return code, stdout, stderr
}

// TestSessionsReleaseOfASubscription: with the real retry.SessionConsumer on a session subscription
// (BlockAfterDeadLetter), a dead-lettered message blocks its session and the next one waits deferred
// behind it; sessions release --wake-to events previews the wake-up going to the topic carrying
// sbretry-wake-to, and the release brings it to the session, writes the state, and the consumer runs
// the deferred message. The other subscription of the topic gets the producer's messages and never
// the wake-up.
func TestSessionsReleaseOfASubscription(t *testing.T) {
	t.Parallel()
	em, client := wakeRoutedTopic(t, true)
	ctx := sbtest.Context(t)

	ran := make(chan string, 10)
	handler := func(_ context.Context, m *azservicebus.ReceivedMessage) error {
		ran <- m.MessageID
		if m.MessageID == "d1" {
			return retry.Permanent(errBoom)
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
	assert.Equal(t, "d1", receiveRan(t, ran))

	// Blocked after d1's dead-letter, d2 deferred behind it, and let go by the consumer.
	pollUntil(t, "the session blocked and let go", func() bool {
		_, out, _ := subscriptionCLI(t, em, "--session-consumer", "sessions", "list", "--json")
		var list jsonHeldSessions
		if json.Unmarshal([]byte(out), &list) != nil || len(list.Sessions) != 1 {
			return false
		}
		s := list.Sessions[0]
		return s.SessionID == sid && s.Status == statusDeadLettered && s.State != nil && len(s.State.Followers) == 1
	})

	code, dry, errOut := subscriptionCLI(t, em, "sessions", "release", "--session", sid, "--wake-to", "events", "--dry-run")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, dry, `would release session "s-1" of events/Subscriptions/billing:`)
	assert.Regexp(t, `send:   wake-up sbretry-wake-\S+ to events carrying sbretry-wake-to=events/Subscriptions/billing \(the topic's rules route it to events/Subscriptions/billing\) in session "s-1"`, dry)
	code, js, errOut := subscriptionCLI(t, em, "--json", "sessions", "release", "--session", sid, "--wake-to", "events", "--dry-run")
	require.Equal(t, exitOK, code, errOut)
	var preview jsonRelease
	require.NoError(t, json.Unmarshal([]byte(js), &preview))
	assert.Equal(t, "events", preview.WakeUp.To)
	assert.Equal(t, billingPath, preview.WakeUp.WakeToProperty)
	assert.False(t, preview.WakeSent)
	select {
	case id := <-ran:
		t.Fatalf("%s ran after a dry run", id)
	default:
	}

	code, out, errOut := subscriptionCLI(t, em, "sessions", "release", "--session", sid, "--wake-to", "events", "--yes")
	require.Equal(t, exitOK, code, errOut)
	assert.Regexp(t, `released session "s-1" of events/Subscriptions/billing: sent wake-up sbretry-wake-\S+ to events, found it in the session, wrote the new state`, out)
	assert.Equal(t, "d2", receiveRan(t, ran), "the consumer takes the session up and runs the deferred message")

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
}

// TestSessionsReleaseOfASubscriptionNeedsTheWakeUpInTheSession: when the topic's rules do not bring
// the wake-up to the subscription, the release writes nothing (the state is as it was) and says so
// (exit 1, never success); a subscription without --wake-to, and --wake-to where it does not belong,
// are refused before anything is read.
func TestSessionsReleaseOfASubscriptionNeedsTheWakeUpInTheSession(t *testing.T) {
	t.Parallel()
	em, client := wakeRoutedTopic(t, false)
	ctx := sbtest.Context(t)
	sid := "s-1"
	raw := blockSubscriptionSession(t, client, sid)

	code, out, errOut := subscriptionCLI(t, em, "sessions", "release", "--session", sid, "--wake-to", "events", "--yes")
	assert.Equal(t, exitError, code)
	assert.Contains(t, errOut, "did not keep the wake-up")
	assert.NotContains(t, out, "released session")
	r, err := client.AcceptSessionForSubscription(ctx, "events", "billing", sid, nil)
	require.NoError(t, err)
	got, err := r.GetSessionState(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, r.Close(ctx))
	assert.Equal(t, raw, got, "the state is as it was")

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a subscription without --wake-to", []string{"--topic", "events", "--subscription", "billing", "--session-consumer"}, "needs --wake-to TOPIC"},
		{"--wake-to on a queue", []string{"--queue", "jobs", "--wake-to", "events"}, "--wake-to is for a session subscription"},
		{"--wake-to with a retry queue", []string{"--topic", "events", "--subscription", "billing", "--retry-queue", "r", "--wake-to", "events"}, "no retry queue"},
		{"--wake-to a path", []string{"--topic", "events", "--subscription", "billing", "--wake-to", billingPath}, "must name a topic"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--connection-string", em.ConnectionString(), "sessions", "release", "--session", sid, "--yes"}, tc.args...)
			code, _, errOut := cliNoEntity(t, "", args...)
			assert.Equal(t, exitUsage, code, errOut)
			assert.Contains(t, errOut, tc.want)
		})
	}
}

// blockSubscriptionSession leaves session sid of billing as a consumer with BlockAfterDeadLetter
// leaves it: its first message dead-lettered and recorded as the hold, the second deferred behind it.
// It returns the record.
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

// receiveRan returns the next message id the handler ran, failing after sbtest.Timeout.
func receiveRan(t *testing.T, ran <-chan string) string {
	t.Helper()
	timer := time.NewTimer(sbtest.Timeout)
	defer timer.Stop()
	select {
	case id := <-ran:
		return id
	case <-timer.C:
		t.Fatal("no message ran")
		return ""
	}
}

// pollUntil checks cond on a ticker until it holds, failing after sbtest.Timeout: what the consumer
// did is seen through the command line, as an operator sees it.
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(sbtest.Timeout)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
