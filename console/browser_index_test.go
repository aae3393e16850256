package console

import (
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/sbtest"
)

// TestBrowserPagesFromIndex drives a real browser through the index-backed pages of a console with
// an index a tailer fed from the emulator: the overview's exact counts, the pending page with its
// freshness and its chart drawn from the index, a cancel of one retry selected there (previewed as
// checked against the broker, then run), and the dead-letter page; the broker is checked through the
// SDK after the cancel.
func TestBrowserPagesFromIndex(t *testing.T) {
	tab := newBrowser(t)
	h := sbtest.New(t)
	h.Seed(t, "pending-1", "pending-2", "pending-3", "perm-1", "max-1")
	s := newSite(t, h, &Options{Index: tailedIndex(t, h)})

	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(s.srv.URL+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#entities[data-from="index"]`)),
	))
	assert.Equal(t, "3", text(t, tab, ".index-pending"))
	assert.Equal(t, "2", text(t, tab, ".index-dead"))

	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(s.srv.URL+"/pending?e="+h.Entity),
		chromedp.WaitVisible(chromedp.CSS(`#pending[data-from="index"]`)),
		chromedp.WaitVisible(chromedp.CSS(`body[data-charts="ready"]`)),
		chromedp.WaitVisible(chromedp.CSS("#timeline-chart .uplot")),
	))
	assert.Contains(t, text(t, tab, "#freshness"), "From the retry-state index, as of")
	assert.Contains(t, text(t, tab, "#timeline-chart"), "3 pending retries by due time")
	assert.Contains(t, text(t, tab, "#timeline-chart"), "(from the retry-state index)")
	screenshot(t, tab, "console-pending-index.png")

	click(t, tab, `#pending input[name="ref"]`)
	click(t, tab, "#cancel-selected")
	require.NoError(t, chromedp.Do(tab, chromedp.WaitVisible(chromedp.ID("preview-checked"))))
	click(t, tab, "#run")
	require.NoError(t, chromedp.Do(tab, chromedp.WaitVisible(chromedp.ID("result-summary"))))
	assert.Equal(t, 2, h.Stats(t).Scheduled, "the one retry selected was cancelled")

	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(s.srv.URL+"/deadletters?e="+h.Entity),
		chromedp.WaitVisible(chromedp.CSS(`#deadletter-items[data-from="index"]`)),
	))
	assert.Contains(t, text(t, tab, "#deadletter-total"), "2 dead letters")
	screenshot(t, tab, "console-deadletters-index.png")
}
