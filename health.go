package retry

import (
	"encoding/json"
	"net/http"
	"time"
)

// healthBody is the JSON document served by [HealthHandler].
type healthBody struct {
	Status             string    `json:"status"`
	State              string    `json:"state"`
	Since              time.Time `json:"since"`
	LastError          string    `json:"last_error,omitempty"`
	LastErrorTime      time.Time `json:"last_error_time,omitzero"`
	InFlight           int       `json:"in_flight"`
	Received           uint64    `json:"received"`
	Completed          uint64    `json:"completed"`
	RetriesScheduled   uint64    `json:"retries_scheduled"`
	DeadLettered       uint64    `json:"dead_lettered"`
	LeftForRedelivery  uint64    `json:"left_for_redelivery"`
	PossibleDuplicates uint64    `json:"possible_duplicates"`
	Connects           uint64    `json:"connects"`
	ConnectFailures    uint64    `json:"connect_failures"`
	ReceiveFailures    uint64    `json:"receive_failures"`
	SendFailures       uint64    `json:"send_failures"`
	Warnings           []string  `json:"warnings,omitempty"`
}

// HealthHandler returns an http.Handler for readiness or liveness probes built on [Consumer.Health].
// With ready true it answers 200 only while the consumer is running (Health.Ready) and 503 otherwise,
// from the moment Run's context ends too ([StateDraining]); with ready false (liveness) it answers 200
// unless the consumer has stopped, so a draining consumer is not restarted while its handlers finish. The body is a JSON
// document with the state, the last (redacted) error and the counters.
func HealthHandler(c *Consumer, ready bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h := c.Health()
		ok := h.State != StateStopped
		if ready {
			ok = h.Ready()
		}
		body := healthBody{
			Status: "ok", State: h.State.String(), Since: h.Since, LastError: h.LastError, LastErrorTime: h.LastErrorTime,
			InFlight: h.InFlight, Received: h.Received, Completed: h.Completed, RetriesScheduled: h.RetriesScheduled,
			DeadLettered: h.DeadLettered, LeftForRedelivery: h.LeftForRedelivery, PossibleDuplicates: h.PossibleDuplicates,
			Connects: h.Connects, ConnectFailures: h.ConnectFailures, ReceiveFailures: h.ReceiveFailures, SendFailures: h.SendFailures,
			Warnings: h.Warnings,
		}
		code := http.StatusOK
		if !ok {
			body.Status = "unavailable"
			code = http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(body)
	})
}
