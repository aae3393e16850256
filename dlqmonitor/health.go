package dlqmonitor

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
)

// A monitor that cannot read the counts is worse than none: nobody is
// alerted, and nothing says so. So every failed read counts in the
// monitor's [Health], and [HealthHandler] turns a monitor whose latest poll
// failed into a 503 for a readiness probe, with the error (naming the
// entity and the endpoint) in the body.

// Health is a snapshot of how the monitor's reads are going; see
// [Monitor.Health]. More fields may be added.
type Health struct {
	// Polls counts the polls that ran to the end (a poll cut short because
	// its context ended is not counted).
	Polls uint64
	// Failures counts failed reads of one entity's count, over all polls.
	Failures uint64
	// ConsecutiveFailedPolls is how many polls in a row, up to the latest,
	// had at least one failed read; zero once a poll reads every entity.
	ConsecutiveFailedPolls int
	// LastError is the latest failed read, redacted; it names the entity
	// and, when the error comes from the administration API's client, the
	// endpoint. Empty if no read has failed.
	LastError string
	// LastErrorTime is when LastError happened, on [Options.Clock].
	LastErrorTime time.Time
	// LastSuccess is when a poll last read every entity, on
	// [Options.Clock]; zero if none has.
	LastSuccess time.Time
	// Entities has one entry per configured entity, in configuration order.
	Entities []EntityHealth
}

// EntityHealth is the state of one entity's reads. More fields may be
// added.
type EntityHealth struct {
	// Entity is the path as configured.
	Entity string
	// Count is the dead-letter count last read; it stays while reads fail.
	Count int64
	// ConsecutiveFailures is how many reads in a row, up to the latest,
	// failed.
	ConsecutiveFailures int
	// LastError is the latest failed read of the entity, redacted; empty
	// once a read succeeds again.
	LastError string
}

// OK reports whether the monitor can be relied on: it has finished a poll
// and its latest poll read every entity.
func (h Health) OK() bool { return h.Polls > 0 && h.ConsecutiveFailedPolls == 0 }

// healthState is the part of a Monitor that Health reads. It has its own
// lock so that Health answers at once while a poll is in flight.
type healthState struct {
	mu sync.Mutex
	h  Health
}

// record stores one finished poll's results; now is on Options.Clock.
func (s *healthState) record(results []Result, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := &s.h
	h.Polls++
	failed := false
	for i, r := range results {
		e := &h.Entities[i]
		if r.Err == nil {
			e.Count, e.ConsecutiveFailures, e.LastError = r.Count, 0, ""
			continue
		}
		failed = true
		h.Failures++
		e.ConsecutiveFailures++
		e.LastError = r.Err.Error()
		h.LastError, h.LastErrorTime = e.LastError, now
	}
	if failed {
		h.ConsecutiveFailedPolls++
	} else {
		h.ConsecutiveFailedPolls = 0
		h.LastSuccess = now
	}
}

// snapshot copies the health.
func (s *healthState) snapshot() Health {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.h
	h.Entities = slices.Clone(h.Entities)
	return h
}

// Health returns how the monitor's reads are going: counters, the latest
// error and each entity's state. It never waits for a poll in flight. A
// nil monitor reports the zero Health, which is not OK.
func (m *Monitor) Health() Health {
	if m == nil {
		return Health{}
	}
	return m.health.snapshot()
}

// healthBody is the JSON document served by [HealthHandler].
type healthBody struct {
	Status                 string             `json:"status"`
	Polls                  uint64             `json:"polls"`
	Failures               uint64             `json:"failures"`
	ConsecutiveFailedPolls int                `json:"consecutive_failed_polls"`
	LastError              string             `json:"last_error,omitempty"`
	LastErrorTime          time.Time          `json:"last_error_time,omitzero"`
	LastSuccess            time.Time          `json:"last_success,omitzero"`
	Entities               []entityHealthBody `json:"entities"`
}

type entityHealthBody struct {
	Entity              string `json:"entity"`
	Count               int64  `json:"count"`
	ConsecutiveFailures int    `json:"consecutive_failures"`
	LastError           string `json:"last_error,omitempty"`
}

// HealthHandler returns an http.Handler for a readiness probe built on
// [Monitor.Health]: 200 while [Health.OK], 503 before the first poll and
// while the latest poll failed to read an entity, so a monitor that cannot
// see the dead-letter queues (wrong credentials, an untrusted certificate,
// an emulator that went away) is noticed. The body is a JSON document with
// the counters, the latest (redacted) error and each entity's state.
func HealthHandler(m *Monitor) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h := m.Health()
		body := healthBody{
			Status: "ok", Polls: h.Polls, Failures: h.Failures, ConsecutiveFailedPolls: h.ConsecutiveFailedPolls,
			LastError: h.LastError, LastErrorTime: h.LastErrorTime, LastSuccess: h.LastSuccess,
			Entities: make([]entityHealthBody, 0, len(h.Entities)),
		}
		for _, e := range h.Entities {
			body.Entities = append(body.Entities, entityHealthBody{Entity: e.Entity, Count: e.Count, ConsecutiveFailures: e.ConsecutiveFailures, LastError: e.LastError})
		}
		code := http.StatusOK
		if !h.OK() {
			body.Status = "unavailable"
			code = http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(body)
	})
}

// endpointOf returns the scheme and host ("https://ns.servicebus.windows.net/")
// of the request an administration client's error is about: the URL of a
// transport failure (*url.Error, such as a refused connection or an
// untrusted certificate) or of a failed response (*azcore.ResponseError).
// It returns "" for errors that carry neither.
func endpointOf(err error) string {
	base := func(u *url.URL) string {
		if u == nil || u.Host == "" {
			return ""
		}
		return u.Scheme + "://" + u.Host + "/"
	}
	var re *azcore.ResponseError
	if errors.As(err, &re) && re.RawResponse != nil && re.RawResponse.Request != nil {
		return base(re.RawResponse.Request.URL)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		u, perr := url.Parse(ue.URL)
		if perr == nil {
			return base(u)
		}
	}
	return ""
}
