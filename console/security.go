package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"net/url"
	"strings"

	"github.com/sbretry/retry/internal/loopback"
)

// Cookie and form field names. The cookies are HttpOnly and SameSite=Strict: scripts cannot read them,
// and another site's form never carries them.
const (
	csrfCookie  = "sbretry_csrf"
	csrfField   = "csrf"
	tokenCookie = "sbretry_token"
	tokenParam  = "token"
)

// newSecret returns 32 random bytes: the per-process key of the CSRF tokens and digests.
func newSecret() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (it panics on a broken system)
	return b
}

// mac is the hex HMAC-SHA256 of the parts under the console's secret.
func (c *Console) mac(parts ...string) string {
	h := hmac.New(sha256.New, c.secret)
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// csrfToken returns the token for the page's forms, setting the CSRF cookie first when the request has
// none. The token is the HMAC of the cookie's random value: a page of another site can neither read the
// cookie nor compute the token.
func (c *Console) csrfToken(w http.ResponseWriter, r *http.Request) string {
	v := ""
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) == 32 {
		v = ck.Value
	} else {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		v = hex.EncodeToString(b)
		http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: v, Path: basePath(r), HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	}
	return c.mac("csrf", v)
}

// checkCSRF verifies a state-changing request: its Origin (or Referer) names this host, and its form
// token is the HMAC of its CSRF cookie. It returns the reason it refuses, or "".
func (c *Console) checkCSRF(r *http.Request) string {
	// Browsers send Origin with every cross-site POST, and with same-site form posts too; a client
	// that sends neither header is not a browser on one of our pages, so it is refused.
	if origin := r.Header.Get("Origin"); origin != "" && origin != "null" {
		if !sameHost(origin, r.Host) {
			return "the request came from another site (Origin " + origin + ")"
		}
	} else if ref := r.Header.Get("Referer"); ref != "" {
		if !sameHost(ref, r.Host) {
			return "the request came from another site (Referer)"
		}
	} else {
		return "the request has neither an Origin nor a Referer header"
	}
	ck, err := r.Cookie(csrfCookie)
	if err != nil {
		return "the CSRF cookie is missing: reload the page and try again"
	}
	// The token is bound to this browser's cookie: a token copied from another session fails.
	want := c.mac("csrf", ck.Value)
	if !hmac.Equal([]byte(want), []byte(r.PostFormValue(csrfField))) {
		return "the CSRF token does not match: reload the page and try again"
	}
	return ""
}

// sameHost reports whether the URL u names host (host[:port]).
func sameHost(u, host string) bool {
	p, err := url.Parse(u)
	return err == nil && p.Host != "" && strings.EqualFold(p.Host, host)
}

// requireToken wraps next so that every request must present one of the tokens: an Authorization
// bearer header, or the cookie that a visit with ?token= sets (that visit is then redirected to the
// same URL without the token, so it leaves the address bar). Comparison is in constant time
// ([tokenSet]). The request reaches next with the token's name and role in its context
// ([principalOf]).
func requireToken(tokens *tokenSet, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if t := r.URL.Query().Get(tokenParam); t != "" && r.Method == http.MethodGet {
			if _, ok := tokens.match(t); !ok {
				http.Error(w, "sbretry console: the access token is wrong", http.StatusUnauthorized)
				return
			}
			http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: t, Path: basePath(r), HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
			// Redirect to the address the browser asked for (prefix and all), without the token.
			u, err := url.ParseRequestURI(r.RequestURI)
			if err != nil {
				u = r.URL
			}
			q := u.Query()
			q.Del(tokenParam)
			u.RawQuery = q.Encode()
			http.Redirect(w, r, localPath(u), http.StatusSeeOther)
			return
		}
		if b, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); found {
			if p, ok := tokens.match(b); ok {
				next.ServeHTTP(w, withPrincipal(r, p))
				return
			}
		}
		if ck, err := r.Cookie(tokenCookie); err == nil {
			if p, ok := tokens.match(ck.Value); ok {
				next.ServeHTTP(w, withPrincipal(r, p))
				return
			}
		}
		http.Error(w, "sbretry console: an access token is required: open the console's address with ?token=TOKEN, or send Authorization: Bearer TOKEN", http.StatusUnauthorized)
	})
}

// allowedHostsOnly refuses requests whose Host is neither a loopback name nor one of allowed (see
// [Options.AllowedHosts]): the guard against DNS rebinding of a console without an access token.
func allowedHostsOnly(allowed []string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !loopback.Allowed(r.Host, allowed) {
			http.Error(w, "sbretry console: without an access token it answers only to loopback names (localhost, 127.0.0.1, [::1]) and Options.AllowedHosts, not to "+r.Host, http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// IsLoopbackHost reports whether host (a name or address, without port or brackets) is "localhost" or
// a loopback address. The console and retry.ControlHandler share the check (internal/loopback).
func IsLoopbackHost(host string) bool { return loopback.IsHost(host) }

// noDirectories refuses directory paths, so the static files are served but never listed.
func noDirectories(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "" || strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// localPath returns the path of u as a redirect target that stays on this host: exactly one leading
// slash, so "//evil.example/x" (a scheme-relative URL) or "/\\evil.example" cannot send the browser
// elsewhere.
func localPath(u *url.URL) string {
	p := "/" + strings.TrimLeft(strings.ReplaceAll(u.Path, "\\", "/"), "/")
	out := &url.URL{Path: p, RawQuery: u.RawQuery}
	return out.RequestURI()
}

// securityHeaders are set on every response: no framing (clickjacking), no sniffing, scripts and styles
// from the console only, and a Referer to the console itself only (the CSRF check reads it).
func securityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'self'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
}

// subtleEqual compares two strings in constant time.
func subtleEqual(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }
