package sbemu

import (
	"net/http"
	"strings"
)

// healthPath is where the administration API answers health probes, as
// Microsoft's Service Bus emulator does on its management port, so that a
// container health check or a start-up script written for that emulator
// ("curl -f https://localhost:<port>/health") works against this one too.
const healthPath = "/health"

// isHealthProbe reports whether r is a health probe: a GET or HEAD of
// /health without an Authorization header. The SDKs sign every request, so
// one of theirs for /health still reaches an entity named "health"; a probe
// needs no key.
func isHealthProbe(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) &&
		strings.EqualFold(r.URL.Path, healthPath) && r.Header.Get("Authorization") == ""
}

// serveHealth answers a probe: 200 while the emulator serves, which is for
// as long as its admin server accepts requests.
func serveHealth(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		_, _ = w.Write([]byte("Healthy\n"))
	}
}
