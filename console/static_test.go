package console

import (
	"net/http"
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
	assert.Contains(t, body, `<script src="/static/uplot/uPlot.iife.min.js" defer></script>`)
	assert.Contains(t, body, `data-series="/api/series"`)
	code, body = s.get(t, "/pending?e=orders")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `data-timeline="/api/timeline?e=orders"`)

	resp, err := s.client.Get(s.srv.URL + "/")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "script-src 'self'")
	assert.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"))
}
