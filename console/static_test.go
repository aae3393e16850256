package console

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/sbtest"
)

// TestStaticAssets: the vendored uPlot, its licence and the console's own script and styles are served
// from the binary, and the pages load them from there only (the CSP allows nothing else).
func TestStaticAssets(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	s := newSite(t, h, nil)
	for path, want := range map[string]string{
		"/static/uplot/uPlot.iife.min.js": "uPlot",
		"/static/uplot/uPlot.min.css":     ".uplot",
		"/static/uplot/LICENSE":           "MIT",
		"/static/console.js":              "new uPlot(",
		"/static/console.css":             "body",
	} {
		code, body := s.get(t, path)
		require.Equal(t, http.StatusOK, code, path)
		assert.Contains(t, body, want, path)
	}
	code, body := s.get(t, "/")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `<script src="static/uplot/uPlot.iife.min.js" defer></script>`)
	assert.Contains(t, body, `data-series="api/series"`)
	code, body = s.get(t, "/pending?e=orders")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `data-timeline="api/timeline?e=orders"`)

	resp, err := s.client.Get(s.srv.URL + "/")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "script-src 'self'")
	assert.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"))
}

// TestMountedUnderAPrefix: mounted with http.StripPrefix, every page's links resolve under the prefix
// (through <base>), and an action posted there works.
func TestMountedUnderAPrefix(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1")
	c, err := New(h.Client, entitiesOf(h), nil)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/ops/", http.StripPrefix("/ops", c))
	s := serveHandler(t, h, c, mux)
	code, body := s.get(t, "/ops/")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `<base href="/ops/">`)
	assert.NotRegexp(t, `(<a|<link)[^>]*href="/|src="/|action="/`, body, "no link escapes the prefix")
	code, _ = s.get(t, "/ops/static/uplot/uPlot.iife.min.js")
	assert.Equal(t, http.StatusOK, code)
	code, body = s.get(t, "/ops/deadletters?e=orders")
	require.Equal(t, http.StatusOK, code, body)
	g := groupPattern.FindStringSubmatch(body)
	require.NotNil(t, g)
	form := url.Values{"action": {"purge"}, "g": {g[1]}, "e": {"orders"}, "csrf": {s.token(t, "/ops/")}}
	code, body = s.post(t, "/ops/action/preview", form)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `action="action/run"`)
	form.Set("digest", digestPattern.FindStringSubmatch(body)[1])
	form.Set("confirm", "1")
	code, body = s.post(t, "/ops/action/run", form)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, 0, h.Stats(t).DeadLettered)
}
