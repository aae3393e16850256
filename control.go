package retry

import (
	"crypto/subtle"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strings"
)

// ControlOptions configures [ControlHandler]. A nil *ControlOptions means no token.
type ControlOptions struct {
	// Token, if set, is required as "Authorization: Bearer <Token>" on every request, compared in
	// constant time. Empty means none: mount the handler behind your own authentication then, since
	// it stops and starts the consumer.
	Token string
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

// ControlHandler returns an http.Handler that pauses and resumes c: the kill switch of
// [Consumer.Pause] for operators, and what `sbretry pause` and `sbretry resume` talk to. GET answers
// the outage breaker's state as JSON (the "outage" object of the health document); POST with a JSON
// body {"action": "pause", "reason": "..."} or {"action": "resume"} changes it and answers the new
// state. A POST must have Content-Type application/json, which a browser cannot send to another
// origin without asking first, so a page elsewhere cannot pause the consumer; other methods get 405.
// Errors are JSON too: {"error": "..."}.
func ControlHandler(c *Consumer, opts *ControlOptions) http.Handler {
	token := ""
	if opts != nil {
		token = opts.Token
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if token != "" && !bearerMatches(r.Header.Get("Authorization"), token) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sbretry"`)
			controlError(w, http.StatusUnauthorized, "missing or wrong bearer token")
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
		default:
			w.Header().Set("Allow", "GET, HEAD, POST")
			controlError(w, http.StatusMethodNotAllowed, "use GET for the state, POST to pause or resume")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(outageBodyOf(c.Health().Outage))
	})
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
