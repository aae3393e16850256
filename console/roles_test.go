package console

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/internal/sbtest"
)

// Secrets of the role tests' tokens.
const (
	readerSecret   = "reader-secret-0123456789"
	operatorSecret = "operator-secret-0123456789"
)

// twoRoles are a reader token and an operator token.
var twoRoles = []Token{
	{Name: "alice", Secret: readerSecret, Role: RoleReader},
	{Name: "bob", Secret: operatorSecret, Role: RoleOperator},
}

// signIn visits the console with ?token=secret, which sets the token cookie for the site's client.
func (s *site) signIn(t *testing.T, secret string) {
	t.Helper()
	code, body := s.get(t, "/?token="+url.QueryEscape(secret))
	require.Equal(t, http.StatusOK, code, body)
}

func TestTokensAreValidated(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	long := strings.Repeat("s", MinTokenSecret)
	for _, tc := range []struct {
		name   string
		opts   Options
		reveal string // a secret the error must not show
	}{
		{"both AccessToken and Tokens", Options{AccessToken: "x", Tokens: []Token{{Name: "a", Secret: long, Role: RoleReader}}}, ""},
		{"no name", Options{Tokens: []Token{{Secret: long, Role: RoleReader}}}, long},
		{"name with a control character", Options{Tokens: []Token{{Name: "a\x1bb", Secret: long, Role: RoleReader}}}, long},
		{"name too long", Options{Tokens: []Token{{Name: strings.Repeat("n", 65), Secret: long, Role: RoleReader}}}, long},
		{"short secret", Options{Tokens: []Token{{Name: "a", Secret: "short-secret", Role: RoleReader}}}, "short-secret"},
		{"no role", Options{Tokens: []Token{{Name: "a", Secret: long}}}, long},
		{"unknown role", Options{Tokens: []Token{{Name: "a", Secret: long, Role: 7}}}, long},
		{"same name twice", Options{Tokens: []Token{{Name: "a", Secret: long, Role: RoleReader}, {Name: "A", Secret: long + "2", Role: RoleOperator}}}, long},
		{"same secret twice", Options{Tokens: []Token{{Name: "a", Secret: long, Role: RoleReader}, {Name: "b", Secret: long, Role: RoleOperator}}}, long},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(h.Client, entitiesOf(h), &tc.opts)
			require.ErrorIs(t, err, ErrInvalidOptions)
			if tc.reveal != "" {
				assert.NotContains(t, err.Error(), tc.reveal, "the error shows the secret")
			}
		})
	}
	_, err := New(h.Client, entitiesOf(h), &Options{Tokens: twoRoles})
	assert.NoError(t, err)
	assert.Equal(t, "reader", RoleReader.String())
	assert.Equal(t, "operator", RoleOperator.String())
}

// TestTokenSetMatchesEveryToken: each secret maps to its own token; a prefix, an extension, another
// case or nothing matches none.
func TestTokenSetMatchesEveryToken(t *testing.T) {
	t.Parallel()
	set := newTokenSet(twoRoles)
	p, ok := set.match(readerSecret)
	require.True(t, ok)
	assert.Equal(t, principal{Name: "alice", Role: RoleReader}, p)
	p, ok = set.match(operatorSecret)
	require.True(t, ok)
	assert.Equal(t, principal{Name: "bob", Role: RoleOperator}, p)
	for _, bad := range []string{"", readerSecret[:10], readerSecret + "x", strings.ToUpper(operatorSecret)} {
		_, ok := set.match(bad)
		assert.False(t, ok, "%q", bad)
	}
}

// TestReaderSeesNoActionsAndCannotAct: a reader's pages have no action forms or buttons, and every
// action it posts, even with a valid CSRF token and a digest an operator's preview made, is refused
// on the server with 403, leaving the messages alone; the operator's pages have the buttons, and its
// action runs.
func TestReaderSeesNoActionsAndCannotAct(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1", "pending-1")
	c, err := New(h.Client, entitiesOf(h), &Options{Tokens: twoRoles})
	require.NoError(t, err)
	reader, operator := serve(t, h, c), serve(t, h, c)
	reader.signIn(t, readerSecret)
	operator.signIn(t, operatorSecret)

	g := operator.groups(t)[0]
	ref := url.QueryEscape("orders/$DeadLetterQueue:1")
	pages := []string{"/group?e=orders&g=" + g, "/message?e=orders&ref=" + ref, "/pending?e=orders"}
	for _, p := range pages {
		code, body := reader.get(t, p)
		require.Equal(t, http.StatusOK, code, p)
		assert.NotContains(t, body, "action/preview", p)
		assert.NotContains(t, body, `type="checkbox"`, p)
		assert.NotContains(t, withoutSearchBox(t, body), "<button", p)
		assert.Contains(t, body, `id="who" data-role="reader">alice (reader: read only)`, p)

		code, body = operator.get(t, p)
		require.Equal(t, http.StatusOK, code, p)
		assert.Contains(t, body, "action/preview", p)
		assert.Contains(t, body, `>bob (operator)<`, p)
	}

	// The operator previews a purge; the reader replays it, with its own valid CSRF token.
	form := url.Values{"action": {"purge"}, "g": {g}, "confirm": {"yes"}}
	code, body, digest, _ := operator.preview(t, form)
	require.Equal(t, http.StatusOK, code, body)
	code, body, _, _ = reader.preview(t, url.Values{"action": {"purge"}, "g": {g}})
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "the token alice may only read")
	code, body = reader.run(t, url.Values{"action": {"purge"}, "g": {g}, "confirm": {"yes"}}, digest)
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "nothing was done")
	code, _ = reader.run(t, url.Values{"action": {"cancel"}, "ref": {"orders:3"}}, digest)
	assert.Equal(t, http.StatusForbidden, code)
	// Bearer requests are refused the same way.
	req, err := http.NewRequest(http.MethodPost, reader.srv.URL+"/action/run", strings.NewReader(url.Values{"action": {"purge"}, "e": {"orders"}, "g": {g}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+readerSecret)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", reader.srv.URL)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Equal(t, 1, h.Stats(t).DeadLettered, "the reader purged nothing")
	assert.Equal(t, 1, h.Stats(t).Scheduled, "the reader cancelled nothing")

	code, body = operator.run(t, form, digest)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, 0, h.Stats(t).DeadLettered, "the operator's purge ran")
}

// TestAccessTokenIsAnOperator: Options.AccessToken keeps working as before: one token, which may act.
func TestAccessTokenIsAnOperator(t *testing.T) {
	t.Parallel()
	h := sbtest.New(t)
	h.Seed(t, "perm-1")
	s := newSite(t, h, &Options{AccessToken: "t0ken"})
	code, _ := s.get(t, "/")
	assert.Equal(t, http.StatusUnauthorized, code)
	s.signIn(t, "t0ken")
	code, body, digest, _ := s.preview(t, url.Values{"action": {"purge"}, "ref": {"orders/$DeadLetterQueue:1"}})
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "access-token (operator)")
	code, body = s.run(t, url.Values{"action": {"purge"}, "ref": {"orders/$DeadLetterQueue:1"}, "confirm": {"yes"}}, digest)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, 0, h.Stats(t).DeadLettered)
}
