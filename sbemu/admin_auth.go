package sbemu

import (
	"net/http"
	"net/url"
	"strings"
)

// authorize checks a request's Authorization header under
// [Config.StrictAuth], as the "$cbs" node checks a put-token: a
// SharedAccessSignature signed with the configured key, not expired, whose
// audience (sr) covers the request URL. Service Bus accepts a token for any
// prefix of the resource (a namespace token covers every entity), and so
// does the emulator. The SDK signs the full request URL
// (azservicebus v1.11.0 internal/atom/per_retry_auth_policy.go). Without
// StrictAuth every request is accepted, as on the AMQP side. Neither the
// token nor the key ever appears in an error or a log line.
func (a *adminServer) authorize(r *http.Request) error {
	cfg := a.e.cfg
	if !cfg.StrictAuth {
		return nil
	}
	token := r.Header.Get("Authorization")
	if token == "" {
		return apiErrorf(http.StatusUnauthorized, "sbemu: the request has no Authorization header")
	}
	if err := verifySAS(token, cfg.KeyName, cfg.Key, "", cfg.Clock.Now()); err != nil {
		return apiErrorf(http.StatusUnauthorized, "%v", err)
	}
	if !audienceCovers(sasAudience(token), "https://"+r.Host+r.URL.Path) {
		return apiErrorf(http.StatusUnauthorized, "sbemu: SharedAccessSignature is for a different audience")
	}
	return nil
}

// sasAudience returns the decoded sr field of a token verifySAS accepted.
func sasAudience(token string) string {
	rest := strings.TrimPrefix(token, sasPrefix)
	for _, kv := range strings.Split(rest, "&") {
		if v, ok := strings.CutPrefix(kv, "sr="); ok {
			decoded, err := url.QueryUnescape(v)
			if err != nil {
				return ""
			}
			return decoded
		}
	}
	return ""
}

// audienceCovers reports whether a token audience is the resource or one of
// its parents, ignoring case, scheme, query and trailing slashes.
func audienceCovers(audience, resource string) bool {
	norm := func(s string) string {
		s = strings.ToLower(s)
		if i := strings.Index(s, "://"); i >= 0 {
			s = s[i+3:]
		}
		s, _, _ = strings.Cut(s, "?")
		return strings.TrimSuffix(s, "/")
	}
	aud, res := norm(audience), norm(resource)
	return aud != "" && (res == aud || strings.HasPrefix(res, aud+"/"))
}
