package sbemu

import "net/http"

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
	if _, err := verifySAS(token, cfg.KeyName, cfg.Key, "https://"+r.Host+r.URL.Path, cfg.Clock.Now()); err != nil {
		return apiErrorf(http.StatusUnauthorized, "%v", err)
	}
	return nil
}
