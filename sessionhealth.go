package retry

import "net/http"

// SessionReadinessHandler is [ReadinessHandler] for a [SessionConsumer]: 200 only while it is running,
// 503 from the moment Run's context ends, with the same JSON document.
func SessionReadinessHandler(sc *SessionConsumer) http.Handler {
	return healthHandler(sc.healthSource(), Health.Ready)
}

// SessionLivenessHandler is [LivenessHandler] for a [SessionConsumer]: 200 unless it has stopped.
func SessionLivenessHandler(sc *SessionConsumer) http.Handler {
	return healthHandler(sc.healthSource(), func(h Health) bool { return h.State != StateStopped })
}

// healthSource is the Consumer whose health the handlers read: the session consumer's own recorder
// (nil, whose Health is the zero value, for a nil or zero SessionConsumer).
func (sc *SessionConsumer) healthSource() *Consumer {
	if sc == nil {
		return nil
	}
	return sc.stats
}
