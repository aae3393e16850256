package console

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/sbtest"
)

func TestNewValidates(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	ok := []Entity{{Path: "orders"}}
	for _, tc := range []struct {
		name     string
		entities []Entity
		opts     *Options
	}{
		{"no entities", nil, nil},
		{"bad path", []Entity{{Path: "a/b"}}, nil},
		{"subscription without retry queue", []Entity{{Path: "events/Subscriptions/billing"}}, nil},
		{"subscription redriven to its topic", []Entity{{Path: "events/Subscriptions/billing", RetryQueue: "r", RedriveTo: "events"}}, nil},
		{"twice", []Entity{{Path: "orders"}, {Path: "ORDERS"}}, nil},
		{"negative MaxAttempts", []Entity{{Path: "orders", MaxAttempts: -1}}, nil},
		{"negative poll", ok, &Options{PollInterval: -1}},
		{"window shorter than poll", ok, &Options{PollInterval: time.Minute, Window: time.Second}},
		{"negative peek", ok, &Options{MaxPeek: -1}},
		{"negative page", ok, &Options{PageSize: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(h.Client, tc.entities, tc.opts)
			assert.ErrorIs(t, err, ErrInvalidOptions)
		})
	}
	_, err := New(nil, ok, nil)
	assert.ErrorIs(t, err, ErrInvalidOptions)
	c, err := New(h.Client, ok, nil)
	require.NoError(t, err)
	assert.Equal(t, DefaultPollInterval, c.opts.PollInterval)
	assert.Equal(t, DefaultWindow, c.opts.Window)
	assert.Equal(t, DefaultPageSize, c.opts.PageSize)
	assert.False(t, c.opts.ShowBodies, "bodies are off by default")
}

// TestOverviewShowsEveryEntity: the overview names each entity with its active, pending and
// dead-letter counts, and the series endpoint returns them for the charts.
func TestOverviewShowsEveryEntity(t *testing.T) {
	t.Parallel()
	h := sbtest.NewSubscription(t)
	h.Seed(t, "pending-1", "perm-1", "max-1")
	s := newSite(t, h, nil)
	code, body := s.get(t, "/")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `data-entity="events/Subscriptions/billing"`)
	assert.Contains(t, body, sbtest.RetryQueue)
	assert.Regexp(t, `<td class="num">0</td><td class="num">1</td><td class="num">2</td>`, body, "active 0, pending 1, dead letters 2")
	assert.Contains(t, body, "2 dead letters (threshold 1)", "the alert")

	code, js := s.get(t, "/api/series")
	require.Equal(t, http.StatusOK, code)
	var series struct {
		Times    []float64 `json:"times"`
		Entities []struct {
			Entity      string `json:"entity"`
			DeadLetters []int  `json:"deadLetters"`
		} `json:"entities"`
	}
	require.NoError(t, json.Unmarshal([]byte(js), &series))
	require.Len(t, series.Entities, 1)
	assert.Equal(t, []int{2}, series.Entities[0].DeadLetters)
	assert.Len(t, series.Times, 1)

	// Samples less than a second apart keep distinct, increasing times (uPlot needs them so).
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	s.c.ring.add(sample{At: at.Add(50 * time.Millisecond), Counts: []entityCounts{{DeadLetters: 1}}})
	s.c.ring.add(sample{At: at.Add(100 * time.Millisecond), Counts: []entityCounts{{DeadLetters: 3}}})
	_, js = s.get(t, "/api/series")
	require.NoError(t, json.Unmarshal([]byte(js), &series))
	require.Len(t, series.Times, 3)
	assert.Equal(t, []float64{float64(at.Unix()) + 0.05, float64(at.Unix()) + 0.1}, series.Times[1:])
	assert.Equal(t, []int{2, 1, 3}, series.Entities[0].DeadLetters)
}

// TestRunKeepsAWindowOfSamples: Run polls into the ring, which keeps Window/PollInterval+1 samples, and
// a growing dead-letter count raises an alert.
func TestRunKeepsAWindowOfSamples(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	c, err := New(h.Client, entitiesOf(h), &Options{PollInterval: time.Millisecond, Window: 3 * time.Millisecond, AlertThreshold: 100})
	require.NoError(t, err)
	polled := make(chan struct{})
	c.polled = func() { polled <- struct{}{} }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	wait := func() {
		select {
		case <-polled:
		case <-time.After(sbtest.Timeout):
			t.Fatal("no poll")
		}
	}
	for range 6 {
		wait()
	}
	assert.Len(t, c.ring.snapshot(), 4)
	assert.Empty(t, c.alerts(c.ring.snapshot()))
	h.Seed(t, "perm-1")
	wait() // may have started before the seed
	wait()
	samples := c.ring.snapshot()
	assert.Equal(t, 1, samples[len(samples)-1].Counts[0].DeadLetters)
	cancel()
	go func() {
		for range polled { // a poll in flight when cancel came
		}
	}()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(sbtest.Timeout):
		t.Fatal("Run did not return")
	}
	close(polled)

	grown := []sample{{Counts: []entityCounts{{DeadLetters: 1}}}, {Counts: []entityCounts{{DeadLetters: 4}}}}
	alerts := c.alerts(grown)
	require.Len(t, alerts, 1)
	assert.Equal(t, "3 new dead letters since the previous poll", alerts[0].Message)
}

// TestGroupsByReasonAndFingerprint: dead letters whose errors differ only in ids form one group, with
// its count, first and last seen and an example; the group page lists its messages.
func TestGroupsByReasonAndFingerprint(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1", "perm-2", "max-1")
	s := newSite(t, h, nil)
	code, body := s.get(t, "/deadletters?e=orders")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "3 dead letters in 2 failure groups")
	assert.Contains(t, body, "invalid payload in perm-&lt;n&gt;")
	groups := s.groups(t)
	require.Len(t, groups, 2)

	code, body = s.get(t, "/group?e=orders&g="+groups[0])
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "2 dead letters: RetryPermanentFailure")
	assert.Contains(t, body, ">perm-1<")
	assert.Contains(t, body, ">perm-2<")
	assert.NotContains(t, body, ">max-1<")

	code, body = s.get(t, "/group?e=orders&g=000000000000")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, body, "has no failure group")
}

// deadLetterWithSecret dead-letters a message whose error, description, property and body hold a secret.
func deadLetterWithSecret(t *testing.T, h *sbtest.Harness, secret string) {
	t.Helper()
	ctx := sbtest.Context(t)
	m := sbtest.Message("secret-1")
	m.Body = []byte(`{"card":"4111", "password":"` + secret + `"}`)
	m.ApplicationProperties = map[string]any{"sbretry-last-error": "connect: Password=" + secret + "; refused", "conn": "Endpoint=sb://x/;SharedAccessKey=" + secret}
	h.Send(t, m)
	r, err := h.Client.NewReceiverForQueue(sbtest.Queue, nil)
	require.NoError(t, err)
	defer func() { _ = r.Close(ctx) }()
	got, err := r.ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	require.Len(t, got, 1)
	reason, desc := "Poison", "token="+secret
	require.NoError(t, r.DeadLetterMessage(ctx, got[0], &azservicebus.DeadLetterOptions{Reason: &reason, ErrorDescription: &desc}))
}

// TestMessagePageRedactsAndHidesTheBody: the message page shows the envelope and properties with every
// secret redacted, and the body only when the console was told to.
func TestMessagePageRedactsAndHidesTheBody(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	const secret = "c2VjcmV0LWtleS12YWx1ZQ"
	deadLetterWithSecret(t, h, secret)
	for _, show := range []bool{false, true} {
		s := newSite(t, h, &Options{ShowBodies: show})
		code, body := s.get(t, "/message?e=orders&ref="+url.QueryEscape("orders/$DeadLetterQueue:1"))
		require.Equal(t, http.StatusOK, code, body)
		assert.NotContains(t, body, secret)
		assert.Contains(t, body, "Password=REDACTED")
		assert.Contains(t, body, "Poison")
		if show {
			assert.Contains(t, body, `id="body"`)
			assert.Contains(t, body, "4111")
		} else {
			assert.Contains(t, body, "Bodies are hidden")
			assert.NotContains(t, body, "4111")
		}
		_, groups := s.get(t, "/deadletters?e=orders")
		assert.NotContains(t, groups, secret)
	}
}

// TestBadInput: unknown entities, malformed and unqualified refs and bad pages get a 4xx that says why.
func TestBadInput(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1")
	s := newSite(t, h, nil)
	for _, tc := range []struct {
		path string
		code int
		want string
	}{
		{"/deadletters?e=nope", http.StatusNotFound, "unknown entity &#34;nope&#34;: this console shows orders"},
		{"/deadletters", http.StatusBadRequest, "no entity"},
		{"/message?e=orders&ref=xyz", http.StatusBadRequest, "malformed reference"},
		{"/message?e=orders&ref=1", http.StatusBadRequest, "has no entity"},
		{"/message?e=orders&ref=" + url.QueryEscape("orders/$DeadLetterQueue:99"), http.StatusNotFound, "no such message"},
		{"/message?e=orders&ref=" + url.QueryEscape("other/$DeadLetterQueue:1"), http.StatusBadRequest, "other/$DeadLetterQueue:1"},
		{"/group?e=orders&g=x&page=-1", http.StatusBadRequest, "is not a number from 0 to"},
		{"/pending?e=orders&cursor=%21%21", http.StatusBadRequest, "cursor"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			code, body := s.get(t, tc.path)
			assert.Equal(t, tc.code, code)
			assert.Contains(t, body, tc.want)
		})
	}
}

// TestRedriveGroup: the preview lists exactly the group's refs with their resubmit ids; the run
// resubmits exactly those and the broker shows them as fresh deliveries.
func TestRedriveGroup(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1", "perm-2", "max-1")
	s := newSite(t, h, nil)
	g := s.groups(t)[0]
	form := url.Values{"action": {"redrive"}, "g": {g}}
	code, body, digest, refs := s.preview(t, form)
	require.Equal(t, http.StatusOK, code, body)
	assert.Len(t, refs, 2)
	assert.Contains(t, body, "sbretry-resubmit-")
	assert.Equal(t, 3, h.Stats(t).DeadLettered, "a preview changes nothing")

	code, body = s.run(t, form, digest)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "Resubmitted 2 of 2 to orders")
	st := h.Stats(t)
	assert.Equal(t, 1, st.DeadLettered, "max-1 was not in the group")
	assert.Equal(t, 2, st.Active)
}

// TestRunRefusesAChangedGroup: a group that gained a dead letter since its preview is refused whole.
func TestRunRefusesAChangedGroup(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1")
	s := newSite(t, h, nil)
	g := s.groups(t)[0]
	form := url.Values{"action": {"redrive"}, "g": {g}}
	code, _, digest, _ := s.preview(t, form)
	require.Equal(t, http.StatusOK, code)
	h.Seed(t, "perm-2")
	code, body := s.run(t, form, digest)
	assert.Equal(t, http.StatusConflict, code)
	assert.Contains(t, body, "the failure group changed since the preview (it now holds 2 messages): nothing was done")
	assert.Equal(t, 2, h.Stats(t).DeadLettered)
	assert.Equal(t, 0, h.Stats(t).Active)
}

// TestRunRefusesASelectionThatLeft: a selected dead letter purged meanwhile makes the run refuse.
func TestRunRefusesASelectionThatLeft(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1", "perm-2")
	s := newSite(t, h, nil)
	form := url.Values{"action": {"purge"}, "ref": {"orders/$DeadLetterQueue:1", "orders/$DeadLetterQueue:2"}}
	code, body, digest, refs := s.preview(t, form)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, []string{"orders/$DeadLetterQueue:1", "orders/$DeadLetterQueue:2"}, refs)
	one := url.Values{"action": {"purge"}, "ref": {"orders/$DeadLetterQueue:2"}, "confirm": {"yes"}}
	_, _, d1, _ := s.preview(t, one)
	code, body = s.run(t, one, d1)
	require.Equal(t, http.StatusOK, code, body)

	form.Set("confirm", "yes")
	code, body = s.run(t, form, digest)
	assert.Equal(t, http.StatusConflict, code)
	assert.Contains(t, body, "1 selected message is no longer in their dead-letter queue")
	assert.Contains(t, body, "nothing was done")
	assert.Equal(t, 1, h.Stats(t).DeadLettered)
}

// TestPurgeNeedsTypedConfirmation: the word yes exactly, or the count; anything else does nothing.
func TestPurgeNeedsTypedConfirmation(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1", "perm-2")
	s := newSite(t, h, nil)
	g := s.groups(t)[0]
	form := url.Values{"action": {"purge"}, "g": {g}}
	_, _, digest, _ := s.preview(t, form)
	for _, answer := range []string{"", "y", "YES", "3"} {
		form.Set("confirm", answer)
		code, body := s.run(t, form, digest)
		assert.Equal(t, http.StatusBadRequest, code, answer)
		assert.Contains(t, body, "purge not confirmed")
	}
	assert.Equal(t, 2, h.Stats(t).DeadLettered)
	form.Set("confirm", "2")
	code, body := s.run(t, form, digest)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "Deleted 2 of 2")
	assert.Equal(t, 0, h.Stats(t).DeadLettered)
}

// TestCancelPendingRetry: preview then cancel exactly the selected pending retry.
func TestCancelPendingRetry(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "pending-1", "pending-2")
	s := newSite(t, h, nil)
	code, body := s.get(t, "/pending?e=orders")
	require.Equal(t, http.StatusOK, code, body)
	m := refValue.FindStringSubmatch(body)
	require.NotNil(t, m)
	form := url.Values{"action": {"cancel"}, "ref": {m[1]}}
	code, body, digest, refs := s.preview(t, form)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, []string{m[1]}, refs)
	code, body = s.run(t, form, digest)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "Cancelled 1 of 1")
	assert.Equal(t, 1, h.Stats(t).Scheduled)

	code, js := s.get(t, "/api/timeline?e=orders")
	require.Equal(t, http.StatusOK, code)
	var tl timeline
	require.NoError(t, json.Unmarshal([]byte(js), &tl))
	assert.Equal(t, 1, tl.Total)
	sum := 0
	for _, n := range tl.Counts {
		sum += n
	}
	assert.Equal(t, 1, sum)
}

// TestSubscriptionRedriveSelectedAcrossBothQueues: refs in the subscription's and the retry queue's
// dead-letter queues are settled each in its own queue and resubmitted to the retry queue.
func TestSubscriptionRedriveSelectedAcrossBothQueues(t *testing.T) {
	t.Parallel()
	h := sbtest.NewSubscription(t)
	h.Seed(t, "perm-1", "max-1")
	s := newSite(t, h, nil)
	form := url.Values{"action": {"redrive"}, "ref": {sbtest.SubscriptionPath + "/$DeadLetterQueue:1", sbtest.RetryQueue + "/$DeadLetterQueue:1"}}
	code, body, digest, refs := s.preview(t, form)
	require.Equal(t, http.StatusOK, code, body)
	assert.Len(t, refs, 2)
	assert.Contains(t, body, "to billing-retry")
	code, body = s.run(t, form, digest)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, 0, h.Stats(t).DeadLettered)
	rq := h.QueueStats(t, sbtest.RetryQueue)
	assert.Equal(t, 0, rq.DeadLettered)
	assert.Equal(t, 2, rq.Active)
}

var refValue = regexpMust(`name="ref" value="([^"]+)"`)

// TestStateChangesNeedPOSTAndCSRF: a GET, a missing or wrong token, another site's Origin, and no
// Origin or Referer at all are refused before anything is read.
func TestStateChangesNeedPOSTAndCSRF(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1")
	s := newSite(t, h, nil)
	code, _ := s.get(t, "/action/run?e=orders&action=purge&ref=orders/$DeadLetterQueue:1")
	assert.Equal(t, http.StatusMethodNotAllowed, code)

	tok := s.token(t, "/")
	form := url.Values{"e": {"orders"}, "action": {"purge"}, "ref": {"orders/$DeadLetterQueue:1"}, "confirm": {"yes"}}
	send := func(token, origin, referer string) (int, string) {
		f := url.Values{}
		for k, v := range form {
			f[k] = v
		}
		f.Set("csrf", token)
		req, err := http.NewRequest(http.MethodPost, s.srv.URL+"/action/preview", strings.NewReader(f.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		if referer != "" {
			req.Header.Set("Referer", referer)
		}
		resp, err := s.client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct{ name, token, origin, referer, want string }{
		{"no token", "", s.srv.URL, "", "CSRF token does not match"},
		{"wrong token", strings.Repeat("0", 64), s.srv.URL, "", "CSRF token does not match"},
		{"other origin", tok, "http://evil.example", "", "from another site"},
		{"other referer", tok, "", "http://evil.example/x", "from another site"},
		{"neither", tok, "", "", "neither an Origin nor a Referer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := send(tc.token, tc.origin, tc.referer)
			assert.Equal(t, http.StatusForbidden, code)
			assert.Contains(t, body, tc.want)
		})
	}
	code, _ = send(tok, "", s.srv.URL+"/group")
	assert.Equal(t, http.StatusOK, code, "a same-site Referer without Origin is accepted")
	assert.Equal(t, 1, h.Stats(t).DeadLettered)
}

// TestAccessToken: with a token set, nothing is served without it; ?token= sets a cookie and redirects
// to the address without it; a bearer header works too.
func TestAccessToken(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	s := newSite(t, h, &Options{AccessToken: "s3cret-token"})
	code, body := s.get(t, "/")
	assert.Equal(t, http.StatusUnauthorized, code)
	assert.Contains(t, body, "access token is required")
	code, _ = s.get(t, "/?token=wrong")
	assert.Equal(t, http.StatusUnauthorized, code)
	code, body = s.get(t, "/static/console.css")
	assert.Equal(t, http.StatusUnauthorized, code, body)

	resp, err := s.client.Get(s.srv.URL + "/?token=s3cret-token")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "/", resp.Request.URL.RequestURI(), "redirected without the token")
	code, _ = s.get(t, "/deadletters?e=orders")
	assert.Equal(t, http.StatusOK, code, "the cookie carries it")

	req, err := http.NewRequest(http.MethodGet, s.srv.URL+"/api/series", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer s3cret-token")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestNoSecretsOnAnyPage: the connection string never reaches a page.
func TestNoSecretsOnAnyPage(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1", "pending-1")
	s := newSite(t, h, nil)
	cs := h.Em.ConnectionString()
	key := cs[strings.Index(cs, "SharedAccessKey=")+len("SharedAccessKey="):]
	if i := strings.IndexByte(key, ';'); i >= 0 {
		key = key[:i]
	}
	require.NotEmpty(t, key)
	g := s.groups(t)[0]
	for _, p := range []string{"/", "/api/series", "/pending?e=orders", "/deadletters?e=orders", "/group?e=orders&g=" + g, "/message?e=orders&ref=" + url.QueryEscape("orders/$DeadLetterQueue:1")} {
		code, body := s.get(t, p)
		require.Equal(t, http.StatusOK, code, p)
		assert.NotContains(t, body, key, p)
		assert.NotContains(t, body, "Endpoint=", p)
	}
}
