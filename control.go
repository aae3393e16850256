package retry

import (
	"crypto/subtle"
	"encoding/json"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"

	"github.com/sbretry/retry/internal/loopback"
	"github.com/sbretry/retry/internal/redact"
)

// ControlOptions configures [ControlHandler]. A nil *ControlOptions means no token.
type ControlOptions struct {
	// Token, if set, is required as "Authorization: Bearer <Token>" on every request, compared in
	// constant time. Empty means none: mount the handler behind your own authentication then, since
	// it stops and starts the consumer.
	Token string
	// AllowedHosts are the Host names, besides loopback ones (localhost, 127.0.0.0/8, ::1), that a
	// handler without a Token answers. A request for any other Host gets 421: a page elsewhere whose
	// name was rebound to this machine (DNS rebinding) is same-origin for the browser and could
	// otherwise pause the consumer with a plain fetch. Ignored when Token is set.
	AllowedHosts []string
}

// controlRequest is the body of a state-changing request.
type controlRequest struct {
	// Action is "pause" or "resume".
	Action string `json:"action"`
	// Reason is shown in Health.Outage (pause only).
	Reason string `json:"reason"`
}

// maxControlBody bounds a request body.
const maxControlBody = 4 << 10

// ControlHandler returns an http.Handler that pauses and resumes c, a [*Consumer] or a
// [*SessionConsumer]: the kill switch of [Consumer.Pause] and [SessionConsumer.Pause] for operators,
// and what `sbretry pause` and `sbretry resume` talk to. GET answers the outage breaker's state as JSON (the "outage" object of the health document); POST with a JSON
// body {"action": "pause", "reason": "..."} or {"action": "resume"} changes it and answers the new
// state. A POST must have Content-Type application/json, which a browser cannot send to another
// origin without asking first; without a Token, only loopback Host names and
// ControlOptions.AllowedHosts are answered, so a page elsewhere, rebound to this machine's address or
// not, cannot pause the consumer. Other methods get 405. Errors are JSON too: {"error": "..."}. Every
// pause and resume is logged (the consumer's Logger, at Info) with the caller's address and, if it
// sent one, the X-Sbretry-Operator header (caller-supplied, not authenticated), for the audit trail.
func ControlHandler(c Pausable, opts *ControlOptions) http.Handler {
	var o ControlOptions
	if opts != nil {
		o = *opts
	}
	logger := loggerOf(c)
	token := o.Token
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if token != "" && !bearerMatches(r.Header.Get("Authorization"), token) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sbretry"`)
			controlError(w, http.StatusUnauthorized, "missing or wrong bearer token")
			return
		}
		if token == "" && !loopback.Allowed(r.Host, o.AllowedHosts) {
			controlError(w, http.StatusMisdirectedRequest, "without a token the control handler answers only loopback host names and ControlOptions.AllowedHosts, not "+quoteShort(r.Host))
			return
		}
		switch r.Method {
		case http.MethodGet, http.MethodHead:
		case http.MethodPost:
			if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
				controlError(w, http.StatusUnsupportedMediaType, "the body must be application/json")
				return
			}
			var req controlRequest
			dec := json.NewDecoder(io.LimitReader(r.Body, maxControlBody))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&req); err != nil || dec.More() {
				controlError(w, http.StatusBadRequest, "the body must be {\"action\": \"pause\" or \"resume\", \"reason\": \"...\"}")
				return
			}
			switch req.Action {
			case "pause":
				c.Pause(req.Reason)
			case "resume":
				if req.Reason != "" {
					controlError(w, http.StatusBadRequest, "resume takes no reason")
					return
				}
				c.Resume()
			default:
				controlError(w, http.StatusBadRequest, "unknown action "+quoteShort(req.Action)+": want pause or resume")
				return
			}
			logger.Info("control: "+req.Action, slog.String("action", req.Action), slog.String("reason", redact.String(truncate(req.Reason, 256))),
				slog.String("remote_addr", r.RemoteAddr), slog.String("operator", quoteShort(r.Header.Get("X-Sbretry-Operator"))),
				slog.Bool("token", token != ""))
		default:
			w.Header().Set("Allow", "GET, HEAD, POST")
			controlError(w, http.StatusMethodNotAllowed, "use GET for the state, POST to pause or resume")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(outageBodyOf(c.Health().Outage))
	})
}

// Pausable is what [ControlHandler] controls: a [*Consumer] or a [*SessionConsumer].
type Pausable interface {
	HealthReporter
	Pause(reason string)
	Resume()
}

// Compile-time proof that both consumers can be paused the same way.
var (
	_ Pausable = (*Consumer)(nil)
	_ Pausable = (*SessionConsumer)(nil)
)

// loggerOf is the logger of the consumer c, for the control handler's audit lines.
func loggerOf(c Pausable) *slog.Logger {
	switch x := c.(type) {
	case *Consumer:
		if x != nil && x.cfg != nil {
			return x.cfg.logger
		}
	case *SessionConsumer:
		if x != nil && x.cfg != nil {
			return x.cfg.logger
		}
	}
	return slog.Default()
}

// bearerMatches reports whether header is "Bearer <token>", in constant time for the token.
func bearerMatches(header, token string) bool {
	const prefix = "bearer "
	if len(header) < len(prefix) || !strings.EqualFold(header[:len(prefix)], prefix) {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(header[len(prefix):]), []byte(token)) == 1
}

func controlError(w http.ResponseWriter, code int, text string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": text})
}

// quoteShort quotes s for an error, cut to a length that cannot flood a log.
func quoteShort(s string) string {
	b, _ := json.Marshal(truncate(s, 64))
	return string(b)
}
