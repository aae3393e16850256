package console

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/sbtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, sbtest.IgnoreSDKLeak(), goleak.Cleanup(func(code int) {
		removeBenchIndex()
		os.Exit(code)
	}))
}

// site is a console on an emulator harness, served on loopback, and a browser-like client: a cookie
// jar, and the Origin header a browser sends with a form.
type site struct {
	*sbtest.Harness
	c      *Console
	srv    *httptest.Server
	client *http.Client
}

// entitiesOf is the harness's entity as the console is given it.
func entitiesOf(h *sbtest.Harness) []Entity {
	return []Entity{{Path: h.Entity, RetryQueue: h.RetryQueue}}
}

func newSite(t *testing.T, h *sbtest.Harness, opts *Options) *site {
	t.Helper()
	c, err := New(h.Client, entitiesOf(h), opts)
	require.NoError(t, err)
	return serve(t, h, c)
}

func serve(t testing.TB, h *sbtest.Harness, c *Console) *site {
	t.Helper()
	return serveHandler(t, h, c, c)
}

// serveHandler serves handler, which mounts c somewhere.
func serveHandler(t testing.TB, h *sbtest.Harness, c *Console, handler http.Handler) *site {
	t.Helper()
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &site{Harness: h, c: c, srv: srv, client: &http.Client{Jar: jar, Timeout: sbtest.Timeout}}
}

// get fetches path and returns the status and body.
func (s *site) get(t testing.TB, path string) (int, string) {
	t.Helper()
	resp, err := s.client.Get(s.srv.URL + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

var csrfPattern = regexp.MustCompile(`name="csrf" (?:value|content)="([0-9a-f]+)"`)

// token is the CSRF token of the page at path (the visit also sets the cookie).
func (s *site) token(t testing.TB, path string) string {
	t.Helper()
	code, body := s.get(t, path)
	require.Equal(t, http.StatusOK, code, body)
	m := csrfPattern.FindStringSubmatch(body)
	require.NotNil(t, m, "no CSRF token on %s", path)
	return m[1]
}

// post submits form to path as a browser on the console's own page would.
func (s *site) post(t testing.TB, path string, form url.Values) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.srv.URL+path, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", s.srv.URL)
	resp, err := s.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

var (
	digestPattern = regexp.MustCompile(`name="digest" value="([0-9a-f]+)"`)
	groupPattern  = regexp.MustCompile(`data-group="([0-9a-f]+)"`)
	refPattern    = regexp.MustCompile(`data-ref="([^"]+)"`)
)

// groups are the failure group ids of the entity's dead-letter page, largest first.
func (s *site) groups(t *testing.T) []string {
	t.Helper()
	code, body := s.get(t, "/deadletters?e="+url.QueryEscape(s.Entity))
	require.Equal(t, http.StatusOK, code, body)
	var out []string
	for _, m := range groupPattern.FindAllStringSubmatch(body, -1) {
		out = append(out, m[1])
	}
	return out
}

// preview posts an action's preview and returns the status, the body, the digest and the refs shown.
func (s *site) preview(t *testing.T, form url.Values) (int, string, string, []string) {
	t.Helper()
	form.Set("csrf", s.token(t, "/"))
	form.Set("e", s.Entity)
	code, body := s.post(t, "/action/preview", form)
	var digest string
	if m := digestPattern.FindStringSubmatch(body); m != nil {
		digest = m[1]
	}
	var refs []string
	for _, m := range refPattern.FindAllStringSubmatch(body, -1) {
		refs = append(refs, unescape(m[1]))
	}
	return code, body, digest, refs
}

// run posts the run of a previewed action.
func (s *site) run(t *testing.T, form url.Values, digest string) (int, string) {
	t.Helper()
	form.Set("csrf", s.token(t, "/"))
	form.Set("e", s.Entity)
	form.Set("digest", digest)
	return s.post(t, "/action/run", form)
}

func unescape(s string) string {
	return strings.NewReplacer("&#36;", "$", "&amp;", "&", "&#43;", "+").Replace(s)
}

func regexpMust(p string) *regexp.Regexp { return regexp.MustCompile(p) }

// azservicebusDLQ opens a dead-letter queue.
var azservicebusDLQ = azservicebus.ReceiverOptions{SubQueue: azservicebus.SubQueueDeadLetter}

// originalID is the retry envelope's original MessageID of m, else its MessageID.
func originalID(m *azservicebus.ReceivedMessage) string {
	if env, err := envelope.Decode(m); err == nil && env.OriginalMessageID != "" {
		return env.OriginalMessageID
	}
	return m.MessageID
}
