package console

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/sbtest"
)

// TestBrowserReaderCannotActAndActionsAreAudited drives a real browser with a reader's token: its
// pages have no action buttons, and a POST forged from its own page, with the page's valid CSRF token,
// is refused with 403 and changes nothing. The same browser then signs in with an operator's token,
// redrives a group through the preview, and the audit page shows the run (started, done, by bob) and
// the reader's refused attempt (by alice).
func TestBrowserReaderCannotActAndActionsAreAudited(t *testing.T) {
	tab := newBrowser(t)
	h := sbtest.New(t)
	h.Seed(t, "perm-1", "perm-2")
	audit := filepath.Join(t.TempDir(), "audit.jsonl")
	c, err := New(h.Client, entitiesOf(h), &Options{Tokens: twoRoles, AuditFile: audit})
	require.NoError(t, err)
	s := serve(t, h, c)

	// The reader: ?token= sets the cookie and leaves the address bar.
	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(s.srv.URL+"/?token="+readerSecret),
		chromedp.WaitVisible(chromedp.ID("entities")),
	))
	loc, err := chromedp.Run(tab, chromedp.Location())
	require.NoError(t, err)
	assert.NotContains(t, loc, readerSecret)
	click(t, tab, `tr[data-entity="orders"] a.dlq-link`)
	require.NoError(t, chromedp.Do(tab, chromedp.WaitVisible(chromedp.ID("groups"))))
	click(t, tab, "#groups a.group-link")
	require.NoError(t, chromedp.Do(tab, chromedp.WaitVisible(chromedp.ID("group-count"))))
	assert.Equal(t, "alice (reader: read only)", text(t, tab, "#who"))
	controls, err := chromedp.Run(tab, chromedp.Evaluate[int](`[...document.querySelectorAll("button, form, input[type=checkbox]")].filter(el => !el.closest("#search")).length`))
	require.NoError(t, err)
	assert.Zero(t, controls, "a reader's page has no action controls (the search box reads only)")
	group, err := chromedp.Run(tab, chromedp.Evaluate[string](`new URLSearchParams(location.search).get("g")`))
	require.NoError(t, err)
	require.NotEmpty(t, group)
	screenshot(t, tab, "console-reader.png")

	// A POST forged from the reader's own page: same origin, its cookie, the page's CSRF token.
	forge := func(path string) int {
		status, err := chromedp.Run(tab, chromedp.Evaluate[int](`fetch("`+path+`", {method: "POST", credentials: "same-origin",
			body: new URLSearchParams({csrf: document.querySelector("meta[name=csrf]").content, e: "orders", g: "`+group+`", action: "purge", confirm: "yes", digest: "00"})})
			.then(r => r.status)`, chromedp.EvalAwaitPromise))
		require.NoError(t, err)
		return status
	}
	assert.Equal(t, 403, forge("action/preview"))
	assert.Equal(t, 403, forge("action/run"))
	assert.Equal(t, 2, h.Stats(t).DeadLettered, "the reader changed nothing")

	// The operator, in the same browser.
	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(s.srv.URL+"/group?e=orders&g="+group+"&token="+operatorSecret),
		chromedp.WaitVisible(chromedp.ID("redrive-group")),
	))
	click(t, tab, "#redrive-group")
	require.NoError(t, chromedp.Do(tab, chromedp.WaitVisible(chromedp.ID("preview-items"))))
	click(t, tab, "#run")
	require.NoError(t, chromedp.Do(tab, chromedp.WaitVisible(chromedp.ID("result-summary"))))
	assert.Equal(t, "Resubmitted 2 of 2 to orders", text(t, tab, "#result-summary"))
	assert.Equal(t, 0, h.Stats(t).DeadLettered)

	click(t, tab, "header a.nav")
	require.NoError(t, chromedp.Do(tab, chromedp.WaitVisible(chromedp.ID("audit"))))
	rows, err := chromedp.Run(tab, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#audit tr.audit-record")].map(r => [r.dataset.who, r.dataset.action, r.dataset.step, r.dataset.outcome].join(" "))`))
	require.NoError(t, err)
	assert.Equal(t, []string{
		"bob redrive run done",
		"bob redrive run started",
		"alice purge run refused",
		"alice purge preview refused",
	}, rows)
	screenshot(t, tab, "console-audit.png")
	recs := readAudit(t, audit)
	require.Len(t, recs, 4)
	assert.Equal(t, 2, recs[3].Done)
	for _, r := range recs {
		assert.False(t, strings.Contains(r.Who, "secret"))
	}
}

// TestBrowserReleaseAHeldSession drives a real browser through a session queue: the overview links
// its held sessions, the page shows the held session, and its release is previewed and run.
func TestBrowserReleaseAHeldSession(t *testing.T) {
	tab := newBrowser(t)
	h := sbtest.NewSessions(t)
	h.Hold(t, "order-17", "", "a-1", "a-2", "a-3")
	before := h.Snapshot(t, "order-17")
	s := sessionSite(t, h, nil)
	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(s.srv.URL+"/"),
		chromedp.WaitVisible(chromedp.ID("entities")),
	))
	click(t, tab, `tr[data-entity="jobs"] a.sessions-link`)
	require.NoError(t, chromedp.Do(tab, chromedp.WaitVisible(chromedp.ID("sessions"))))
	status, err := chromedp.Run(tab, chromedp.Evaluate[string](`document.querySelector('tr[data-session="order-17"]').dataset.status`))
	require.NoError(t, err)
	assert.Equal(t, "held", status)
	screenshot(t, tab, "console-sessions.png")
	click(t, tab, `tr[data-session="order-17"] button.release`)
	require.NoError(t, chromedp.Do(tab, chromedp.WaitVisible(chromedp.ID("run"))))
	click(t, tab, "#run")
	require.NoError(t, chromedp.Do(tab, chromedp.WaitVisible(chromedp.ID("result-summary"))))
	assert.Equal(t, "Released session order-17 of jobs", text(t, tab, "#result-summary"))
	assert.NotEqual(t, before.State, h.Snapshot(t, "order-17").State)
}
