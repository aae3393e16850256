package retry

import (
	"errors"
	"maps"
	"math"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/internal/redact"
)

// decisionKind is what the processor decided to do with a delivery once its handler returned.
type decisionKind int

const (
	decideComplete decisionKind = iota + 1
	decideRetry
	decideDeadLetter
)

// decision is an outcome decided but perhaps not yet applied. When its settle fails (the lock died with
// a connection, a complete timed out), the broker redelivers the message; the redelivery then applies
// the same decision with its own lock instead of running the handler again. That is how finished work
// is not redone and how a scheduled retry copy stays the only successor of its attempt.
type decision struct {
	kind       decisionKind
	env        *Envelope
	handlerErr error
	// The details of a retry or a dead-letter; a success, the common case, needs neither.
	*retryPlan
	*deadLetterPlan
}

// retryPlan is a retry decision's copy, when it is due, and whether it has been scheduled yet.
type retryPlan struct {
	copyMsg   *azservicebus.Message
	nextTry   int
	delay     time.Duration
	at        time.Time
	errText   string
	scheduled bool
	seq       int64
}

// deadLetterPlan is a dead-letter decision's reason, description and the properties added to the
// dead letter.
type deadLetterPlan struct {
	reason string
	desc   string
	props  map[string]any
}

// decideFailure decides between retry and dead-letter after a failed attempt.
func (p *Processor) decideFailure(d *delivery, herr error) *decision {
	cfg, msg, env, now := p.cfg, d.msg, &d.env, d.now
	switch {
	case IsPermanent(herr):
		return p.deadLetterDecision(env, msg, cfg.reasons.Permanent, herr, now, true)
	case env.Attempt >= cfg.maxAttempts:
		return p.deadLetterDecision(env, msg, cfg.reasons.MaxAttempts, herr, now, true)
	case hasNonDataBody(msg):
		return p.deadLetterDecision(env, msg, cfg.reasons.UnsupportedBody, herr, now, true)
	}

	delay := p.delay(env.Attempt, herr)
	at := now.Add(delay)
	if cfg.retryBudget > 0 && !env.FirstEnqueuedTime.IsZero() && at.After(env.FirstEnqueuedTime.Add(cfg.retryBudget)) {
		return p.deadLetterDecision(env, msg, cfg.reasons.BudgetExhausted, herr, now, true)
	}
	// Service Bus counts a TimeToLive from the (scheduled) enqueue time, so a copy that carried the
	// original TTL would silently extend the producer's deadline by every delay. The copy gets what is
	// left of the producer's lifetime instead, and a retry that would be due after it is refused.
	var ttl *time.Duration
	switch {
	case cfg.ignoreExpiry:
		if msg.TimeToLive != nil && *msg.TimeToLive > 0 {
			t := *msg.TimeToLive
			ttl = &t
		}
	case !env.ExpiresAt.IsZero():
		if !at.Before(env.ExpiresAt) {
			return p.deadLetterDecision(env, msg, cfg.reasons.Expired, herr, now, true)
		}
		// A TimeToLive travels as 32-bit milliseconds; no honest expiry leaves more, so a larger one is a
		// forged property and is cut rather than wrapped around into a copy that dies at once.
		left := min(env.ExpiresAt.Sub(at), maxTimeToLive)
		if left < time.Millisecond {
			// Whole milliseconds on the wire, and 0 means no TTL: a copy with less left would never expire.
			return p.deadLetterDecision(env, msg, cfg.reasons.Expired, herr, now, true)
		}
		ttl = &left
	}

	next := env.Attempt + 1
	errText := p.errorText(herr)
	copyMsg := retryCopy(msg, *env, next, errText, ttl)
	if hook := cfg.hooks.OnRetryCopy; hook != nil {
		id := *copyMsg.MessageID
		hook(RetryCopyParams{Context: d.ctx, Message: msg, Envelope: *env, Copy: copyMsg, Attempt: next, ScheduledFor: at})
		copyMsg.MessageID = &id   // the id is the chain's: a hook may add properties, not rename the copy
		d.now = p.cfg.clock.Now() // the hook's time counts against the lock
	}
	if !fitsLimits(copyMsg, cfg.maxMessageSize) {
		return p.deadLetterDecision(env, msg, cfg.reasons.MessageTooLarge, herr, now, false)
	}
	return &decision{kind: decideRetry, env: env, handlerErr: herr,
		retryPlan: &retryPlan{copyMsg: copyMsg, nextTry: next, delay: delay, at: at, errText: errText}}
}

// maxTimeToLive is the largest TimeToLive the AMQP header can carry (its ttl field is a uint in ms).
const maxTimeToLive = time.Duration(math.MaxUint32) * time.Millisecond

// delay is the wait before the attempt after attempt n: the backoff's, or the handler's RetryAfter,
// always within [0, the backoff's cap]. A custom Backoff's delays are bounded the same way, so that a
// bug in it cannot schedule in the past or beyond the duplicate-detection window sized for the cap.
func (p *Processor) delay(n int, herr error) time.Duration {
	d := p.cfg.backoff.Delay(n)
	var ra *RetryAfterError
	if errors.As(herr, &ra) {
		d = ra.Delay
	}
	return min(max(d, 0), p.cfg.maxDelay)
}

// errorText renders a handler error for the broker (the last-error property and the dead-letter
// description): through Options.ErrorText if set, always redacted and truncated.
func (p *Processor) errorText(err error) string {
	if err == nil {
		return ""
	}
	text := ""
	if r := p.cfg.errorText; r != nil {
		text = r(err)
	} else {
		text = err.Error()
	}
	return truncate(redact.String(text), p.cfg.descriptionLimit)
}

// deadLetterDecision builds a dead-letter decision with our reason. The dead letter carries the final
// attempt, the time, the reason and (unless the message is already at the header limits) the last
// error as application properties, so that an operator sees what happened without decoding anything.
func (p *Processor) deadLetterDecision(env *Envelope, msg *azservicebus.ReceivedMessage, reason string, cause error, now time.Time, withError bool) *decision {
	desc := p.errorText(cause)
	props := map[string]any{
		PropDeadLetterAttempt: int64(env.Attempt),
		PropDeadLetterTime:    now.UTC(),
		PropDeadLetterReason:  reason,
	}
	if withError {
		props[PropLastError] = desc
		if env.Source != "" {
			props[PropSource] = env.Source
		}
		if _, ok := msg.ApplicationProperties[PropFirstSequenceNumber]; !ok {
			props[PropFirstSequenceNumber] = env.FirstSequenceNumber
		}
		// A first delivery carries no envelope yet: record its key and correlation id, so that an
		// operator finds the dead letter by them as by a retry copy's; unless they would take the
		// message's properties over the header limit, where the dead-letter itself would fail.
		identity := map[string]any{}
		for name, v := range map[string]string{PropKey: env.Key, PropCorrelationID: env.CorrelationID, PropOriginalMessageID: env.OriginalMessageID} {
			if _, ok := msg.ApplicationProperties[name]; !ok && v != "" {
				identity[name] = v
			}
		}
		if propertiesSize(msg.ApplicationProperties)+propertiesSize(props)+propertiesSize(identity) <= maxHeaderSize {
			maps.Copy(props, identity)
		}
	}
	return &decision{kind: decideDeadLetter, env: env, handlerErr: cause, deadLetterPlan: &deadLetterPlan{reason: reason, desc: desc, props: props}}
}

// hasNonDataBody reports a body the SDK exposes only through RawAMQPMessage, which an
// azservicebus.Message copy cannot carry byte for byte: an AMQP value, an AMQP sequence, or more than
// one data section (the SDK fills ReceivedMessage.Body only for exactly one; with several, Body is nil
// and a copy would silently lose the content).
func hasNonDataBody(msg *azservicebus.ReceivedMessage) bool {
	raw := msg.RawAMQPMessage
	return raw != nil && (raw.Body.Value != nil || len(raw.Body.Sequence) > 0 || len(raw.Body.Data) > 1)
}
