package retry

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"maps"
	"math"
	"strconv"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/redact"
)

// decideFailure decides what a failed attempt becomes under its policy: a retry, a dead-letter or a
// discard.
func (p *Processor) decideFailure(d *delivery, herr error, pol policy) *decision {
	cfg, msg, env, now := p.cfg, d.msg, &d.env, d.now
	if dec := p.finalDecision(d, herr, pol); dec != nil {
		return dec
	}
	if hasNonDataBody(msg) {
		return p.deadLetterDecision(env, msg, cfg.reasons.UnsupportedBody, herr, now, true)
	}

	delay := p.delay(pol, env.Attempt, herr)
	at := now.Add(delay)
	if p.overBudget(env, at) {
		return p.deadLetterDecision(env, msg, cfg.reasons.BudgetExhausted, herr, now, true)
	}
	ttl, expired := p.copyTTL(env, msg, at)
	if expired {
		return p.deadLetterDecision(env, msg, cfg.reasons.Expired, herr, now, true)
	}
	next := env.Attempt + 1
	errText := p.errorText(herr)
	copyMsg := p.buildCopy(d, next, errText, ttl, at, env.RetryMessageID(next))
	if why := oversize(copyMsg, cfg.maxMessageSize); why != "" {
		dec := p.deadLetterDecision(env, msg, cfg.reasons.MessageTooLarge, herr, now, false)
		// The description says what did not fit, by how much; the handler's error follows it.
		if text := p.errorText(herr); text != "" {
			why += "; the handler failed with: " + text
		}
		dec.deadLetterPlan.desc = truncate(why, cfg.descriptionLimit)
		return dec
	}
	return &decision{kind: decideRetry, env: env, handlerErr: herr,
		retryPlan: &retryPlan{copyMsg: copyMsg, nextTry: next, delay: delay, at: at, errText: errText}}
}

// finalDecision is what a failed attempt becomes when it is not retried at all, whatever the retry
// would look like: no route, Permanent, a policy that dead-letters or discards, the attempts spent.
// It returns nil when the attempt may be retried. The queue processor and the session consumer's holds
// in place (sessionhold.go) both start from it.
func (p *Processor) finalDecision(d *delivery, herr error, pol policy) *decision {
	cfg, msg, env, now := p.cfg, d.msg, &d.env, d.now
	switch {
	case errors.Is(herr, ErrNoRoute):
		return p.deadLetterDecision(env, msg, cfg.reasons.NoRoute, herr, now, true)
	case IsPermanent(herr):
		return p.deadLetterDecision(env, msg, cfg.reasons.Permanent, herr, now, true)
	case pol.action == ActionDeadLetter:
		return p.deadLetterDecision(env, msg, pol.reason, herr, now, true)
	case pol.action == ActionDiscard:
		return &decision{kind: decideDiscard, env: env, handlerErr: herr}
	case env.Attempt >= pol.maxAttempts:
		return p.deadLetterDecision(env, msg, cfg.reasons.MaxAttempts, herr, now, true)
	}
	return nil
}

// overBudget reports whether an attempt due at at falls after Options.RetryBudget.
func (p *Processor) overBudget(env *envelope.Envelope, at time.Time) bool {
	return p.cfg.retryBudget > 0 && !env.FirstEnqueuedTime.IsZero() && at.After(env.FirstEnqueuedTime.Add(p.cfg.retryBudget))
}

// copyTTL is the TimeToLive of a copy due at at. Service Bus counts a TimeToLive from the (scheduled)
// enqueue time, so a copy that carried the original TTL would silently extend the producer's deadline
// by every delay: the copy gets what is left of the producer's lifetime instead, and a copy that would
// be due after it is refused (expired).
func (p *Processor) copyTTL(env *envelope.Envelope, msg *azservicebus.ReceivedMessage, at time.Time) (ttl *time.Duration, expired bool) {
	switch {
	case p.cfg.ignoreExpiry:
		if msg.TimeToLive != nil && *msg.TimeToLive > 0 {
			t := *msg.TimeToLive
			ttl = &t
		}
	case !env.ExpiresAt.IsZero():
		if !at.Before(env.ExpiresAt) {
			return nil, true
		}
		// A TimeToLive travels as 32-bit milliseconds; no honest expiry leaves more, so a larger one is a
		// forged property and is cut rather than wrapped around into a copy that dies at once.
		left := min(env.ExpiresAt.Sub(at), maxTimeToLive)
		if left < time.Millisecond {
			// Whole milliseconds on the wire, and 0 means no TTL: a copy with less left would never expire.
			return nil, true
		}
		ttl = &left
	}
	return ttl, false
}

// buildCopy builds the copy of d's message for attempt, due at at, with the MessageID id, and lets the
// OnRetryCopy hook see it.
func (p *Processor) buildCopy(d *delivery, attempt int, errText string, ttl *time.Duration, at time.Time, id string) *azservicebus.Message {
	copyMsg := envelope.RetryCopy(d.msg, d.env, attempt, id, errText, ttl)
	if hook := p.cfg.hooks.OnRetryCopy; hook != nil {
		hook(RetryCopyParams{Context: d.ctx, Message: d.msg, Envelope: d.env, Copy: copyMsg, Attempt: attempt, ScheduledFor: at})
		copyMsg.MessageID = &id   // the id is the chain's: a hook may add properties, not rename the copy
		d.now = p.cfg.clock.Now() // the hook's time counts against the lock
	}
	return copyMsg
}

// heldMessageID is the MessageID of the copy that holds msg, received from entity at env's attempt: the
// attempt's retry id, "-h" and 16 hex digits of a hash of the held delivery (its entity, sequence number
// and MessageID). Every redelivery of that delivery computes the same id, so duplicate detection
// absorbs a second copy; a copy held again is another delivery, with an id of its own, also when it is
// received from another entity whose sequence numbers overlap (a subscription's copies are held again
// from its retry queue). The id is at most 78 characters.
func heldMessageID(env envelope.Envelope, entity string, msg *azservicebus.ReceivedMessage) string {
	h := sha256.New()
	for _, f := range []string{entity, strconv.FormatInt(*msg.SequenceNumber, 10), msg.MessageID} {
		h.Write([]byte(strconv.Itoa(len(f))))
		h.Write([]byte{':'})
		h.Write([]byte(f))
	}
	var sum [sha256.Size]byte
	return env.RetryMessageID(env.Attempt) + "-h" + hex.EncodeToString(h.Sum(sum[:0])[:8])
}

// errCannotHold is the SettleErr of a message the outage breaker could not hold.
var errCannotHold = errors.New("retry: outage mode cannot hold this message")

// maxTimeToLive is the largest TimeToLive the AMQP header can carry (its ttl field is a uint in ms).
const maxTimeToLive = time.Duration(math.MaxUint32) * time.Millisecond

// delay is the wait before the attempt after attempt n under pol: its backoff's, or the handler's
// RetryAfter, always within [0, the backoff's cap]. A custom Backoff's delays are bounded the same way,
// so that a bug in it cannot schedule in the past or beyond the duplicate-detection window sized for
// the cap.
func (p *Processor) delay(pol policy, n int, herr error) time.Duration {
	d := pol.backoff.Delay(n)
	var ra *RetryAfterError
	if errors.As(herr, &ra) {
		d = ra.Delay
	}
	return min(max(d, 0), pol.maxDelay)
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
func (p *Processor) deadLetterDecision(env *envelope.Envelope, msg *azservicebus.ReceivedMessage, reason string, cause error, now time.Time, withError bool) *decision {
	desc := p.errorText(cause)
	props := map[string]any{
		envelope.PropDeadLetterAttempt: int64(env.Attempt),
		envelope.PropDeadLetterTime:    now.UTC(),
		envelope.PropDeadLetterReason:  reason,
	}
	if withError {
		props[envelope.PropLastError] = desc
		if env.Source != "" {
			props[envelope.PropSource] = env.Source
		}
		if _, ok := msg.ApplicationProperties[envelope.PropFirstSequenceNumber]; !ok {
			props[envelope.PropFirstSequenceNumber] = env.FirstSequenceNumber
		}
		// A first delivery carries no envelope yet: record its key and correlation id, so that an
		// operator finds the dead letter by them as by a retry copy's; unless they would take the
		// message's properties over the header limit, where the dead-letter itself would fail.
		identity := map[string]any{}
		for name, v := range map[string]string{envelope.PropKey: env.Key, envelope.PropCorrelationID: env.CorrelationID, envelope.PropOriginalMessageID: env.OriginalMessageID} {
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
