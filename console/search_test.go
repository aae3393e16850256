package console

import (
	"bytes"
	"context"
	"errors"
	"html"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/retryindex"
)

// searchNow is the console's and the index's clock in the index-backed search tests.
var searchNow = time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)

// chainOf is the chain id of an event that started on source at sequence number seq.
func chainOf(source, originalID string, seq int64) string {
	return envelope.Envelope{Source: source, FirstSequenceNumber: seq, OriginalMessageID: originalID}.ChainID()
}

// fillIndex opens an index in a temporary file, applies records, and returns it (closed when the test
// ends).
func fillIndex(t *testing.T, records ...retryindex.Record) *retryindex.SQLite {
	t.Helper()
	store, err := retryindex.OpenSQLite(filepath.Join(t.TempDir(), "index.db"), &retryindex.SQLiteOptions{Now: func() time.Time { return searchNow }})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	require.NoError(t, store.Apply(context.Background(), records))
	return store
}

// indexedEvents are the events of the index-backed search tests: order-42 pending on orders (attempt 2
// due in an hour, with its ref), order-7 dead-lettered there at its third attempt, order-9 succeeded
// at its second, and order-5 of an entity this console does not show.
func indexedEvents() []retryindex.Record {
	at := searchNow.Add(-time.Minute)
	pending := recordOf("order-42", 7, "orders")
	pending.Kind, pending.Attempt, pending.NextAttempt, pending.At, pending.NextDue = retryindex.KindScheduled, 1, 2, at, searchNow.Add(time.Hour)
	pending.Error, pending.Entity, pending.SequenceNumber = "ledger unavailable", "orders", 12
	dead1 := recordOf("order-7", 3, "orders")
	dead1.Kind, dead1.Attempt, dead1.NextAttempt, dead1.At, dead1.NextDue = retryindex.KindScheduled, 1, 2, at.Add(-time.Hour), at.Add(-50*time.Minute)
	dead1.Error = "timeout"
	dead2 := recordOf("order-7", 3, "orders")
	dead2.Kind, dead2.Attempt, dead2.At, dead2.Reason, dead2.Error = retryindex.KindDeadLettered, 3, at, "RetryMaxAttemptsExceeded", "timeout again"
	dead2.Entity, dead2.SequenceNumber, dead2.Feed = "orders/$DeadLetterQueue", 4, retryindex.FeedTailer
	ok1 := recordOf("order-9", 9, "orders")
	ok1.Kind, ok1.Attempt, ok1.NextAttempt, ok1.At, ok1.NextDue, ok1.Error = retryindex.KindScheduled, 1, 2, at.Add(-2*time.Hour), at.Add(-time.Hour), "busy"
	ok2 := recordOf("order-9", 9, "orders")
	ok2.Kind, ok2.Attempt, ok2.At = retryindex.KindSucceeded, 2, at.Add(-time.Hour)
	other := recordOf("order-5", 5, "invoices")
	other.Kind, other.Attempt, other.NextAttempt, other.At, other.NextDue = retryindex.KindScheduled, 1, 2, at, searchNow.Add(time.Hour)
	other.Entity, other.SequenceNumber = "invoices", 3
	return []retryindex.Record{pending, dead1, dead2, ok1, ok2, other}
}

// indexSite is a console on the harness answering its searches from idx, with MaxAttempts 5 and the
// fixed clock.
func indexSite(t *testing.T, idx Index, opts Options) *site {
	t.Helper()
	h := sbtest.New(t)
	opts.Index = idx
	c, err := New(h.Client, []Entity{{Path: h.Entity, MaxAttempts: 5}}, &opts)
	require.NoError(t, err)
	c.now = func() time.Time { return searchNow }
	return serve(t, h, c)
}

// searchBoxPattern is the search box every page carries in its header.
var searchBoxPattern = regexp.MustCompile(`<form class="search" id="search"[^>]*>.*?</form>`)

// withoutSearchBox is body without the search box, for the checks that a reader's page has no action
// control: the box reads only. It fails the test when the page has no box.
func withoutSearchBox(t *testing.T, body string) string {
	t.Helper()
	require.Regexp(t, searchBoxPattern, body)
	// The dead-letter and pending pages' filter is a GET form too: it only reads.
	return filterFormPattern.ReplaceAllString(searchBoxPattern.ReplaceAllString(body, ""), "")
}

// filterFormPattern is the filter form of the dead-letter and pending pages.
var filterFormPattern = regexp.MustCompile(`(?s)<form method="get" action="[a-z]+" id="filter" class="filter">.*?</form>`)

// searchFor fetches the search page of q.
func (s *site) searchFor(t *testing.T, q string, extra ...string) (int, string) {
	t.Helper()
	return s.get(t, "/search?q="+url.QueryEscape(q)+strings.Join(extra, ""))
}

// TestSearchFromIndex: with Options.Index the search page answers from the index, by every name of
// an event, with its state, its attempt of the entity's MaxAttempts, its history, the answer's
// freshness and the actions that apply to its state.
func TestSearchFromIndex(t *testing.T) {
	t.Parallel()
	s := indexSite(t, fillIndex(t, indexedEvents()...), Options{})
	pendingChain := chainOf("orders", "order-42", 7)
	for _, tc := range []struct {
		name, q string
		want    []string // all on the page
		absent  []string // none on the page
	}{
		{"pending by original id", "order-42", []string{
			`data-from="index"`, `data-state="pending"`,
			"Will be retried at 2026-12-07 11:00:00Z, attempt 2 of 5 (in 1h0m0s)",
			"sbretry-" + pendingChain + "-2", "orders:12", "ledger unavailable", "retry scheduled", "billing-1",
			"From the retry-state index, as of 2026-12-07 10:00:00Z", "consumer billing-1 last wrote",
			`value="cancel"`, `name="ref" value="orders:12"`, `href="pending?e=orders"`, `href="search?q=order-42&amp;from=broker"`,
		}, []string{`value="redrive"`, "No trace", "search-more"}},
		{"pending by retry message id", "sbretry-" + pendingChain + "-2", []string{"attempt 2 of 5", `name="ref" value="orders:12"`}, nil},
		{"pending by key", "key-order-42", []string{"attempt 2 of 5"}, nil},
		{"pending by correlation id", "corr-order-42", []string{"attempt 2 of 5"}, nil},
		{"dead-lettered", "order-7", []string{
			`data-state="dead-lettered"`, "Dead-lettered at 2026-12-07 09:59:00Z: RetryMaxAttemptsExceeded, attempt 3 of 5",
			"timeout again", `href="message?e=orders&amp;ref=orders%2f%24DeadLetterQueue%3a4"`, `value="redrive"`, `value="purge"`,
			"by the tailer feed",
		}, []string{`value="cancel"`}},
		{"succeeded", "order-9", []string{`data-state="succeeded"`, "Succeeded at 2026-12-07 08:59:00Z, attempt 2", "busy"},
			[]string{`action/preview`, "Last error"}},
		{"no trace says what was searched", "order-1", []string{
			`data-found="0"`, "No trace.", "Searched the retry-state index for a message id", "an idempotency key and a correlation id equal to <code>order-1</code>",
			"From the retry-state index, as of",
		}, []string{"not found", `data-partial`}},
		{"another entity's event is not shown", "order-5", []string{"No trace.", "Also in the index: 1 event of entities this console does not show."},
			[]string{"invoices:3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := s.searchFor(t, tc.q)
			require.Equal(t, http.StatusOK, code, body)
			for _, w := range tc.want {
				assert.Contains(t, body, w)
			}
			for _, a := range tc.absent {
				assert.NotContains(t, body, a)
			}
		})
	}
}

// TestSearchFromIndexActionsArePreviews: the cancel a search offers is the ordinary cancel preview,
// which reads the broker: a ref the index names that the broker no longer holds is refused there, and
// nothing is done.
func TestSearchFromIndexActionsArePreviews(t *testing.T) {
	t.Parallel()
	s := indexSite(t, fillIndex(t, indexedEvents()...), Options{})
	code, body, _, _ := s.preview(t, url.Values{"action": {"cancel"}, "ref": {"orders:12"}})
	assert.NotEqual(t, http.StatusOK, code, body)
	assert.Contains(t, body, "nothing was done")
}

// TestSearchReaderSeesNoAction: a reader's answer has the views' links and no action form; an
// operator's has the forms.
func TestSearchReaderSeesNoAction(t *testing.T) {
	t.Parallel()
	s := indexSite(t, fillIndex(t, indexedEvents()...), Options{Tokens: twoRoles})
	s.signIn(t, readerSecret)
	for _, q := range []string{"order-42", "order-7"} {
		code, body := s.searchFor(t, q)
		require.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, `data-found="1"`)
		assert.Contains(t, body, `href="deadletters?e=orders"`)
		assert.NotContains(t, body, "action/preview", "a reader sees no action (%s)", q)
		assert.NotContains(t, withoutSearchBox(t, body), "<button", q)
	}
	s.signIn(t, operatorSecret)
	_, body := s.searchFor(t, "order-42")
	assert.Contains(t, body, `value="cancel"`)
	_, body = s.searchFor(t, "order-7")
	assert.Contains(t, body, `value="redrive"`)
}

// TestSearchBoxOnEveryPage: every page carries the search box, and the search page keeps the query
// in it.
func TestSearchBoxOnEveryPage(t *testing.T) {
	t.Parallel()
	s := indexSite(t, fillIndex(t), Options{})
	for _, p := range []string{"/", "/pending?e=orders", "/deadletters?e=orders", "/audit", "/search", "/message?e=orders&ref=nope"} {
		_, body := s.get(t, p)
		assert.Contains(t, body, `<form class="search" id="search" method="get" action="search"`, p)
		assert.Contains(t, body, `maxlength="1024"`, p)
	}
	code, body := s.get(t, "/search")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `id="search-empty"`)
	_, body = s.searchFor(t, "order-42")
	assert.Contains(t, body, `id="search-q" value="order-42"`)
}

// TestSearchQueryIsHostile: the query is refused over 1,024 bytes without being repeated, shown
// escaped and made showable everywhere (title, box, no-trace text, links), and never logged; text the
// index holds is shown the same way.
func TestSearchQueryIsHostile(t *testing.T) {
	t.Parallel()
	hostile := recordOf("k\u202egpj.exe", 1, "orders")
	hostile.Kind, hostile.Attempt, hostile.NextAttempt, hostile.At, hostile.NextDue = retryindex.KindScheduled, 1, 2, searchNow, searchNow.Add(time.Minute)
	hostile.Error = "<img src=x onerror=alert(1)>\x1b[31mred"
	var logs bytes.Buffer
	s := indexSite(t, fillIndex(t, hostile), Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})

	q := `"><script>alert(1)</script>` + "\x1b[2J\u202e"
	code, body := s.searchFor(t, q)
	require.Equal(t, http.StatusOK, code, body)
	assert.NotContains(t, body, "<script>alert(1)")
	assert.NotContains(t, body, "\x1b")
	assert.NotContains(t, body, "\u202e")
	assert.Contains(t, body, html.EscapeString(`"><script>alert(1)</script>`)+`\x1b[2J\u202e`)
	assert.Contains(t, body, `value="&#34;&gt;&lt;script&gt;alert(1)&lt;/script&gt;\x1b[2J\u202e"`, "the box")

	code, body = s.searchFor(t, "k\u202egpj.exe")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `k\u202egpj.exe`)
	assert.Contains(t, body, `&lt;img src=x onerror=alert(1)&gt;\x1b[31mred`)
	assert.NotContains(t, body, "<img src=x")

	long := strings.Repeat("a", maxQueryBytes) + "<b>"
	code, body = s.searchFor(t, long)
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "the search query is 1027 bytes long; ids, keys and correlation ids are at most 1024")
	assert.NotContains(t, body, strings.Repeat("a", 100))
	_, body = s.searchFor(t, strings.Repeat("a", maxQueryBytes))
	assert.Contains(t, body, "No trace.")

	code, body = s.searchFor(t, "order-\xff\xfe")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "the search query is not valid UTF-8 text")

	assert.NotContains(t, logs.String(), "script")
	assert.NotContains(t, logs.String(), "gpj.exe")
}

// recordOf is a record of the event id that started on source at sequence number seq, as the
// consumer writes it: its key is "key-" + id, its correlation id "corr-" + id.
func recordOf(id string, seq int64, source string) retryindex.Record {
	return retryindex.Record{Chain: chainOf(source, id, seq), OriginalID: id, Key: "key-" + id, CorrelationID: "corr-" + id, Source: source,
		Process: "billing-1", Feed: retryindex.FeedConsumer, SequenceNumber: -1}
}

// failingIndex answers every lookup with an error.
type failingIndex struct{}

func (failingIndex) Lookup(context.Context, string, *retryindex.LookupOptions) (*retryindex.Answer, error) {
	return nil, errors.New("database is locked")
}

func (failingIndex) Pending(context.Context, *retryindex.PendingOptions) (*retryindex.PendingPage, error) {
	return nil, errors.New("database is locked")
}

func (failingIndex) DeadLettered(context.Context, *retryindex.PendingOptions) (*retryindex.PendingPage, error) {
	return nil, errors.New("database is locked")
}

func (failingIndex) PendingHistogram(context.Context, *retryindex.HistogramOptions) (*retryindex.Histogram, error) {
	return nil, errors.New("database is locked")
}

// TestSearchIndexFailsOrIsBypassed: an index that fails gives a 502 that says so and how to read the
// broker instead; from=broker reads the broker even with an index.
func TestSearchIndexFailsOrIsBypassed(t *testing.T) {
	t.Parallel()
	s := indexSite(t, failingIndex{}, Options{})
	code, body := s.searchFor(t, "order-42")
	assert.Equal(t, http.StatusBadGateway, code)
	assert.Contains(t, body, "reading the retry-state index: database is locked")
	code, body = s.searchFor(t, "order-42", "&from=broker")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `data-from="broker"`)
	assert.Contains(t, body, "Read from the broker at")
	assert.NotContains(t, body, "No retry-state index is configured")
}

// TestSearchByScan: without an index the search page scans each entity, by every name of the event,
// and a read that saw every message finds nothing with "no trace", never a bare "not found".
func TestSearchByScan(t *testing.T) {
	t.Parallel()
	for _, layout := range []struct {
		name string
		h    func(testing.TB) *sbtest.Harness
	}{{"queue", sbtest.New}, {"subscription", sbtest.NewSubscription}} {
		t.Run(layout.name, func(t *testing.T) {
			t.Parallel()
			h := layout.h(t)
			h.Seed(t, "pending-1", "max-1")
			ents := entitiesOf(h)
			ents[0].MaxAttempts = 2
			c, err := New(h.Client, ents, nil)
			require.NoError(t, err)
			s := serve(t, h, c)
			for _, tc := range []struct {
				name, q string
				want    []string
				absent  []string
			}{
				{"pending by original id", "pending-1", []string{`data-from="broker"`, `data-state="pending"`, "Will be retried at ", ", attempt 2 of 2 (in ",
					sbtest.ErrDownstream.Error(), `value="cancel"`, "No retry-state index is configured", "a retry-state index keeps every attempt"},
					[]string{"data-partial", "No trace"}},
				{"pending by correlation id", "corr-pending-1", []string{`data-state="pending"`}, nil},
				{"dead-lettered", "max-1", []string{`data-state="dead-lettered"`, "RetryMaxAttemptsExceeded, attempt 2 of 2", "timeout calling the ledger",
					`class="message-link"`, `value="purge"`}, []string{`value="cancel"`}},
				{"no trace", "nobody", []string{`data-found="0"`, "No trace.", "Searched the messages read from the broker"}, []string{"data-partial", "not found"}},
			} {
				t.Run(tc.name, func(t *testing.T) {
					code, body := s.searchFor(t, tc.q)
					require.Equal(t, http.StatusOK, code, body)
					for _, w := range tc.want {
						assert.Contains(t, body, w)
					}
					for _, a := range tc.absent {
						assert.NotContains(t, body, a)
					}
				})
			}
		})
	}
}

// TestSearchByScanSaysWhenPartial: a scan that stopped at MaxPeek says the answer is partial, and its
// "no trace" says it is no proof of absence, as the 100,000-retry "not found" did not.
func TestSearchByScanSaysWhenPartial(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "pending-1", "pending-2", "pending-3")
	s := newSite(t, h, &Options{MaxPeek: 1})
	code, body := s.searchFor(t, "nobody")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `data-partial="true"`)
	assert.Contains(t, body, "The answer is partial: the read of orders stopped at 1 messages (MaxPeek)")
	assert.Contains(t, body, `so "no trace" here does not mean it is not there`)
	assert.Contains(t, body, "No trace in what was read.")
	assert.Contains(t, body, "orders (1 messages, stopped at the bound)")

	s = newSite(t, h, nil)
	_, body = s.searchFor(t, "nobody")
	assert.NotContains(t, body, "data-partial")
	assert.Contains(t, body, "orders (3 messages)")
}

// TestSearchSessionEntity: a session entity's search reads its dead letters (its held sessions would
// have to be accepted one by one) and says so, linking them; from the index, a message a session
// consumer holds is "held in its session", with no cancel (its release is on the held-sessions page).
func TestSearchSessionEntity(t *testing.T) {
	t.Parallel()
	h := sbtest.NewSessions(t)
	h.Hold(t, "s-1", "", "a-1")
	h.Hold(t, "s-2", "Poison", "b-1")
	s := sessionSite(t, h, nil)
	for _, tc := range []struct {
		q    string
		want []string
	}{
		{"b-1", []string{`data-state="dead-lettered"`, "Poison", `class="message-link"`}},
		{"a-1", []string{"No trace."}},
	} {
		code, body := s.searchFor(t, tc.q)
		require.Equal(t, http.StatusOK, code, body)
		assertNoRawAMQP(t, tc.q, body)
		assert.Contains(t, body, `jobs requires sessions: only its dead letters were searched`, tc.q)
		assert.Contains(t, body, `href="sessions?e=jobs"`, tc.q)
		assert.NotContains(t, body, "data-partial", tc.q)
		for _, w := range tc.want {
			assert.Contains(t, body, w, tc.q)
		}
	}

	held := recordOf("a-1", 1, sbtest.SessionQueue)
	held.Kind, held.Attempt, held.NextAttempt, held.At, held.NextDue = retryindex.KindHeld, 3, 3, searchNow, searchNow.Add(time.Hour)
	held.Entity, held.SequenceNumber = sbtest.SessionQueue, 1
	c, err := New(h.Client, []Entity{{Path: sbtest.SessionQueue, SessionConsumer: true}}, &Options{Index: fillIndex(t, held)})
	require.NoError(t, err)
	c.now = func() time.Time { return searchNow }
	is := serve(t, &sbtest.Harness{Em: h.Em, Client: h.Client, Entity: sbtest.SessionQueue}, c)
	code, body := is.searchFor(t, "a-1")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `data-state="held"`)
	assert.Contains(t, body, "Held in its session until 2026-12-07 11:00:00Z, attempt 3 (in 1h0m0s)")
	assert.Contains(t, body, `href="sessions?e=jobs"`)
	assert.NotContains(t, body, `value="cancel"`)
}

// TestSearchFromIndexSaysWhenMoreMatch: a correlation id naming more events than a lookup returns (20)
// lists the most recently changed and says there are more.
func TestSearchFromIndexSaysWhenMoreMatch(t *testing.T) {
	t.Parallel()
	var records []retryindex.Record
	for i := range 21 {
		r := recordOf("order-"+itoa(i), int64(i+1), "orders")
		r.CorrelationID = "checkout-1"
		r.Kind, r.Attempt, r.NextAttempt, r.At, r.NextDue = retryindex.KindScheduled, 1, 2, searchNow.Add(time.Duration(i)*time.Second), searchNow.Add(time.Hour)
		records = append(records, r)
	}
	s := indexSite(t, fillIndex(t, records...), Options{})
	code, body := s.searchFor(t, "checkout-1")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `data-found="20"`)
	assert.Contains(t, body, "More events match than are shown: the most recently changed are listed.")
	assert.Contains(t, body, "order-20 · key-order-20")
	assert.NotContains(t, body, "order-0 · key-order-0")
}

// queryHeading is the search page's heading, the query as shown.
var queryHeading = regexp.MustCompile(`<h2 id="search-query">([^\n]*?)</h2>`)

// FuzzSearchPageShowsTheQueryEscaped: whatever the query, the search page (from the index, and from a
// partial read) shows it only escaped: no markup it carries, and no control, format or invalid
// character but the template's own line breaks.
func FuzzSearchPageShowsTheQueryEscaped(f *testing.F) {
	for _, seed := range []string{"order-42", `"><script>alert(1)</script>`, "\x1b[2J", "k\u202egpj.exe", "a\x00b", "\xff", "x'y\"z&<>"} {
		f.Add(seed)
	}
	tmpl, err := template.New("").Funcs(templateFuncs).ParseFS(templateFS, "templates/*.html")
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, q string) {
		for _, data := range []*searchPage{
			{Query: q, FromIndex: true, HasIndex: true},
			{Query: q, Partial: true, Scans: []scanLine{{Entity: "orders", Peeked: 1, Truncated: true}}, MaxPeek: 1},
		} {
			var buf bytes.Buffer
			require.NoError(t, tmpl.ExecuteTemplate(&buf, "search.html", page{Title: "Search", Base: "/", Data: data, Query: q}))
			out := buf.String()
			m := queryHeading.FindStringSubmatch(out)
			require.NotNil(t, m, "no heading")
			require.NotContains(t, m[1], "<", "markup in the heading")
			require.Equal(t, shownText(q), html.UnescapeString(m[1]), "the heading is the query made showable, escaped")
			assert.True(t, utf8.ValidString(out), "invalid UTF-8 on the page")
			for _, r := range out {
				if r == '\n' || r == '\t' {
					continue
				}
				require.False(t, unicode.IsControl(r) || unicode.Is(unicode.Cf, r), "the page carries %U", r)
			}
		}
	})
}
