package console

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/sbtest"
)

// seedTenant sends one message per id with the application property tenant and a body naming the
// tenant and the id, and runs a consumer until each is dead-lettered at its first attempt with the
// error "<why> in <id>".
func seedTenant(t *testing.T, h *sbtest.Harness, tenant, why string, ids ...string) {
	t.Helper()
	msgs := make([]*azservicebus.Message, len(ids))
	for i, id := range ids {
		msgs[i] = sbtest.Message(id)
		msgs[i].Body = []byte(`{"customer":"` + tenant + `-customer","id":"` + id + `"}`)
		msgs[i].ApplicationProperties = map[string]any{"tenant": tenant}
	}
	h.Send(t, msgs...)
	c := h.StartConsumer(t, func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		return retry.Permanent(errors.New(why + " in " + m.MessageID))
	}, retry.Options{MaxConcurrency: 4})
	c.Out.WaitFor(t, "every message dead-lettered", func(ps []retry.ProcessedParams) bool {
		for _, id := range ids {
			if _, ok := sbtest.Result(ps, id, retry.OutcomeDeadLettered); !ok {
				return false
			}
		}
		return true
	})
	c.Stop()
}

// deadLetterIDs are the MessageIDs in the harness queue's dead-letter queue, in sequence order.
func deadLetterIDs(t *testing.T, h *sbtest.Harness) []string {
	t.Helper()
	in, err := inspect.New(h.Client, h.Entity, &inspect.Options{RetryQueue: h.RetryQueue})
	require.NoError(t, err)
	l, err := in.DeadLetters(sbtest.Context(t), inspect.DeadLetterFilter{})
	require.NoError(t, err)
	var out []string
	for _, d := range l.Items {
		out = append(out, d.MessageID)
	}
	return out
}

// activeIDs are the original MessageIDs of the harness queue's receivable messages.
func activeIDs(t *testing.T, h *sbtest.Harness) []string {
	t.Helper()
	ctx := sbtest.Context(t)
	r, err := h.Client.NewReceiverForQueue(sbtest.Queue, nil)
	require.NoError(t, err)
	defer func() { _ = r.Close(ctx) }()
	from := int64(0)
	msgs, err := r.PeekMessages(ctx, 100, &azservicebus.PeekMessagesOptions{FromSequenceNumber: &from})
	require.NoError(t, err)
	var out []string
	for _, m := range msgs {
		if m.State != azservicebus.MessageStateScheduled {
			out = append(out, originalID(m))
		}
	}
	return out
}

var batchPattern = regexp.MustCompile(`<li class="batch" data-done="(\d+)" data-count="(\d+)">Batch (\d+) of (\d+)`)

// TestRedriveAllMatchingInBatches: the dead-letter page filtered by a property lists what matches and
// offers the redrive of all of it; the preview lists exactly those dead letters (entity and sequence
// number) under a digest; a dead letter that starts matching after the preview is not touched; the
// run goes in batches of BatchSize, its page showing the progress after each, and the broker then
// holds exactly the previewed messages as fresh deliveries and the rest still dead-lettered. The audit
// record names the filter.
func TestRedriveAllMatchingInBatches(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	seedTenant(t, h, "acme", "invalid payload", "a-1", "a-2", "a-3", "a-4", "a-5")
	seedTenant(t, h, "globex", "invalid payload", "g-1", "g-2")
	s := newSite(t, h, &Options{BatchSize: 2})

	code, body := s.get(t, "/deadletters?e=orders&prop="+url.QueryEscape("tenant=acme"))
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `5 dead letters match: property tenant=acme`)
	assert.Contains(t, body, `id="redrive-matching"`)
	assert.Equal(t, 5, strings.Count(body, `<tr class="match"`))
	assert.NotContains(t, body, "g-1")

	form := url.Values{"action": {"redrive"}, "match": {"1"}, "prop": {"tenant=acme"}}
	code, body, digest, refs := s.preview(t, form)
	require.Equal(t, http.StatusOK, code, body)
	require.NotEmpty(t, digest)
	assert.Len(t, refs, 5)
	assert.Contains(t, body, `id="preview-matched"`)
	assert.Contains(t, body, "It runs in 3 batches of up to 2")
	assert.Contains(t, body, `name="matched" value="property tenant=acme"`)

	// A dead letter that matches only after the preview is not part of it.
	seedTenant(t, h, "acme", "invalid payload", "a-late")

	code, body = s.run(t, url.Values{"action": {"redrive"}, "ref": refs, "matched": {"property tenant=acme"}}, digest)
	require.Equal(t, http.StatusOK, code, body)
	steps := batchPattern.FindAllStringSubmatch(body, -1)
	require.Len(t, steps, 3, body)
	for i, want := range []string{"2", "4", "5"} {
		assert.Equal(t, want, steps[i][1], "done after batch %d", i+1)
	}
	assert.Contains(t, body, "Resubmitted 5 of 5")
	assert.NotContains(t, body, `id="result-error"`)

	assert.ElementsMatch(t, []string{"g-1", "g-2", "a-late"}, deadLetterIDs(t, h))
	assert.ElementsMatch(t, []string{"a-1", "a-2", "a-3", "a-4", "a-5"}, activeIDs(t, h))

	pg, err := s.c.audit.page(0, 10)
	require.NoError(t, err)
	require.NotEmpty(t, pg.Records)
	last := pg.Records[0]
	assert.Equal(t, AuditDone, last.Outcome)
	assert.Equal(t, "property tenant=acme", last.Filter)
	assert.Equal(t, 5, last.Done)
	assert.Equal(t, 5, last.Count)
}

// TestActOnAllMatchingIsExact: a run acts on the preview's dead letters or on none: one of them purged
// meanwhile makes it refuse (409) with nothing done; a digest for other refs, or a forged description
// of the filter, is refused; a filter that selects everything, or a reason on pending retries, is
// refused; a reader's action on all matching is refused (403); a body filter is refused unless the
// console was given FilterBodies.
func TestActOnAllMatchingIsExact(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	seedTenant(t, h, "acme", "invalid payload", "a-1", "a-2", "a-3")
	s := newSite(t, h, nil)

	form := url.Values{"action": {"purge"}, "match": {"1"}, "error": {"INVALID PAYLOAD"}}
	code, body, digest, refs := s.preview(t, form)
	require.Equal(t, http.StatusOK, code, body)
	require.Len(t, refs, 3)

	// The description is covered by the digest.
	code, body = s.run(t, url.Values{"action": {"purge"}, "ref": refs, "matched": {"error contains anything"}, "confirm": {"yes"}}, digest)
	assert.Equal(t, http.StatusConflict, code, body)
	// So is every ref.
	code, body = s.run(t, url.Values{"action": {"purge"}, "ref": refs[:2], "matched": {"error contains INVALID PAYLOAD"}, "confirm": {"yes"}}, digest)
	assert.Equal(t, http.StatusConflict, code, body)
	assert.Len(t, deadLetterIDs(t, h), 3, "nothing was purged")

	// One of the previewed dead letters goes meanwhile: the run refuses them all. (A preview of ticked
	// rows takes no description of a filter from its form.)
	_, body1, d1, r1 := s.preview(t, url.Values{"action": {"purge"}, "ref": refs[:1], "matched": {"reason is anything"}})
	assert.NotContains(t, body1, `id="preview-matched"`)
	code, body = s.run(t, url.Values{"action": {"purge"}, "ref": r1, "confirm": {"yes"}}, d1)
	require.Equal(t, http.StatusOK, code, body)
	code, body = s.run(t, url.Values{"action": {"purge"}, "ref": refs, "matched": {"error contains INVALID PAYLOAD"}, "confirm": {"yes"}}, digest)
	assert.Equal(t, http.StatusConflict, code, body)
	assert.Contains(t, body, "no longer in their dead-letter queue")
	assert.Len(t, deadLetterIDs(t, h), 2)

	for name, f := range map[string]url.Values{
		"no filter":           {"action": {"purge"}, "match": {"1"}},
		"a filter and refs":   {"action": {"purge"}, "match": {"1"}, "error": {"x"}, "ref": {refs[1]}},
		"a reason, pending":   {"action": {"cancel"}, "match": {"1"}, "reason": {"x"}},
		"not a time":          {"action": {"purge"}, "match": {"1"}, "since": {"yesterday"}},
		"not a property":      {"action": {"purge"}, "match": {"1"}, "prop": {"tenant"}},
		"body, not turned on": {"action": {"purge"}, "match": {"1"}, "body": {"acme"}},
	} {
		code, body, _, _ := s.preview(t, f)
		assert.Equal(t, http.StatusBadRequest, code, "%s: %s", name, body)
	}
	code, body = s.get(t, "/deadletters?e=orders&body=acme")
	assert.Equal(t, http.StatusBadRequest, code, body)
	assert.Contains(t, body, "filtering by body text is off")
	assert.Len(t, deadLetterIDs(t, h), 2, "nothing was purged")
}

// TestActOnAllMatchingReaderRefused: a reader filters (a GET form) but has no action on all matching,
// and one it posts is refused on the server.
func TestActOnAllMatchingReaderRefused(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	seedTenant(t, h, "acme", "invalid payload", "a-1")
	c, err := New(h.Client, entitiesOf(h), &Options{Tokens: twoRoles})
	require.NoError(t, err)
	reader := serve(t, h, c)
	reader.signIn(t, readerSecret)
	code, body := reader.get(t, "/deadletters?e=orders&error=invalid")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "1 dead letter match")
	assert.NotContains(t, body, "redrive-matching")
	code, body, _, _ = reader.preview(t, url.Values{"action": {"purge"}, "match": {"1"}, "error": {"invalid"}})
	assert.Equal(t, http.StatusForbidden, code, body)
	assert.Len(t, deadLetterIDs(t, h), 1)
}

// TestFilterByBody: with FilterBodies, the dead letters whose body holds a text are matched and can be
// acted on; the audit record and the log say only that a body filter of so many characters was used.
func TestFilterByBody(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	seedTenant(t, h, "acme", "invalid payload", "a-1", "a-2")
	seedTenant(t, h, "globex", "invalid payload", "g-1")
	s := newSite(t, h, &Options{FilterBodies: true})
	code, body := s.get(t, "/deadletters?e=orders&body=GLOBEX-customer")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "1 dead letter match: body contains a text of 15 characters")
	code, body, digest, refs := s.preview(t, url.Values{"action": {"purge"}, "match": {"1"}, "body": {"GLOBEX-customer"}})
	require.Equal(t, http.StatusOK, code, body)
	require.Len(t, refs, 1)
	code, body = s.run(t, url.Values{"action": {"purge"}, "ref": refs, "matched": {"body contains a text of 15 characters"}, "confirm": {"1"}}, digest)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "Deleted 1 of 1")
	assert.ElementsMatch(t, []string{"a-1", "a-2"}, deadLetterIDs(t, h))
	pg, err := s.c.audit.page(0, 10)
	require.NoError(t, err)
	for _, rec := range pg.Records {
		assert.NotContains(t, rec.Filter, "GLOBEX", "the body text is not recorded")
	}
}

// TestCancelAllMatchingPending: the pending page filtered by the last error and the due time offers
// the cancel of all matching; the preview lists exactly the matching pending retries, and the run
// cancels them in batches, leaving the others scheduled.
func TestCancelAllMatchingPending(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "pending-1", "pending-2", "pending-3")
	// A retry of another kind: due in a day, with another error.
	ctx := sbtest.Context(t)
	snd, err := h.Client.NewSender(sbtest.Queue, nil)
	require.NoError(t, err)
	id := "other-1"
	_, err = snd.ScheduleMessages(ctx, []*azservicebus.Message{{MessageID: &id, Body: []byte("x"), ApplicationProperties: map[string]any{
		envelope.PropAttempt: int64(2), envelope.PropLastError: "disk full",
	}}}, time.Now().Add(24*time.Hour), nil)
	require.NoError(t, err)
	require.NoError(t, snd.Close(ctx))
	s := newSite(t, h, &Options{BatchSize: 2})

	until := time.Now().UTC().Add(2 * time.Hour).Format("2006-01-02T15:04")
	code, body := s.get(t, "/pending?e=orders&error=downstream&until="+url.QueryEscape(until))
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `id="cancel-matching"`)
	assert.NotContains(t, body, "disk full")

	code, body, digest, refs := s.preview(t, url.Values{"action": {"cancel"}, "match": {"1"}, "error": {"downstream"}, "until": {until}})
	require.Equal(t, http.StatusOK, code, body)
	require.Len(t, refs, 3)
	matched := regexp.MustCompile(`name="matched" value="([^"]+)"`).FindStringSubmatch(body)
	require.NotNil(t, matched)
	code, body = s.run(t, url.Values{"action": {"cancel"}, "ref": refs, "matched": {unescape(matched[1])}}, digest)
	require.Equal(t, http.StatusOK, code, body)
	assert.Len(t, batchPattern.FindAllStringSubmatch(body, -1), 2)
	assert.Contains(t, body, "Cancelled 3 of 3")

	in, err := inspect.New(h.Client, sbtest.Queue, nil)
	require.NoError(t, err)
	page, err := in.ListPending(ctx, inspect.PageOptions{})
	require.NoError(t, err)
	require.Len(t, page.Items, 1)
	assert.Equal(t, "other-1", page.Items[0].MessageID)
}

// TestFilterIsShownEscaped: a filter is the operator's text, but a link can carry any: it is shown
// escaped wherever a page repeats it, bounded, and refused where it cannot apply.
func TestFilterIsShownEscaped(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	seedTenant(t, h, "acme", "invalid payload", "a-1")
	s := newSite(t, h, nil)
	hostile := "\x1b]0;pwned\x07<script>alert(1)</script>\u202e"
	for _, p := range []string{"/deadletters?e=orders&error=", "/pending?e=orders&error="} {
		code, body := s.get(t, p+url.QueryEscape(hostile))
		require.Equal(t, http.StatusOK, code, body)
		assertNoRawControls(t, p, body)
		assert.Contains(t, body, `\x1b]0;pwned\x07`)
	}
	for _, p := range []string{
		"/deadletters?e=orders&error=" + strings.Repeat("x", maxFilterField+1),
		"/deadletters?e=orders&error=%ff",
		"/deadletters?e=orders&since=yesterday",
		"/pending?e=orders&reason=Poison",
	} {
		code, body := s.get(t, p)
		assert.Equal(t, http.StatusBadRequest, code, p)
		assertNoRawControls(t, p, body)
	}
}

// FuzzReadFilter: whatever a link carries as a filter, readFilter refuses it or returns a filter whose
// query (the links that keep it) reads back to the same filter, and whose description holds no control
// character a page or a log line would pass on raw.
func FuzzReadFilter(f *testing.F) {
	f.Add("RetryPermanentFailure", "timeout", "tenant=acme", "2026-01-02T15:04", "2026-01-03", "acme")
	f.Add("", "\x1b[31m", "a==b", "2026-01-02T15:04:05Z", "", "\xff")
	f.Fuzz(func(t *testing.T, reason, errText, prop, since, until, body string) {
		v := url.Values{filterReason: {reason}, filterError: {errText}, filterProperty: {prop}, filterSince: {since}, filterUntil: {until}, filterBody: {body}}
		r := httptest.NewRequest(http.MethodGet, "/deadletters?"+v.Encode(), nil)
		got, err := readFilter(r, true)
		if err != nil {
			return
		}
		again, err := readFilter(httptest.NewRequest(http.MethodGet, "/deadletters?e=orders"+got.query(), nil), true)
		require.NoError(t, err)
		require.Equal(t, got, again)
		for _, c := range shownText(got.Describe()) {
			require.False(t, c < 0x20 || c == 0x7f, "%q", got.Describe())
		}
	})
}
