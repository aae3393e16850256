package console

import (
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/sbtest"
	"github.com/sbretry/retry/retryindex"
)

// updateScreenshots writes the browser test's screenshots into docs/ for the README, instead of the
// test's temporary directory: go test ./console -run TestBrowser -update-screenshots.
var updateScreenshots = flag.Bool("update-screenshots", false, "write the console screenshots into docs/")

// browserTimeout bounds the whole browser test, every wait included.
const browserTimeout = 90 * time.Second

// chromiumPath finds a Chromium or Chrome binary: $CHROMIUM, else the usual names on PATH.
func chromiumPath() string {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// newBrowser starts a headless Chromium with a fresh profile and returns a tab's context, bounded by
// browserTimeout; the browser is stopped when the test ends.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	path := chromiumPath()
	if path == "" {
		t.Skip("no chromium binary (install Debian's chromium, as .ci/run does, or set $CHROMIUM): the real-browser test is skipped")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	}
	timeout, cancelTimeout := context.WithTimeout(context.Background(), browserTimeout)
	alloc, cancelAlloc := chromedp.NewExecAllocator(timeout, opts...)
	tab, cancelTab := chromedp.NewContext(alloc, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc() // waits for the browser process to exit
		cancelTimeout()
	})
	_, err := chromedp.Run(tab, chromedp.Evaluate[int]("1"))
	require.NoError(t, err, "starting %s", path)
	return tab
}

// screenshot saves a full-page PNG named name, into docs/ with -update-screenshots.
func screenshot(t *testing.T, tab context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(tab, chromedp.FullScreenshot(100)) // 100 makes a PNG; less, a JPEG
	require.NoError(t, err)
	dir := t.TempDir()
	if *updateScreenshots {
		dir = filepath.Join("..", "docs")
		require.NoError(t, os.MkdirAll(dir, 0o755))
	}
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, png, 0o644))
	t.Logf("screenshot %s (%d bytes)", p, len(png))
}

// click clicks the element sel (a CSS selector) from a script, and text reads an element's text the
// same way. Both query the document as it is when they run: chromedp's node-based Click and Text keep
// node ids, which a document replaced in between (a navigation that lands just then) invalidates ("No
// node with given id found").
func click(t *testing.T, tab context.Context, sel string) {
	t.Helper()
	_, err := chromedp.Run(tab, chromedp.Evaluate[bool](`(() => { const el = document.querySelector(`+strconv.Quote(sel)+`); if (!el) throw new Error("no "+`+strconv.Quote(sel)+`); el.click(); return true })()`))
	require.NoError(t, err, "clicking %s", sel)
}

func text(t *testing.T, tab context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(tab, chromedp.Evaluate[string](`(() => { const el = document.querySelector(`+strconv.Quote(sel)+`); if (!el) throw new Error("no "+`+strconv.Quote(sel)+`); return el.innerText })()`))
	require.NoError(t, err, "reading %s", sel)
	return s
}

// TestBrowserRedriveAGroup drives a real browser through the console: it opens the overview, follows
// an entity to its failure groups, opens the largest, previews and runs its redrive, and checks the
// broker through the SDK: exactly the previewed dead letters left the dead-letter queue and came back
// as fresh deliveries with the MessageIDs the preview showed.
func TestBrowserRedriveAGroup(t *testing.T) {
	tab := newBrowser(t)
	h := sbtest.New(t)
	h.Seed(t, "perm-1", "perm-2", "max-1", "pending-1")
	c, err := New(h.Client, entitiesOf(h), &Options{PollInterval: 50 * time.Millisecond, Window: time.Minute})
	require.NoError(t, err)
	polls := make(chan struct{}, 1)
	c.polled = func() {
		select {
		case polls <- struct{}{}:
		default:
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		<-ran
	})
	for range 3 { // a few samples for the charts
		select {
		case <-polls:
		case <-time.After(sbtest.Timeout):
			t.Fatal("no poll")
		}
	}
	s := serve(t, h, c)

	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(s.srv.URL+"/"),
		chromedp.WaitVisible(chromedp.ID("entities")),
		chromedp.WaitVisible(chromedp.CSS(`body[data-charts="ready"]`)),
		chromedp.WaitVisible(chromedp.CSS(".uplot")),
	))

	click(t, tab, `tr[data-entity="orders"] a.dlq-link`)
	require.NoError(t, chromedp.Do(tab, chromedp.WaitVisible(chromedp.ID("groups"))))
	click(t, tab, "#groups a.group-link") // the largest group is first
	require.NoError(t, chromedp.Do(tab, chromedp.WaitVisible(chromedp.ID("group-count"))))
	count := text(t, tab, "#group-count")
	pattern := text(t, tab, "#group-pattern")
	assert.Equal(t, "2 dead letters: RetryPermanentFailure", count)
	assert.Equal(t, "invalid payload in perm-<n>", pattern)
	screenshot(t, tab, "console-group.png")

	click(t, tab, "#redrive-group")
	require.NoError(t, chromedp.Do(tab, chromedp.WaitVisible(chromedp.ID("preview-items"))))
	previewRefs, err := chromedp.Run(tab, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#preview-items tr.item")].map(r => r.dataset.ref)`))
	require.NoError(t, err)
	resubmitIDs, err := chromedp.Run(tab, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#preview-items tr.item td:last-child")].map(td => td.textContent)`))
	require.NoError(t, err)
	require.Len(t, previewRefs, 2)
	assert.Equal(t, 3, h.Stats(t).DeadLettered, "the preview changed nothing")

	click(t, tab, "#run")
	require.NoError(t, chromedp.Do(tab, chromedp.WaitVisible(chromedp.ID("result-summary"))))
	assert.Equal(t, "Resubmitted 2 of 2 to orders", text(t, tab, "#result-summary"))

	// The overview afterwards: a few more polls, so that its charts show the dead letters leaving and
	// the fresh deliveries arriving.
	for range 3 {
		select {
		case <-polls:
		case <-time.After(sbtest.Timeout):
			t.Fatal("no poll")
		}
	}
	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(s.srv.URL+"/"),
		chromedp.WaitVisible(chromedp.CSS(`body[data-charts="ready"]`)),
	))
	screenshot(t, tab, "console-overview.png")

	// The pending-retry timeline draws its bars too.
	click(t, tab, `tr[data-entity="orders"] a[href^="pending"]`)
	require.NoError(t, chromedp.Do(tab,
		chromedp.WaitVisible(chromedp.ID("pending")),
		chromedp.WaitVisible(chromedp.CSS(`body[data-charts="ready"]`)),
		chromedp.WaitVisible(chromedp.CSS("#timeline-chart .uplot")),
	))
	screenshot(t, tab, "console-pending.png")

	// The broker, through the SDK: the previewed refs are gone from the dead-letter queue, max-1 stays,
	// and the queue holds the fresh deliveries under the previewed MessageIDs.
	sctx := sbtest.Context(t)
	dlq, err := h.Client.NewReceiverForQueue(sbtest.Queue, &azservicebusDLQ)
	require.NoError(t, err)
	defer func() { _ = dlq.Close(sctx) }()
	left, err := dlq.PeekMessages(sctx, 10, nil)
	require.NoError(t, err)
	require.Len(t, left, 1)
	assert.Equal(t, "max-1", originalID(left[0]))
	for _, ref := range previewRefs {
		assert.NotEqual(t, "orders/$DeadLetterQueue:"+itoa(int(*left[0].SequenceNumber)), ref)
	}
	q, err := h.Client.NewReceiverForQueue(sbtest.Queue, nil)
	require.NoError(t, err)
	defer func() { _ = q.Close(sctx) }()
	live, err := q.PeekMessages(sctx, 10, nil)
	require.NoError(t, err)
	var active []string
	for _, m := range live {
		if !strings.HasPrefix(m.MessageID, "sbretry-resubmit-") {
			continue
		}
		active = append(active, m.MessageID)
	}
	slices.Sort(active)
	slices.Sort(resubmitIDs)
	assert.Equal(t, resubmitIDs, active)
}

// TestBrowserSearchFindsAPendingRetry is issue 33's "done" as a new user tries it: a consumer left a
// retry pending, a tailer indexed it from the broker, and an operator types the id into the search box
// of the overview and reads "will be retried at …, attempt n of m", with its history and freshness;
// then the same box on the answer page, without an index, reads the broker and says the same.
func TestBrowserSearchFindsAPendingRetry(t *testing.T) {
	tab := newBrowser(t)
	h := sbtest.New(t)
	h.Seed(t, "pending-1", "perm-1")
	path := filepath.Join(t.TempDir(), "index.db")
	store, err := retryindex.OpenSQLite(path, nil)
	require.NoError(t, err)
	tailer, err := retryindex.NewTailer(h.Client, store, h.Entity, nil)
	require.NoError(t, err)
	_, err = tailer.Poll(sbtest.Context(t))
	require.NoError(t, err)
	require.NoError(t, store.Close())
	idx, err := retryindex.OpenSQLite(path, &retryindex.SQLiteOptions{ReadOnly: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = idx.Close() })
	ents := entitiesOf(h)
	ents[0].MaxAttempts = 2 // as Seed's consumer
	withIndex, err := New(h.Client, ents, &Options{Index: idx})
	require.NoError(t, err)
	s := serve(t, h, withIndex)

	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(s.srv.URL+"/"),
		chromedp.WaitVisible(chromedp.ID("entities")),
		chromedp.SendKeys(chromedp.ID("search-q"), "pending-1"+kb.Enter),
		chromedp.WaitVisible(chromedp.CSS(`#search-answer[data-from="index"]`)),
	))
	state := text(t, tab, `.finding[data-state="pending"] .finding-state`)
	assert.Regexp(t, `^Will be retried at \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ, attempt 2 of 2 \(in (?:5\dm\d+s|1h0m0s)\)$`, state)
	assert.Contains(t, text(t, tab, ".finding .history"), "retry scheduled")
	assert.Contains(t, text(t, tab, "#freshness"), "From the retry-state index, as of")
	assert.Contains(t, text(t, tab, "#freshness"), "tailer orders")
	assert.Equal(t, "pending-1", text(t, tab, "#search-query"))
	screenshot(t, tab, "console-search.png")

	// The same console without an index: the box on this page reads the broker.
	withoutIndex, err := New(h.Client, ents, nil)
	require.NoError(t, err)
	s2 := serve(t, h, withoutIndex)
	require.NoError(t, chromedp.Do(tab,
		chromedp.Navigate(s2.srv.URL+"/search?q=perm-1"),
		chromedp.WaitVisible(chromedp.CSS(`#search-answer[data-from="broker"] .finding[data-state="dead-lettered"]`)),
	))
	boxed, err := chromedp.Run(tab, chromedp.Evaluate[string](`(() => { const q = document.getElementById("search-q"); const v = q.value; q.value = ""; return v })()`))
	require.NoError(t, err)
	assert.Equal(t, "perm-1", boxed, "the answer page keeps the query in its box")
	require.NoError(t, chromedp.Do(tab,
		chromedp.SendKeys(chromedp.ID("search-q"), "corr-pending-1"+kb.Enter),
		chromedp.WaitVisible(chromedp.CSS(`#search-answer[data-from="broker"] .finding[data-state="pending"]`)),
	))
	assert.Equal(t, "corr-pending-1", text(t, tab, "#search-query"))
	due, _, _ := strings.Cut(state, " (in ")
	assert.True(t, strings.HasPrefix(text(t, tab, `.finding[data-state="pending"] .finding-state`), due+" (in "), "the broker's answer is the index's: %s", due)
}
