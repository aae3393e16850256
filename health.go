package retry

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/sbretry/retry/outage"
)

// State is the consumer's life-cycle state, as reported by [Consumer.Health].
type State int

const (
	// StateIdle: Run has not been called yet.
	StateIdle State = iota
	// StateConnecting: Run is building the first connection.
	StateConnecting
	// StateRunning: receiving and processing messages.
	StateRunning
	// StateReconnecting: the connection broke (a receive failed, or a health probe after a dropped link or
	// an idle period failed); the reconnect tries (5 s, 10 s, 15 s by default) are running.
	StateReconnecting
	// StateWatchdog: every reconnect try failed; the watchdog retries every WatchdogInterval.
	StateWatchdog
	// StateStopped: Run has returned.
	StateStopped
	// StateDraining: Run's context has ended. The consumer receives nothing more and waits for the
	// handlers and settles in flight (up to ShutdownGrace plus one SettleTimeout); it is not ready, but
	// still live, until Run returns ([StateStopped]). It follows whichever state the consumer was in.
	StateDraining
)

func (s State) String() string {
	switch s {
	case StateIdle:
		return "idle"
	case StateConnecting:
		return "connecting"
	case StateRunning:
		return "running"
	case StateReconnecting:
		return "reconnecting"
	case StateWatchdog:
		return "watchdog"
	case StateStopped:
		return "stopped"
	case StateDraining:
		return "draining"
	}
	return "unknown"
}

// Health is a snapshot of the consumer for readiness and liveness probes.
type Health struct {
	State State
	// Since is when the consumer entered State.
	Since time.Time
	// LastError is the latest connect, probe, receive or republish failure (redacted), empty if none. It
	// says why the consumer is not ready.
	LastError string
	// LastErrorTime is when LastError happened.
	LastErrorTime time.Time
	// InFlight is the number of messages received and not yet finished: handlers running, redeliveries
	// waiting for an earlier delivery of their message, and settles in flight.
	InFlight int
	// Counters since the consumer was created.
	Received, Completed, RetriesScheduled, DeadLettered, LeftForRedelivery, PossibleDuplicates uint64
	// Warnings are the connection's settings warnings (see Connection.Settings), read once per Run, each
	// naming its entity; or, when the settings could not be read, one warning saying so, naming the
	// entity and why (for the built-in connectors, the administration endpoint).
	Warnings []string
	// Connects counts successful connector calls; ConnectFailures and ReceiveFailures count failures
	// (ReceiveFailures includes link and connection errors the SDK recovered from on its own, and failed
	// health probes). SendFailures counts failed republishes of retry copies.
	Connects, ConnectFailures, ReceiveFailures, SendFailures uint64
	// Held counts messages held by the outage breaker ([OutcomeHeld]); Discarded those a policy
	// discarded ([OutcomeDiscarded]).
	Held, Discarded uint64
	// Deferred counts the messages a [SessionConsumer] deferred in their session: held durably
	// ([OutcomeDeferred]) or set aside behind a held message, in order.
	Deferred uint64
	// Outage is the outage breaker: closed unless an outage or [Consumer.Pause] paused receiving. An open
	// breaker does not make the consumer unready: it is connected and well, and restarting it would not
	// bring back what it depends on.
	Outage outage.Status
}

// Ready reports whether the consumer is connected and receiving.
func (h Health) Ready() bool { return h.State == StateRunning }

// healthBody is the JSON document served by [ReadinessHandler] and [LivenessHandler].
type healthBody struct {
	Status             string     `json:"status"`
	State              string     `json:"state"`
	Since              time.Time  `json:"since"`
	LastError          string     `json:"last_error,omitempty"`
	LastErrorTime      time.Time  `json:"last_error_time,omitzero"`
	InFlight           int        `json:"in_flight"`
	Received           uint64     `json:"received"`
	Completed          uint64     `json:"completed"`
	RetriesScheduled   uint64     `json:"retries_scheduled"`
	DeadLettered       uint64     `json:"dead_lettered"`
	LeftForRedelivery  uint64     `json:"left_for_redelivery"`
	PossibleDuplicates uint64     `json:"possible_duplicates"`
	Connects           uint64     `json:"connects"`
	ConnectFailures    uint64     `json:"connect_failures"`
	ReceiveFailures    uint64     `json:"receive_failures"`
	SendFailures       uint64     `json:"send_failures"`
	Held               uint64     `json:"held"`
	Discarded          uint64     `json:"discarded"`
	Outage             outageBody `json:"outage"`
	Warnings           []string   `json:"warnings,omitempty"`
}

// outageBodyOf is st as the health document and ControlHandler show it.
func outageBodyOf(st outage.Status) outageBody {
	return outageBody{State: st.State.String(), Manual: st.Manual, Reason: st.Reason, Since: st.Since,
		NextProbe: st.NextProbe, Trips: st.Trips, Probes: st.Probes, FailedProbes: st.FailedProbes}
}

// outageBody is the outage breaker in the health document.
type outageBody struct {
	State        string    `json:"state"`
	Manual       bool      `json:"manual,omitempty"`
	Reason       string    `json:"reason,omitempty"`
	Since        time.Time `json:"since,omitzero"`
	NextProbe    time.Time `json:"next_probe,omitzero"`
	Trips        uint64    `json:"trips"`
	Probes       uint64    `json:"probes"`
	FailedProbes uint64    `json:"failed_probes"`
}

// HealthReporter is what the probe handlers read: a [*Consumer] or a [*SessionConsumer].
type HealthReporter interface {
	Health() Health
}

// ReadinessHandler returns an http.Handler for readiness probes built on the consumer's Health (a
// [*Consumer] or a [*SessionConsumer]): it answers 200 only while the consumer is running
// ([Health.Ready]) and 503 otherwise, from the moment Run's context ends too ([StateDraining]), so that a
// draining consumer is taken out of rotation. The body is a JSON document with the state, the last
// (redacted) error and the counters. A nil consumer reads as idle.
func ReadinessHandler(c HealthReporter) http.Handler {
	return healthHandler(c, Health.Ready)
}

// LivenessHandler returns an http.Handler for liveness probes built on the consumer's Health (a
// [*Consumer] or a [*SessionConsumer]): it answers 200 unless the consumer has stopped, so a draining
// consumer is not restarted while its handlers finish, and 503 once Run has returned. The body is the
// same JSON document as [ReadinessHandler]'s.
func LivenessHandler(c HealthReporter) http.Handler {
	return healthHandler(c, func(h Health) bool { return h.State != StateStopped })
}

// healthHandler answers 200 while ok(c.Health()) holds, 503 otherwise.
func healthHandler(c HealthReporter, ok func(Health) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		var h Health
		if c != nil {
			h = c.Health()
		}
		body := healthBody{
			Status: "ok", State: h.State.String(), Since: h.Since, LastError: h.LastError, LastErrorTime: h.LastErrorTime,
			InFlight: h.InFlight, Received: h.Received, Completed: h.Completed, RetriesScheduled: h.RetriesScheduled,
			DeadLettered: h.DeadLettered, LeftForRedelivery: h.LeftForRedelivery, PossibleDuplicates: h.PossibleDuplicates,
			Connects: h.Connects, ConnectFailures: h.ConnectFailures, ReceiveFailures: h.ReceiveFailures, SendFailures: h.SendFailures,
			Held: h.Held, Discarded: h.Discarded, Warnings: h.Warnings,
			Outage: outageBodyOf(h.Outage),
		}
		code := http.StatusOK
		if !ok(h) {
			body.Status = "unavailable"
			code = http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(body)
	})
}

// StateChangeParams describes a consumer state transition.
type StateChangeParams struct {
	From, To State
	// Err is the failure that caused the change, if any.
	Err error
}
