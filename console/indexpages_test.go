package console

import (
	"context"
	"encoding/json"
	"html"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/retryindex"
)

// tailedIndex is an index in a temporary file fed from h's entities by a real tailer, one poll: what
// the broker holds now, with each copy's and dead letter's sequence number.
func tailedIndex(t *testing.T, h *sbtest.Harness) *retryindex.SQLite {
	t.Helper()
	store, err := retryindex.OpenSQLite(filepath.Join(t.TempDir(), "index.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	tail(t, h, store)
	return store
}

// tail polls h's entities into store once.
func tail(t *testing.T, h *sbtest.Harness, store retryindex.Store) {
	t.Helper()
	tl, err := retryindex.NewTailer(h.Client, store, h.Entity, &retryindex.TailerOptions{RetryQueue: h.RetryQueue})
	require.NoError(t, err)
	_, err = tl.Poll(sbtest.Context(t))
	require.NoError(t, err)
}

// indexedSelection is the refs an index-backed page offers for an action, each with its expect field.
var indexedSelection = regexp.MustCompile(`name="ref" value="([^"]+)"><input type="hidden" name="expect" value="([^"]+)">`)

// offered returns the page's selectable refs and, by ref, the expect field that goes with it.
func offered(t *testing.T, body string) ([]string, map[string]string) {
	t.Helper()
	var refs []string
	expect := map[string]string{}
	for _, m := range indexedSelection.FindAllStringSubmatch(body, -1) {
		ref := html.UnescapeString(m[1])
		refs = append(refs, ref)
		expect[ref] = html.UnescapeString(m[2])
	}
	return refs, expect
}

// TestPagesFromIndex: with an index, the overview's counts, the pending page, its chart and the
// dead-letter page answer from it (exact counts, due order, the freshness with the feed that wrote),
// each saying so; from=broker reads the broker instead, and says so.
func TestPagesFromIndex(t *testing.T) {
	t.Parallel()
	for _, layout := range []struct {
		name string
		new  func(testing.TB) *sbtest.Harness
	}{{"queue", sbtest.New}, {"subscription", sbtest.NewSubscription}} {
		t.Run(layout.name, func(t *testing.T) {
			t.Parallel()
			h := layout.new(t)
			h.Seed(t, "pending-1", "pending-2", "pending-3", "max-1", "perm-1")
			store := tailedIndex(t, h)
			s := newSite(t, h, &Options{Index: store})
			esc := url.QueryEscape(h.Entity)

			code, body := s.get(t, "/")
			require.Equal(t, http.StatusOK, code, body)
			assert.Contains(t, body, `<table id="entities" data-from="index">`)
			assert.Regexp(t, `class="num index-pending">3<`, body)
			assert.Regexp(t, `class="num index-dead">2<`, body)
			assert.Contains(t, body, "From the retry-state index, as of")
			assert.Contains(t, body, "tailer ")

			code, body = s.get(t, "/pending?e="+esc)
			require.Equal(t, http.StatusOK, code, body)
			assert.Contains(t, body, `id="freshness" data-from="index"`)
			assert.Contains(t, body, `<h2 id="pending-total">3 pending retries, earliest due first</h2>`)
			assert.Equal(t, 3, strings.Count(body, `<tr class="indexed"`))
			refs, _ := offered(t, body)
			assert.Len(t, refs, 3, "each copy can be cancelled")
			assert.Contains(t, body, `id="read-broker"`)

			code, body = s.get(t, "/deadletters?e="+esc)
			require.Equal(t, http.StatusOK, code, body)
			assert.Contains(t, body, `<h2 id="deadletter-total">2 dead letters in 2 failure groups among the 2 most recent</h2>`)
			refs, _ = offered(t, body)
			assert.Len(t, refs, 2)
			for _, id := range []string{"max-1", "perm-1"} {
				assert.Regexp(t, `<tr class="indexed"[^\n]*\n<td><a href="message\?[^"]+">`+id+`</a></td>`, body, "each row names the original MessageID")
			}

			code, body = s.get(t, "/api/timeline?e="+esc)
			require.Equal(t, http.StatusOK, code, body)
			var tl timeline
			require.NoError(t, json.Unmarshal([]byte(body), &tl))
			assert.True(t, tl.FromIndex)
			assert.Equal(t, 3, tl.Total)

			code, body = s.get(t, "/pending?e="+esc+"&from=broker")
			require.Equal(t, http.StatusOK, code, body)
			assert.Contains(t, body, `id="freshness" data-from="broker"`)
			assert.NotContains(t, body, `data-partial`)
			assert.Contains(t, body, "api/timeline?e="+h.Entity+"&amp;from=broker")
			code, body = s.get(t, "/api/timeline?e="+esc+"&from=broker")
			require.Equal(t, http.StatusOK, code, body)
			require.NoError(t, json.Unmarshal([]byte(body), &tl))
			assert.False(t, tl.FromIndex)
		})
	}
}

// TestIndexPagesBeyondThePeekBound: the index lists every pending retry in true due order with the
// exact total, whatever MaxPeek, and pages by its own cursor; the chart counts every one. Without an index the same backlog is read up to
// MaxPeek, and the page and the overview say the answer is partial.
func TestIndexPagesBeyondThePeekBound(t *testing.T) {
	t.Parallel()
	const n = 12
	// Recorded latest due first: the index orders by due time, not by arrival.
	var recs []retryindex.Record
	for i := range n {
		r := recordOf("order-"+itoa(i), int64(100+i), sbtest.Queue)
		r.Kind, r.Attempt, r.NextAttempt, r.At = retryindex.KindScheduled, 1, 2, searchNow.Add(-time.Minute)
		r.NextDue = searchNow.Add(time.Duration(n-i) * time.Minute)
		r.Entity, r.SequenceNumber = sbtest.Queue, int64(100+i)
		recs = append(recs, r)
	}
	s := indexSite(t, fillIndex(t, recs...), Options{MaxPeek: 5, PageSize: 4})

	var seen []string
	next := "/pending?e=" + sbtest.Queue
	for next != "" {
		code, body := s.get(t, next)
		require.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, `<h2 id="pending-total">12 pending retries, earliest due first</h2>`)
		for _, m := range regexp.MustCompile(`<td>(order-\d+)</td>`).FindAllStringSubmatch(body, -1) {
			seen = append(seen, m[1])
		}
		next = ""
		if m := regexp.MustCompile(`id="next-page" href="([^"]+)"`).FindStringSubmatch(body); m != nil {
			next = "/" + html.UnescapeString(m[1])
		}
	}
	want := make([]string, n)
	for i := range n {
		want[i] = "order-" + itoa(n-1-i)
	}
	assert.Equal(t, want, seen, "every retry once, earliest due first, over more pages than MaxPeek holds")

	code, body := s.get(t, "/api/timeline?e="+sbtest.Queue)
	require.Equal(t, http.StatusOK, code, body)
	var tl timeline
	require.NoError(t, json.Unmarshal([]byte(body), &tl))
	sum := 0
	for _, c := range tl.Counts {
		sum += c
	}
	assert.Equal(t, 12, tl.Total)
	assert.Equal(t, 12, sum, "every retry drawn, more than MaxPeek")

	code, body = s.get(t, "/pending?e="+sbtest.Queue+"&cursor=nonsense")
	assert.Equal(t, http.StatusBadRequest, code, body)
}

// TestScanSaysWhenPartial: without an index, a backlog larger than MaxPeek is read up to the bound,
// and the pending page, the dead-letter page and the overview say the answer is partial instead of
// showing a count as if it were the whole.
func TestScanSaysWhenPartial(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "pending-1", "pending-2", "pending-3", "perm-1", "perm-2", "perm-3")
	s := newSite(t, h, &Options{MaxPeek: 2})
	code, body := s.get(t, "/pending?e="+h.Entity)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `data-from="broker" data-partial="true"`)
	assert.Contains(t, body, "The answer is partial")
	assert.Contains(t, body, "A retry-state index (Options.Index, sbretry serve --index) lists every one")
	code, body = s.get(t, "/deadletters?e="+h.Entity)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `data-partial="true"`)
	code, body = s.get(t, "/")
	require.Equal(t, http.StatusOK, code, body)
	assert.Regexp(t, `<td class="num">2\+</td><td class="num">2\+</td>`, body, "pending and dead letters are lower bounds")

	small := newSite(t, h, &Options{MaxPeek: 100})
	code, body = small.get(t, "/pending?e="+h.Entity)
	require.Equal(t, http.StatusOK, code, body)
	assert.NotContains(t, body, `data-partial`)
}

// TestIndexActionsVerifyAgainstTheBroker: an action started from an index-backed page peeks each
// selected message at the sequence number the index recorded and acts only when it is the message the
// index named: a cancel and a redrive go through the preview, its digest and the audit log as from any
// page; a copy gone since the index was fed, or a sequence number that holds another message, is
// refused as a stale index at the preview and at the run (audited), with nothing done.
func TestIndexActionsVerifyAgainstTheBroker(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "pending-a", "pending-b", "pending-c", "max-d", "perm-e")
	store := tailedIndex(t, h)
	audit := filepath.Join(t.TempDir(), "audit.jsonl")
	s := newSite(t, h, &Options{Index: store, AuditFile: audit, Logger: slog.New(slog.DiscardHandler)})
	esc := url.QueryEscape(h.Entity)
	require.Equal(t, 3, h.Stats(t).Scheduled)

	_, body := s.get(t, "/pending?e="+esc)
	pending, expect := offered(t, body)
	require.Len(t, pending, 3)

	t.Run("cancel of what the index names", func(t *testing.T) {
		form := url.Values{"action": {"cancel"}, "ref": {pending[0]}, "expect": {expect[pending[0]]}}
		code, body, digest, refs := s.preview(t, form)
		require.Equal(t, http.StatusOK, code, body)
		assert.Equal(t, pending[:1], refs)
		assert.Contains(t, body, `id="preview-checked"`)
		assert.Contains(t, body, `name="expect" value="`+html.EscapeString(expect[pending[0]]))
		code, body = s.run(t, form, digest)
		require.Equal(t, http.StatusOK, code, body)
		assert.Equal(t, 2, h.Stats(t).Scheduled)
	})

	t.Run("a copy gone since the index was fed", func(t *testing.T) {
		// The index still lists pending[0]: the cancel above happened behind its back.
		form := url.Values{"action": {"cancel"}, "ref": {pending[0]}, "expect": {expect[pending[0]]}}
		code, body, _, _ := s.preview(t, form)
		assert.Equal(t, http.StatusConflict, code, body)
		assert.Contains(t, body, "the retry-state index was stale")
	})

	t.Run("a sequence number that holds another message", func(t *testing.T) {
		// The index says pending-b's copy is where pending-c's is.
		ref, err := inspect.ParseRef(pending[2])
		require.NoError(t, err)
		wrong := expect[pending[1]]
		form := url.Values{"action": {"cancel"}, "ref": {ref.String()}, "expect": {ref.String() + "=" + strings.SplitN(wrong, "=", 2)[1]}}
		code, body, _, _ := s.preview(t, form)
		assert.Equal(t, http.StatusConflict, code, body)
		assert.Contains(t, body, "the retry-state index was stale")
		assert.Contains(t, body, "not &#34;"+html.EscapeString(strings.SplitN(wrong, "=", 2)[1]))
		assert.Equal(t, 2, h.Stats(t).Scheduled, "nothing cancelled")
	})

	t.Run("a copy cancelled between the preview and the run", func(t *testing.T) {
		form := url.Values{"action": {"cancel"}, "ref": {pending[1]}, "expect": {expect[pending[1]]}}
		code, body, digest, _ := s.preview(t, form)
		require.Equal(t, http.StatusOK, code, body)
		// Cancelled from a page that read the broker: the index is not told.
		behind := url.Values{"action": {"cancel"}, "ref": {pending[1]}}
		code, body, bdigest, _ := s.preview(t, behind)
		require.Equal(t, http.StatusOK, code, body)
		code, body = s.run(t, behind, bdigest)
		require.Equal(t, http.StatusOK, code, body)
		require.Equal(t, 1, h.Stats(t).Scheduled)

		code, body = s.run(t, form, digest)
		assert.Equal(t, http.StatusConflict, code, body)
		assert.Contains(t, body, "the retry-state index was stale")
		recs := readAudit(t, audit)
		last := recs[len(recs)-1]
		assert.Equal(t, "cancel", last.Action)
		assert.Equal(t, "refused", last.Outcome)
		assert.Contains(t, last.Reason, "the retry-state index was stale")
		assert.Equal(t, 1, h.Stats(t).Scheduled)
	})

	t.Run("dead letters redriven from the index's page", func(t *testing.T) {
		_, body := s.get(t, "/deadletters?e="+esc)
		dead, dexpect := offered(t, body)
		require.Len(t, dead, 2)
		for _, ref := range dead {
			assert.Regexp(t, `=(perm-e|sbretry-[0-9a-f]{40}-2)$`, dexpect[ref], "the dead letter's MessageID: the first delivery's, or the copy of its last attempt")
		}
		form := url.Values{"action": {"redrive"}, "ref": dead, "expect": {dexpect[dead[0]], dexpect[dead[1]]}}
		code, body, digest, refs := s.preview(t, form)
		require.Equal(t, http.StatusOK, code, body)
		assert.ElementsMatch(t, dead, refs)
		assert.Contains(t, body, `id="preview-checked"`)
		code, body = s.run(t, form, digest)
		require.Equal(t, http.StatusOK, code, body)
		assert.Equal(t, 0, h.Stats(t).DeadLettered)

		// The index, not fed since, still lists them: an action on one is refused as stale.
		_, body = s.get(t, "/deadletters?e="+esc)
		stale, sexpect := offered(t, body)
		require.Len(t, stale, 2)
		purge := url.Values{"action": {"purge"}, "ref": stale[:1], "expect": {sexpect[stale[0]]}}
		code, body, _, _ = s.preview(t, purge)
		assert.Equal(t, http.StatusConflict, code, body)
		assert.Contains(t, body, "the retry-state index was stale")
		assert.Contains(t, body, "is no longer in its dead-letter queue")
	})

	t.Run("a form that expects some refs and not others", func(t *testing.T) {
		form := url.Values{"action": {"cancel"}, "ref": pending[1:], "expect": {expect[pending[1]]}}
		code, body, _, _ := s.preview(t, form)
		assert.Equal(t, http.StatusBadRequest, code, body)
	})
}

// TestIndexDedicated: a console told its index is its one entity's alone lists and counts the whole
// index (no filter by source, which a store answers by a scan); a page that meets another entity's
// event leaves it out and says the option is wrong. The option needs an index and one entity.
func TestIndexDedicated(t *testing.T) {
	t.Parallel()
	s := indexSite(t, fillIndex(t, indexedEvents()...), Options{IndexDedicated: true})
	code, body := s.get(t, "/pending?e="+sbtest.Queue)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `<h2 id="pending-total">2 pending retries`, "the whole index's count: invoices' retry too")
	assert.Contains(t, body, `id="index-foreign"`)
	assert.Contains(t, body, "met 1 event of other entities")
	assert.Contains(t, body, "order-42")
	assert.NotContains(t, body, "order-5<", "another entity's event is not listed")

	shared := indexSite(t, fillIndex(t, indexedEvents()...), Options{})
	code, body = shared.get(t, "/pending?e="+sbtest.Queue)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `<h2 id="pending-total">1 pending retry,`)
	assert.NotContains(t, body, `id="index-foreign"`)

	h := sbtest.New(t)
	_, err := New(h.Client, entitiesOf(h), &Options{IndexDedicated: true})
	assert.ErrorIs(t, err, ErrInvalidOptions)
	_, err = New(h.Client, []Entity{{Path: "a"}, {Path: "b"}}, &Options{IndexDedicated: true, Index: failingIndex{}})
	assert.ErrorIs(t, err, ErrInvalidOptions)
}

// TestIndexPagesSayLostRecords: when a feed lost records (a recorder's full queue, a failed write),
// every index-backed page says how many and that the answer may miss them until a rebuild.
func TestIndexPagesSayLostRecords(t *testing.T) {
	t.Parallel()
	store := fillIndex(t, indexedEvents()...)
	require.NoError(t, store.NoteLost(context.Background(), retryindex.FeedConsumer+" billing-1", 3))
	s := indexSite(t, store, Options{})
	for _, path := range []string{"/", "/pending?e=" + sbtest.Queue, "/deadletters?e=" + sbtest.Queue, "/search?q=order-42"} {
		code, body := s.get(t, path)
		require.Equal(t, http.StatusOK, code, path)
		assert.Contains(t, body, "and lost 3 records (the last at 2026-12-07 10:00:00Z): the answer may miss what they said until a rebuild from the broker", path)
	}
}

// TestGroupFromIndex: with an index, a failure group's page lists the group's dead letters from the
// index (the dead-letter page's groups), each selectable for an action checked against the broker;
// a group the index does not have is a 404 that says where to look; from=broker reads the broker.
func TestGroupFromIndex(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1", "perm-2", "max-1")
	s := newSite(t, h, &Options{Index: tailedIndex(t, h)})
	_, body := s.get(t, "/deadletters?e="+h.Entity)
	groups := groupPattern.FindAllStringSubmatch(body, -1)
	require.Len(t, groups, 2, "invalid payload (2), timeout (1)")
	code, body := s.get(t, "/group?e="+h.Entity+"&g="+groups[0][1])
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `<table id="group-items" data-from="index">`)
	assert.Contains(t, body, `<h2 id="group-count">2 dead letters: RetryPermanentFailure</h2>`)
	assert.Contains(t, body, "Among the 3 most recent of 3 dead letters in the index")
	refs, expect := offered(t, body)
	require.Len(t, refs, 2)
	form := url.Values{"action": {"purge"}, "ref": refs, "expect": {expect[refs[0]], expect[refs[1]]}}
	code, body, digest, _ := s.preview(t, form)
	require.Equal(t, http.StatusOK, code, body)
	form.Set("confirm", "yes")
	code, body = s.run(t, form, digest)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, 1, h.Stats(t).DeadLettered)

	code, body = s.get(t, "/group?e="+h.Entity+"&g=0123456789abcdef")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, body, "among its 3 most recent dead letters in the index")
	code, body = s.get(t, "/group?e="+h.Entity+"&g="+groups[1][1]+"&from=broker")
	require.Equal(t, http.StatusOK, code, body)
	assert.NotContains(t, body, `data-from="index"`)
}

// TestTimelineFromIndexIsExact: the chart from the index is the one bucketing every due time draws,
// however many more retries there are than MaxPeek: a burst due at one instant, retries spread over
// hours, some overdue by more than the horizon (the first bar) and some due after it (Later), and
// another entity's retries left out.
func TestTimelineFromIndexIsExact(t *testing.T) {
	t.Parallel()
	var recs []retryindex.Record
	var due []time.Time
	add := func(source string, d time.Time) {
		i := len(recs)
		r := recordOf("t-"+itoa(i), int64(300+i), source)
		r.Kind, r.Attempt, r.NextAttempt, r.At, r.NextDue = retryindex.KindScheduled, 1, 2, searchNow, d
		r.Entity, r.SequenceNumber = source, int64(300+i)
		recs = append(recs, r)
		if source == sbtest.Queue {
			due = append(due, d)
		}
	}
	for i := range 8 {
		add(sbtest.Queue, searchNow.Add(time.Hour)) // a burst
		add(sbtest.Queue, searchNow.Add(time.Duration(i*37)*time.Minute+time.Duration(i)*time.Second))
		add("invoices", searchNow.Add(time.Duration(i)*time.Hour))
	}
	add(sbtest.Queue, searchNow.Add(-40*24*time.Hour))             // overdue beyond the horizon back
	add(sbtest.Queue, searchNow.Add(-3*time.Minute))               // overdue
	add(sbtest.Queue, searchNow.Add(timelineHorizon))              // at the horizon: drawn
	add(sbtest.Queue, time.Date(9000, 1, 1, 0, 0, 0, 0, time.UTC)) // after it: Later
	s := indexSite(t, fillIndex(t, recs...), Options{MaxPeek: 5})
	code, body := s.get(t, "/api/timeline?e="+sbtest.Queue)
	require.Equal(t, http.StatusOK, code, body)
	var tl timeline
	require.NoError(t, json.Unmarshal([]byte(body), &tl))
	want := bucketDueTimes(searchNow, due)
	want.FromIndex, want.AsOf = true, searchNow.Unix()
	assert.Equal(t, *want, tl)
	assert.Equal(t, 20, tl.Total)
	assert.Equal(t, 1, tl.Later)
}

// TestIndexActsBeyondThePeekBound: a dead letter behind MaxPeek others, which a read of the broker
// does not reach (its ref is "no longer" there for a scan), is found by the preview's peek at the
// sequence number the index recorded, and purged by the run, which receives past up to MaxPeek others.
func TestIndexActsBeyondThePeekBound(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1", "perm-2", "perm-3")
	s := newSite(t, h, &Options{Index: tailedIndex(t, h), MaxPeek: 2})
	_, body := s.get(t, "/deadletters?e="+h.Entity)
	refs, expect := offered(t, body)
	require.Len(t, refs, 3)
	newest := refs[0] // newest first: the last dead-lettered, the last in its queue
	last, err := inspect.ParseRef(newest)
	require.NoError(t, err)
	for _, r := range refs[1:] {
		other, err := inspect.ParseRef(r)
		require.NoError(t, err)
		require.Less(t, other.SequenceNumber, last.SequenceNumber)
	}

	scan := url.Values{"action": {"purge"}, "ref": {newest}}
	code, body, _, _ := s.preview(t, scan)
	assert.Equal(t, http.StatusConflict, code, "a read of 2 does not reach it: %s", body)

	form := url.Values{"action": {"purge"}, "ref": {newest}, "expect": {expect[newest]}}
	code, body, digest, _ := s.preview(t, form)
	require.Equal(t, http.StatusOK, code, body)
	form.Set("confirm", "yes")
	code, body = s.run(t, form, digest)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, 2, h.Stats(t).DeadLettered, "exactly the one selected was purged")
}
