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
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/sbtest"
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
