package main

import (
	"cmp"
	"encoding/json"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/sbemu"
	"github.com/sbretry/retry/sbemu/broker"
	"github.com/sbretry/retry/sessionstate"
)

func TestSessionsListCommand(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	held := h.Hold(t, "s-held", "", "a1", "a2", "a3")
	h.Hold(t, "s-dead", "RetryMaxAttemptsExceeded", "b1", "b2")
	h.SetState(t, "s-foreign", []byte("another application's state"))
	h.Send(t, "s-plain", "c1")
	h.Hold(t, "s-locked", "", "d1")
	consumer := h.Accept(t, "s-locked")
	defer func() { _ = consumer.Close(sbtest.Context(t)) }()

	code, out, errOut := h.cli(t, "", "sessions", "list")
	require.Equal(t, exitOK, code, errOut)
	lines := splitLines(out)
	require.Len(t, lines, 5, "a header and the four sessions with a state")
	assert.Regexp(t, `^ENTITY\s+SESSION\s+STATUS\s+SEQ\s+MESSAGE ID\s+ATTEMPT\s+DUE\s+FOLLOWERS\s+WAKE-UP\s+NOTE$`, lines[0])
	due := formatTime(held.Due)
	seq := strconv.FormatInt(held.Held, 10)
	assert.Regexp(t, `(?m)^jobs +s-held +waiting +`+seq+` +a1 +3 +`+due+` +2 +`+due+` +last error: downstream unavailable$`, out)
	assert.Regexp(t, `(?m)^jobs +s-dead +dead-lettered +\d+ +b1 +3 +- +1 +- +dead-lettered: RetryMaxAttemptsExceeded; last error: downstream unavailable$`, out)
	assert.Regexp(t, `(?m)^jobs +s-foreign +foreign +- +- +- +- +- +- +the state \(27 bytes\) is not a hold record: left alone$`, out)
	assert.Regexp(t, `(?m)^jobs +s-locked +locked +- +- +- +- +- +- +held by a consumer now: not read`, out)
	assert.NotContains(t, out, "s-plain")

	code, out, _ = h.cli(t, "", "sessions", "held", "--json")
	require.Equal(t, exitOK, code)
	var got jsonHeldSessions
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	assert.Equal(t, sessionQueue, got.Entity)
	assert.Equal(t, 4, got.Listed)
	require.Len(t, got.Sessions, 4)
	byID := map[string]jsonHeldSession{}
	for _, s := range got.Sessions {
		byID[s.SessionID] = s
	}
	s := byID["s-held"]
	assert.Equal(t, "waiting", s.Status)
	require.NotNil(t, s.State)
	require.NotNil(t, s.State.Hold)
	assert.Equal(t, held.Held, s.State.Hold.SequenceNumber)
	assert.Equal(t, held.Due, s.State.Hold.WakeAt)
	assert.Equal(t, held.Followers, s.State.Followers)
	require.NotNil(t, s.NextWakeUp)
	assert.Equal(t, held.WakeID, s.NextWakeUp.MessageID)
	assert.True(t, s.NextWakeUp.Scheduled)
	assert.Len(t, s.Deferred, 3)
	assert.True(t, byID["s-locked"].LockedByConsumer)
	assert.Nil(t, byID["s-locked"].State)
	assert.Equal(t, "foreign", byID["s-foreign"].Status)
	assert.Contains(t, byID["s-foreign"].StateError, "not a durable hold record")

	// The names scripts depend on.
	var raw struct {
		Sessions []map[string]json.RawMessage `json:"sessions"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &raw))
	for _, s := range raw.Sessions {
		var id string
		require.NoError(t, json.Unmarshal(s["sessionId"], &id))
		if id == "s-held" {
			assert.Equal(t, []string{"deferred", "entity", "lockedByConsumer", "nextWakeUp", "scan", "sessionId", "state", "stateBytes", "status", "wakeUps"}, slices.Sorted(maps.Keys(s)))
			var st map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(s["state"], &st))
			assert.Equal(t, []string{"followers", "hold"}, slices.Sorted(maps.Keys(st)))
			var hold map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(st["hold"], &hold))
			assert.Equal(t, []string{"attempt", "firstFailure", "lastError", "messageId", "sequenceNumber", "wakeAt", "wakeId"}, slices.Sorted(maps.Keys(hold)))
		}
	}
}

func TestSessionsListEmpty(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	h.Send(t, "s-plain", "c1")
	code, out, _ := h.cli(t, "", "sessions", "list")
	require.Equal(t, exitOK, code)
	assert.Equal(t, "no held sessions on jobs (read 0 sessions with a state)\n", out)
}

func TestSessionsReleaseCommand(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	f := h.Hold(t, "s1", "", "a1", "a2")
	before := h.Snapshot(t, "s1")
	stats := h.Stats(t)
	args := []string{"sessions", "release", "--session", "s1"}

	code, out, _ := h.cli(t, "", append(args, "--dry-run")...)
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, `would release session "s1" of jobs:`)
	assert.Regexp(t, `  before: sequence number `+strconv.FormatInt(f.Held, 10)+` \(a1\) held for attempt 3, due `+formatTime(f.Due)+`; 1 followers \[\d+\]; last error: downstream unavailable`, out)
	assert.Regexp(t, `  after:  sequence number \d+ \(a1\) held for attempt 3, due \S+; 1 followers`, out)
	assert.Regexp(t, `  send:   wake-up sbretry-wake-[0-9a-f]{16}-\d+-3-\d+ to jobs in session "s1", receivable now, for sequence number \d+`, out)
	dry := releaseJSON(t, h, "", append(args, "--dry-run")...)
	assert.True(t, dry.DryRun)
	assert.False(t, dry.WakeSent)
	assert.False(t, dry.StateWritten)
	assert.Equal(t, f.Due, dry.Before.Hold.WakeAt)
	assert.Equal(t, dry.PlannedAt, dry.After.Hold.WakeAt)
	assert.Equal(t, before, h.Snapshot(t, "s1"), "a dry run changes nothing")
	assert.Equal(t, stats, h.Stats(t))

	code, _, errOut := h.cli(t, "no\n", args...)
	assert.Equal(t, exitError, code)
	assert.Contains(t, errOut, `Release session "s1" of jobs as shown above? Type yes to continue: `)
	assert.Contains(t, errOut, "release not confirmed")
	assert.Equal(t, before, h.Snapshot(t, "s1"), "not confirmed: nothing done")

	code, out, errOut = h.cli(t, "yes\n", args...)
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, `releasing session "s1" of jobs:`)
	assert.Regexp(t, `released session "s1" of jobs: sent wake-up sbretry-wake-\S+ to jobs, found it in the session, wrote the new state`, out)

	ctx := sbtest.Context(t)
	r := h.Accept(t, "s1")
	defer func() { _ = r.Close(ctx) }()
	raw, err := r.GetSessionState(ctx, nil)
	require.NoError(t, err)
	state, err := sessionstate.Decode(raw)
	require.NoError(t, err)
	require.NotNil(t, state.Hold)
	assert.NotEqual(t, f.Due, state.Hold.WakeAt, "due now, not in an hour")
	assert.Equal(t, f.Followers, state.Followers)
	msgs, err := r.ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	assert.Equal(t, sessionstate.ControlWake, msgs[0].ApplicationProperties[sessionstate.PropControl], "the wake-up is in the session")
	assert.Equal(t, state.Hold.WakeID, msgs[0].MessageID, "and the state names it")
}

func TestSessionsReleaseJSONAfterDeadLetter(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	f := h.Hold(t, "s1", "RetryMaxAttemptsExceeded", "a1", "a2")
	rep := releaseJSON(t, h, "", "sessions", "release", "--session", "s1", "--yes")
	assert.Equal(t, "release", rep.Action)
	assert.False(t, rep.DryRun)
	assert.Equal(t, sessionQueue, rep.Entity)
	assert.Equal(t, "s1", rep.SessionID)
	assert.True(t, rep.WakeSent)
	assert.True(t, rep.StateWritten)
	assert.Empty(t, rep.Error)
	require.NotNil(t, rep.Before.Hold)
	assert.Equal(t, "RetryMaxAttemptsExceeded", rep.Before.Hold.DeadLetterReason)
	assert.Nil(t, rep.After.Hold, "unblocked")
	// The dead-lettered message heads the followers, in case a consumer stopped before dead-lettering it.
	followers := append([]int64{f.Held}, f.Followers...)
	assert.Equal(t, followers, rep.After.Followers)
	assert.Equal(t, int64(-1), rep.WakeUp.ForSequenceNumber)
	s := h.Snapshot(t, "s1")
	state, err := sessionstate.Decode(s.State)
	require.NoError(t, err)
	assert.Equal(t, sessionstate.State{Followers: followers}, state)
}

func TestSessionsReleaseRefuses(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	h.Hold(t, "s-locked", "", "a1")
	h.SetState(t, "s-foreign", []byte(`{"format":"someone-else"}`))
	h.Send(t, "s-plain", "c1")
	consumer := h.Accept(t, "s-locked")
	defer func() { _ = consumer.Close(sbtest.Context(t)) }()
	foreign := h.Snapshot(t, "s-foreign")
	stats := h.Stats(t)

	code, _, errOut := h.cli(t, "", "sessions", "release", "--session", "s-locked", "--yes")
	assert.Equal(t, exitError, code)
	assert.Contains(t, errOut, "locked by a consumer now")

	code, _, errOut = h.cli(t, "", "sessions", "release", "--session", "s-foreign", "--yes")
	assert.Equal(t, exitError, code)
	assert.Contains(t, errOut, "not a durable hold record")
	assert.Contains(t, errOut, "left alone")
	assert.Equal(t, foreign, h.Snapshot(t, "s-foreign"))

	code, _, errOut = h.cli(t, "", "sessions", "release", "--session", "s-plain", "--yes")
	assert.Equal(t, exitNotFound, code)
	assert.Contains(t, errOut, "holds nothing to release")

	code, _, errOut = h.cli(t, "", "sessions", "release", "--yes")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "needs --session ID")
	code, _, _ = h.cli(t, "", "sessions", "release", "s-plain")
	assert.Equal(t, exitUsage, code)
	code, _, errOut = h.cli(t, "", "sessions")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "sessions needs a subcommand")
	code, _, errOut = cliNoEntity(t, "", "--connection-string", h.Em.ConnectionString(), "--topic", "t", "--subscription", "s", "--retry-queue", "r", "sessions", "release", "--session", "x")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "needs --wake-to TOPIC", "a subscription's wake-up is routed by the topic's rules (sessions_subscription_test.go)")
	assert.Equal(t, stats, h.Stats(t), "nothing was sent")
}

func releaseJSON(tb testing.TB, h *sessionHarness, stdin string, args ...string) jsonRelease {
	tb.Helper()
	_, out, _ := h.cli(tb, stdin, append(args, "--json")...)
	var rep jsonRelease
	require.NoError(tb, json.Unmarshal([]byte(out), &rep), out)
	return rep
}

func splitLines(s string) []string {
	var out []string
	for _, l := range slices.Collect(strings.SplitSeq(strings.TrimRight(s, "\n"), "\n")) {
		out = append(out, l)
	}
	return out
}

// A release with --trace-file records each of its broker calls as a span under the command's, the
// wake-up's send before the state's write.
func TestSessionsReleaseTraceFile(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	h.Hold(t, "s1", "", "a1")
	path := filepath.Join(t.TempDir(), "sbretry.otlp.jsonl")
	code, _, errOut := h.cli(t, "", "sessions", "release", "--session", "s1", "--yes", "--trace-file", path)
	require.Equal(t, exitOK, code, errOut)
	spans, _ := readTraceFile(t, path)
	var root fileSpan
	var calls []fileSpan
	for _, s := range spans {
		if s.Name == "sbretry sessions release" {
			root = s
		} else {
			calls = append(calls, s)
		}
	}
	require.NotEmpty(t, root.SpanID)
	slices.SortStableFunc(calls, func(a, b fileSpan) int { return cmpNano(a.Start, b.Start) })
	var names []string
	for _, s := range calls {
		assert.Equal(t, root.SpanID, s.ParentSpanID, s.Name)
		names = append(names, s.Name)
	}
	assert.Equal(t, []string{
		"accept_session jobs", "get_session_state jobs", // the preview
		"accept_session jobs", "get_session_state jobs", "send jobs", "peek jobs", "set_session_state jobs", // the release (the peek finds the wake-up)
	}, names)
}

// cmpNano orders OTLP JSON timestamps (decimal strings of Unix nanoseconds).
func cmpNano(a, b string) int {
	x, _ := strconv.ParseInt(a, 10, 64)
	y, _ := strconv.ParseInt(b, 10, 64)
	return cmp.Compare(x, y)
}

// A waiting session whose held message and wake-up are not in the session says so: no consumer will
// take it up by itself.
func TestSessionsListStuckSession(t *testing.T) {
	t.Parallel()
	h := newSessionHarness(t)
	raw, err := sessionstate.Marshal(sessionstate.State{Hold: &sessionstate.Hold{SequenceNumber: 999, MessageID: "gone", Attempt: 2, WakeAt: timeMust(t, "2026-01-01T00:00:00Z")}})
	require.NoError(t, err)
	h.SetState(t, "s-stuck", raw)
	code, out, _ := h.cli(t, "", "sessions", "list")
	require.Equal(t, exitOK, code)
	assert.Regexp(t, `(?m)^jobs +s-stuck +waiting +999 +gone +2 +2026-01-01T00:00:00.000Z +0 +none +the held message is not in the session$`, out)
}

// A session consumer on a subscription has no retry queue: `sessions list` needs none (it implies
// --session-consumer), and the other commands take --session-consumer instead of --retry-queue, reading
// the subscription and its own dead-letter queue only.
func TestSessionsOnASubscription(t *testing.T) {
	t.Parallel()
	em := sbemu.StartT(t, sbemu.Config{Topics: []broker.TopicConfig{{Name: "events",
		Subscriptions: []broker.SubscriptionConfig{{Name: "billing", RequiresSession: true}}}}})
	client, err := azservicebus.NewClientFromConnectionString(em.ConnectionString(), &azservicebus.ClientOptions{RetryOptions: sbtest.FastRetries})
	require.NoError(t, err)
	defer func() { _ = client.Close(sbtest.Context(t)) }()
	sender, err := client.NewSender("events", nil)
	require.NoError(t, err)
	sid, id := "s-dead", "b1"
	require.NoError(t, sender.SendMessage(sbtest.Context(t), &azservicebus.Message{MessageID: &id, SessionID: &sid, Body: []byte("x")}, nil))
	require.NoError(t, sender.Close(sbtest.Context(t)))
	// The record a consumer with BlockAfterDeadLetter writes before it dead-letters the message.
	r, err := client.AcceptSessionForSubscription(sbtest.Context(t), "events", "billing", sid, nil)
	require.NoError(t, err)
	msgs, err := r.ReceiveMessages(sbtest.Context(t), 1, nil)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	rec, err := sessionstate.Marshal(sessionstate.State{Hold: &sessionstate.Hold{SequenceNumber: *msgs[0].SequenceNumber, MessageID: id, Attempt: 3,
		LastError: "downstream unavailable", DeadLetterReason: "RetryMaxAttemptsExceeded", DeadLetteredAt: time.Now()}})
	require.NoError(t, err)
	require.NoError(t, r.SetSessionState(sbtest.Context(t), rec, nil))
	require.NoError(t, r.DeadLetterMessage(sbtest.Context(t), msgs[0], &azservicebus.DeadLetterOptions{Reason: to.Ptr("RetryMaxAttemptsExceeded")}))
	require.NoError(t, r.Close(sbtest.Context(t)))

	sub := []string{"--connection-string", em.ConnectionString(), "--topic", "events", "--subscription", "billing"}
	code, out, errOut := cliNoEntity(t, "", append(sub, "sessions", "list")...)
	require.Equal(t, exitOK, code, errOut)
	assert.Regexp(t, `(?m)^events/Subscriptions/billing +s-dead +dead-lettered +\d+ +b1 +3 `, out)

	code, out, errOut = cliNoEntity(t, "", append(sub, "--session-consumer", "dlq", "list")...)
	require.Equal(t, exitOK, code, errOut)
	assert.Regexp(t, `(?m)^events/Subscriptions/billing/\$DeadLetterQueue +\d+ .*RetryMaxAttemptsExceeded`, out)

	code, _, errOut = cliNoEntity(t, "", append(sub, "dlq", "list")...)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "--session-consumer")
	code, _, errOut = cliNoEntity(t, "", append(sub, "--session-consumer", "--retry-queue", "billing-retry", "dlq", "list")...)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "no retry queue")
	code, _, errOut = cliNoEntity(t, "", append(sub, "--session-consumer", "cancel", "7", "--yes")...)
	assert.NotEqual(t, exitOK, code)
	assert.Contains(t, errOut, "holds retries in the session")
	// A session entity can be read only session by session: never "nothing pending".
	for _, cmd := range [][]string{{"pending"}, {"status", "b1"}} {
		code, out, errOut = cliNoEntity(t, "", append(append(sub, "--session-consumer"), cmd...)...)
		assert.Equal(t, exitError, code, cmd)
		assert.Contains(t, errOut, "session by session", cmd)
		assert.NotContains(t, out, "nothing", cmd)
	}
	code, _, errOut = cliNoEntity(t, "", append(sub, "--session-consumer", "serve", "--listen", "127.0.0.1:0")...)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "not serve")
}
