package console

import (
	"encoding/json"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
	"github.com/sbretry/retry/sessionstate"
)

// sessionSite is a console on the session queue of an emulator, given as a plain entity: the console
// has to recognise it.
func sessionSite(t *testing.T, h *sbtest.Sessions, opts *Options) *site {
	t.Helper()
	c, err := New(h.Client, []Entity{{Path: sbtest.SessionQueue}}, opts)
	require.NoError(t, err)
	return serve(t, &sbtest.Harness{Em: h.Em, Client: h.Client, Entity: sbtest.SessionQueue}, c)
}

// assertNoRawAMQP checks a page shows no raw AMQP error.
func assertNoRawAMQP(t *testing.T, what, body string) {
	t.Helper()
	for _, raw := range []string{"amqp:", "*Error{", "non-sessionful"} {
		assert.NotContains(t, body, raw, what)
	}
}

// TestSessionQueueIsRecognised: a session queue the console was given as a plain entity is recognised
// at its first read: the overview counts its dead letters and links its held sessions, its pending
// page says where its retries are, its chart is empty, and no page shows the broker's raw refusal.
// The held-sessions page shows what blocks each session, its followers and its next wake-up.
func TestSessionQueueIsRecognised(t *testing.T) {
	t.Parallel()
	h := sbtest.NewSessions(t)
	held := h.Hold(t, "s-1", "", "a-1", "a-2", "a-3")
	dead := h.Hold(t, "s-2", "Poison", "b-1", "b-2")
	s := sessionSite(t, h, nil)

	code, body := s.get(t, "/")
	require.Equal(t, http.StatusOK, code, body)
	assertNoRawAMQP(t, "the overview", body)
	assert.NotContains(t, body, `id="alerts"><h2>Alerts</h2><ul><li><a href="deadletters?e=jobs">jobs</a>: could not be read`)
	assert.Contains(t, body, "session entity: see its held sessions")
	assert.Contains(t, body, `<a class="sessions-link" href="sessions?e=jobs">`)
	assert.Regexp(t, `<td class="num">1</td>`, body, "the dead-lettered b-1")

	code, body = s.get(t, "/pending?e=jobs")
	require.Equal(t, http.StatusOK, code, body)
	assertNoRawAMQP(t, "the pending page", body)
	assert.Contains(t, body, `id="session-entity"`)
	code, body = s.get(t, "/api/timeline?e=jobs")
	require.Equal(t, http.StatusOK, code, body)
	var tl timeline
	require.NoError(t, json.Unmarshal([]byte(body), &tl))
	assert.Zero(t, tl.Total)
	code, body = s.get(t, "/deadletters?e=jobs")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "1 dead letter in 1 failure group")

	// Cancel has nothing to act on: a session consumer schedules no retry copies.
	code, body, _, _ = s.preview(t, url.Values{"action": {"cancel"}, "ref": {"jobs:1"}})
	assert.Equal(t, http.StatusBadRequest, code, body)
	assertNoRawAMQP(t, "a cancel's refusal", body)
	assert.Contains(t, body, "holds no pending retry")

	code, body = s.get(t, "/sessions?e=jobs")
	require.Equal(t, http.StatusOK, code, body)
	assertNoRawAMQP(t, "the sessions page", body)
	row := func(sid string) string {
		m := regexp.MustCompile(`(?s)<tr class="session" data-session="` + sid + `"[^>]*>.*?</tr>`).FindString(body)
		require.NotEmpty(t, m, "no row for %s in %s", sid, body)
		return m
	}
	r1 := row("s-1")
	assert.Contains(t, r1, `data-status="held"`)
	assert.Contains(t, r1, "seq "+strconv.FormatInt(held.Held, 10)+": a-1")
	assert.Contains(t, r1, "downstream unavailable")
	assert.Contains(t, r1, "2 messages (seq "+strconv.FormatInt(held.Followers[0], 10)+", "+strconv.FormatInt(held.Followers[1], 10)+")")
	assert.Contains(t, r1, held.Due.Format("2006-01-02 15:04:05Z")+" (scheduled)")
	assert.Contains(t, r1, `value="release"`)
	r2 := row("s-2")
	assert.Contains(t, r2, `data-status="dead-lettered"`)
	assert.Contains(t, r2, "Poison")
	assert.Contains(t, r2, "1 message (seq "+strconv.FormatInt(dead.Followers[0], 10)+")")
}

// TestReleaseAHeldSession: a release is previewed, then run with the preview's digest: the wake-up is
// sent and the state written, both recorded in the audit log; the same run again is refused, since
// the session is no longer what the preview read.
func TestReleaseAHeldSession(t *testing.T) {
	t.Parallel()
	h := sbtest.NewSessions(t)
	h.Hold(t, "s-1", "Poison", "a-1", "a-2")
	before := h.Snapshot(t, "s-1")
	s := sessionSite(t, h, nil)
	form := url.Values{"action": {"release"}, "session": {"s-1"}}
	code, body, digest, _ := s.preview(t, form)
	require.Equal(t, http.StatusOK, code, body)
	require.NotEmpty(t, digest)
	assert.Equal(t, before, h.Snapshot(t, "s-1"), "the preview changed nothing")
	at := regexp.MustCompile(`name="at" value="([0-9]+)"`).FindStringSubmatch(body)
	require.NotNil(t, at)
	form.Set("at", at[1])

	// A digest that is not the preview's is refused, and nothing is done.
	code, body = s.run(t, form, "00"+digest[2:])
	assert.Equal(t, http.StatusConflict, code, body)
	assert.Equal(t, before, h.Snapshot(t, "s-1"))

	code, body = s.run(t, form, digest)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "Released session s-1 of jobs")
	after := h.Snapshot(t, "s-1")
	assert.NotEqual(t, before.State, after.State, "the state was written")
	assert.Greater(t, len(after.Msgs), len(before.Msgs), "the wake-up was sent")

	code, body = s.run(t, form, digest)
	assert.Equal(t, http.StatusConflict, code, "the session is no longer what the preview read")
	assert.Contains(t, body, "session &#34;s-1&#34; changed since the preview")

	pg, err := s.c.audit.page(0, 10)
	require.NoError(t, err)
	var outcomes []string
	for _, r := range pg.Records {
		outcomes = append(outcomes, r.Outcome)
		assert.Equal(t, "release", r.Action)
		assert.Equal(t, "s-1", r.Session)
	}
	assert.Equal(t, []string{AuditRefused, AuditDone, AuditStarted, AuditRefused}, outcomes)
	done := pg.Records[1]
	require.Len(t, done.Items, 1)
	assert.True(t, done.Items[0].Done)
	assert.Equal(t, "a-1", done.Items[0].MessageID)
	assert.Equal(t, digest, done.Digest)
}

// TestReleaseOnASubscriptionIsRefused: a subscription's session is not released from the console (its
// wake-up would go to the topic, to every subscription); the refusal comes before anything is read.
func TestReleaseOnASubscriptionIsRefused(t *testing.T) {
	t.Parallel()
	h := sbtest.NewSubscription(t)
	c, err := New(h.Client, []Entity{{Path: sbtest.SubscriptionPath, SessionConsumer: true}}, nil)
	require.NoError(t, err)
	s := serve(t, h, c)
	code, body, _, _ := s.preview(t, url.Values{"action": {"release"}, "session": {"s-1"}})
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "is a subscription")
	_, err = New(h.Client, []Entity{{Path: sbtest.SubscriptionPath, SessionConsumer: true, RetryQueue: "r"}}, nil)
	assert.ErrorIs(t, err, ErrInvalidOptions)
}

// TestTopicGivenAsAQueue: a topic's name given as an entity refuses a plain receiver as a session
// entity does, but lists no sessions: it is not taken for one, and the overview says what the refusal
// means instead of showing it raw.
func TestTopicGivenAsAQueue(t *testing.T) {
	t.Parallel()
	h := sbtest.NewSubscription(t)
	c, err := New(h.Client, []Entity{{Path: sbtest.Topic}}, nil)
	require.NoError(t, err)
	s := serve(t, h, c)
	code, body := s.get(t, "/")
	require.Equal(t, http.StatusOK, code, body)
	assertNoRawAMQP(t, "the overview", body)
	assert.NotContains(t, body, "session entity: see its held sessions")
	assert.Contains(t, body, "lists no sessions: a topic is read through its subscriptions")
	assert.False(t, c.entities[0].session.Load())
}

// TestReaderCannotRelease: a reader's held-sessions page has no release button, and its release is
// refused on the server.
func TestReaderCannotRelease(t *testing.T) {
	t.Parallel()
	h := sbtest.NewSessions(t)
	h.Hold(t, "s-1", "", "a-1")
	before := h.Snapshot(t, "s-1")
	s := sessionSite(t, h, &Options{Tokens: twoRoles})
	s.signIn(t, readerSecret)
	code, body := s.get(t, "/sessions?e=jobs")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `data-session="s-1"`)
	assert.NotContains(t, withoutSearchBox(t, body), "<button")
	code, body, _, _ = s.preview(t, url.Values{"action": {"release"}, "session": {"s-1"}})
	assert.Equal(t, http.StatusForbidden, code, body)
	assert.Equal(t, before, h.Snapshot(t, "s-1"))
}

// TestSessionSubscription: a session-enabled subscription given as SessionConsumer, without a retry
// queue, shows its held sessions (a session blocked after a dead-letter) and its dead letters; it has
// no release button (its wake-up would reach every subscription), and a redrive, which has no queue
// known to reach its consumer only, is refused until RedriveTo names one.
func TestSessionSubscription(t *testing.T) {
	t.Parallel()
	em := sbemu.StartT(t, sbemu.Config{Topics: []broker.TopicConfig{{Name: "events",
		Subscriptions: []broker.SubscriptionConfig{{Name: "billing", RequiresSession: true}}}}})
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), &azservicebus.ClientOptions{RetryOptions: sbtest.FastRetries})
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close(sbtest.Context(t)) })
	ctx := sbtest.Context(t)
	sender, err := client.NewSender("events", nil)
	require.NoError(t, err)
	sid, id := "s-dead", "b1"
	require.NoError(t, sender.SendMessage(ctx, &azservicebus.Message{MessageID: &id, SessionID: &sid, Body: []byte("x")}, nil))
	require.NoError(t, sender.Close(ctx))
	// The record a consumer with BlockAfterDeadLetter writes before it dead-letters the message.
	r, err := client.AcceptSessionForSubscription(ctx, "events", "billing", sid, nil)
	require.NoError(t, err)
	msgs, err := r.ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	rec, err := sessionstate.Marshal(sessionstate.State{Hold: &sessionstate.Hold{SequenceNumber: *msgs[0].SequenceNumber, MessageID: id, Attempt: 3,
		LastError: "downstream unavailable", DeadLetterReason: "RetryMaxAttemptsExceeded", DeadLetteredAt: time.Now()}})
	require.NoError(t, err)
	require.NoError(t, r.SetSessionState(ctx, rec, nil))
	reason := "RetryMaxAttemptsExceeded"
	require.NoError(t, r.DeadLetterMessage(ctx, msgs[0], &azservicebus.DeadLetterOptions{Reason: &reason}))
	require.NoError(t, r.Close(ctx))

	const path = "events/Subscriptions/billing"
	c, err := New(client, []Entity{{Path: path, SessionConsumer: true}}, nil)
	require.NoError(t, err)
	s := serve(t, &sbtest.Harness{Em: em, Client: client, Entity: path}, c)
	code, body := s.get(t, "/")
	require.Equal(t, http.StatusOK, code, body)
	assertNoRawAMQP(t, "the overview", body)
	assert.Contains(t, body, "session entity: see its held sessions")
	code, body = s.get(t, "/sessions?e="+url.QueryEscape(path))
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `data-session="s-dead" data-status="dead-lettered"`)
	assert.Contains(t, body, "RetryMaxAttemptsExceeded")
	assert.NotContains(t, body, `value="release"`)
	assert.Contains(t, body, "would reach every subscription")
	groups := s.groups(t)
	require.Len(t, groups, 1)
	code, body, _, _ = s.preview(t, url.Values{"action": {"redrive"}, "g": {groups[0]}})
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "has no redrive target")
}
