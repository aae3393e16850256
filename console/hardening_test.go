package console

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/sbtest"
)

// getHost fetches path with the Host header set to host, without following redirects.
func (s *site) getHost(t *testing.T, host, path string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.srv.URL+path, nil)
	require.NoError(t, err)
	if host != "" {
		req.Host = host
	}
	client := &http.Client{Timeout: sbtest.Timeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	return resp
}

// TestHostGuardWithoutToken: a console without an access token answers only to loopback Host names
// and the AllowedHosts, so a rebound DNS name of another site cannot read its pages or post its forms.
func TestHostGuardWithoutToken(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	s := newSite(t, h, nil)
	assert.Equal(t, http.StatusMisdirectedRequest, s.getHost(t, "evil.example:8080", "/").StatusCode)
	assert.Equal(t, http.StatusMisdirectedRequest, s.getHost(t, "evil.example", "/static/console.js").StatusCode)
	for _, host := range []string{"", "localhost:8080", "127.0.0.1", "[::1]:80"} {
		assert.Equal(t, http.StatusOK, s.getHost(t, host, "/").StatusCode, host)
	}
	allowed := newSite(t, h, &Options{AllowedHosts: []string{"ops.internal"}})
	assert.Equal(t, http.StatusOK, allowed.getHost(t, "OPS.internal:443", "/").StatusCode)
	assert.Equal(t, http.StatusMisdirectedRequest, allowed.getHost(t, "evil.example", "/").StatusCode)
	// With a token, the token is the protection: any Host, but not without the token.
	tokened := newSite(t, h, &Options{AccessToken: "t0ken"})
	assert.Equal(t, http.StatusUnauthorized, tokened.getHost(t, "evil.example", "/").StatusCode)
}

// TestTokenRedirectStaysOnTheConsole: the redirect after ?token= never leaves the host, whatever the
// path (a scheme-relative "//host" would).
func TestTokenRedirectStaysOnTheConsole(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	s := newSite(t, h, &Options{AccessToken: "t0ken"})
	for _, p := range []string{"//evil.example/x?token=t0ken", "/\\evil.example?token=t0ken", "/pending?e=orders&token=t0ken"} {
		resp := s.getHost(t, "", p)
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, p)
		loc := resp.Header.Get("Location")
		assert.True(t, strings.HasPrefix(loc, "/") && !strings.HasPrefix(loc, "//") && !strings.HasPrefix(loc, "/\\"), "%s redirects to %q", p, loc)
		assert.NotContains(t, loc, "t0ken")
	}
}

// TestStaticDirectoriesAreNotListed: the static files are served, their directories are not listed.
func TestStaticDirectoriesAreNotListed(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	s := newSite(t, h, nil)
	code, _ := s.get(t, "/static/console.js")
	assert.Equal(t, http.StatusOK, code)
	for _, p := range []string{"/static/", "/static/uplot/"} {
		code, body := s.get(t, p)
		assert.Equal(t, http.StatusNotFound, code, p)
		assert.NotContains(t, body, "uPlot", p)
	}
}

// TestHugePageNumberIsRefused: a page number that would overflow page × page size is a 400, not a
// panic.
func TestHugePageNumberIsRefused(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1")
	s := newSite(t, h, nil)
	g := s.groups(t)[0]
	code, body := s.get(t, "/group?e=orders&g="+g+"&page=184467440737095517")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "is not a number from 0 to")
}

// TestReasonsAndPropertyNamesAreRedacted: a dead-letter reason, and a property name, carry whatever
// the application wrote, a connection string's key included; no page shows it.
func TestReasonsAndPropertyNamesAreRedacted(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	const secret = "c2VjcmV0LWtleS12YWx1ZQ=="
	ctx := sbtest.Context(t)
	m := sbtest.Message("leaky-1")
	m.ApplicationProperties = map[string]any{"SharedAccessKey=" + secret: "x"}
	h.Send(t, m)
	r, err := h.Client.NewReceiverForQueue(sbtest.Queue, nil)
	require.NoError(t, err)
	defer func() { _ = r.Close(ctx) }()
	got, err := r.ReceiveMessages(ctx, 1, nil)
	require.NoError(t, err)
	require.Len(t, got, 1)
	reason := "connect failed: Endpoint=sb://x/;SharedAccessKeyName=k;SharedAccessKey=" + secret
	require.NoError(t, r.DeadLetterMessage(ctx, got[0], &azservicebus.DeadLetterOptions{Reason: &reason}))

	s := newSite(t, h, nil)
	g := s.groups(t)[0]
	for _, p := range []string{"/deadletters?e=orders", "/group?e=orders&g=" + g, "/message?e=orders&ref=" + url.QueryEscape("orders/$DeadLetterQueue:1")} {
		code, body := s.get(t, p)
		require.Equal(t, http.StatusOK, code, p)
		assert.NotContains(t, body, secret, p)
	}
	_, body, _, _ := s.preview(t, url.Values{"action": {"purge"}, "g": {g}})
	assert.NotContains(t, body, secret, "the preview")
}

// TestTooManyRefsAreRefused: an action form names at most twice MaxPeek references (the two
// dead-letter queues of a subscription are each read up to MaxPeek), the most a selection, or all that
// a filter matched, can have been made from.
func TestTooManyRefsAreRefused(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	s := newSite(t, h, &Options{MaxPeek: 2})
	code, body, _, _ := s.preview(t, url.Values{"action": {"purge"}, "ref": {"orders/$DeadLetterQueue:1", "orders/$DeadLetterQueue:2", "orders/$DeadLetterQueue:3", "orders/$DeadLetterQueue:4", "orders/$DeadLetterQueue:5"}})
	assert.Equal(t, http.StatusRequestEntityTooLarge, code)
	assert.Contains(t, body, "at most 4")
}

// TestRunNeedsCSRF: the run of an action, with a valid digest from its preview, is refused without the
// CSRF token or from another site, and nothing is done.
func TestRunNeedsCSRF(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1")
	s := newSite(t, h, nil)
	form := url.Values{"action": {"purge"}, "ref": {"orders/$DeadLetterQueue:1"}, "confirm": {"yes"}}
	code, body, digest, _ := s.preview(t, form)
	require.Equal(t, http.StatusOK, code, body)
	require.NotEmpty(t, digest)
	post := func(csrf, origin string) int {
		f := url.Values{}
		for k, v := range form { // the preview added its own csrf and e
			f[k] = v
		}
		f.Set("e", "orders")
		f.Set("digest", digest)
		f.Set("csrf", csrf)
		req, err := http.NewRequest(http.MethodPost, s.srv.URL+"/action/run", strings.NewReader(f.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", origin)
		resp, err := s.client.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
		return resp.StatusCode
	}
	tok := s.token(t, "/")
	assert.Equal(t, http.StatusForbidden, post(strings.Repeat("0", 64), s.srv.URL))
	assert.Equal(t, http.StatusForbidden, post(tok, "http://evil.example"))
	assert.Equal(t, 1, h.Stats(t).DeadLettered, "nothing was purged")
	assert.Equal(t, http.StatusOK, post(tok, s.srv.URL), "the same run with its token and origin")
	assert.Equal(t, 0, h.Stats(t).DeadLettered)
}
