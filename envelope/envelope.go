// Package envelope is the retry state a message carries in its application properties: the sbretry-*
// property names ([PropAttempt] and the others), the [Envelope] they decode to ([Decode]), the copy
// scheduled for the next attempt ([RetryCopy]) and the fresh first delivery an operator makes from a dead
// letter ([Resubmit]). Attempts run in different processes, so this, not memory, is the source of
// truth: package retry writes and reads it, and the operator tools (package inspect, sbretry, the
// console, the index) read it.
//
// A handler reads the envelope of the message it runs for with [FromContext].
package envelope

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

var (
	// ErrInvalid is wrapped by [Decode] when a message carries retry properties of the wrong type or out
	// of range (package retry's ErrInvalidEnvelope is this error).
	ErrInvalid = errors.New("retry: invalid retry properties")
	// ErrNilMessage is returned by [Decode] for a nil message (package retry's ErrNilMessage is this
	// error).
	ErrNilMessage = errors.New("retry: nil message")
)

// Application property names of the retry envelope. They are written on every retry copy and read back
// on delivery; a first delivery carries none of them.
const (
	// PropAttempt is the attempt number of the delivery that carries it (an int64; 2 on the first copy).
	PropAttempt = "sbretry-attempt"
	// PropCorrelationID ties all attempts of one message together, seeded on the first failure from the
	// message's CorrelationID, else from its idempotency key.
	PropCorrelationID = "sbretry-correlation-id"
	// PropOriginalMessageID is the MessageID of the first delivery.
	PropOriginalMessageID = "sbretry-original-message-id"
	// PropKey is the idempotency key: a name for the message that handlers can use to make their effects
	// idempotent. It does not decide the retry MessageID (see [Envelope.RetryMessageID]).
	PropKey = "sbretry-key"
	// PropFirstEnqueuedTime is when the original message was first enqueued (an AMQP timestamp).
	PropFirstEnqueuedTime = "sbretry-first-enqueued-time"
	// PropLastError is the (truncated) error text of the attempt that scheduled this copy, and on a dead
	// letter the error of the final attempt.
	PropLastError = "sbretry-last-error"
	// PropSource is the entity path (a queue, or "topic/Subscriptions/sub") on which the retry chain
	// started. With PropFirstSequenceNumber it names the chain.
	PropSource = "sbretry-source"
	// PropFirstSequenceNumber is the broker sequence number of the delivery that started the chain (an
	// int64; -1 if that delivery had none).
	PropFirstSequenceNumber = "sbretry-first-sequence-number"
	// PropExpiresAt is the absolute expiry of the first delivery (its enqueue time plus its TimeToLive,
	// an AMQP timestamp). Absent means the message never expires. Copies get only the remaining lifetime.
	PropExpiresAt = "sbretry-expires-at"
	// PropHeld marks a copy made by outage mode (an AMQP timestamp: when the message was held). It
	// carries the same attempt as the delivery it holds, since the outage spent none; a retry copy
	// never carries it.
	PropHeld = "sbretry-held"
	// PropRedrives is how many times an operator resubmitted the message from a dead-letter queue
	// ([Resubmit]; an int64). Retry copies carry it on, so every attempt of a redriven chain
	// sees it.
	PropRedrives = "sbretry-redrives"
	// PropRedrivenAt is when the latest resubmission was made (an AMQP timestamp).
	PropRedrivenAt = "sbretry-redriven-at"
)

// Properties written on a dead-lettered message, so that an operator can see what happened without
// decoding anything else. PropLastError carries the final error.
const (
	// PropDeadLetterAttempt is the attempt whose failure dead-lettered the message (an int64).
	PropDeadLetterAttempt = "sbretry-dead-letter-attempt"
	// PropDeadLetterTime is when the processor dead-lettered the message (an AMQP timestamp).
	PropDeadLetterTime = "sbretry-dead-letter-time"
	// PropDeadLetterReason repeats the DeadLetterReason, for tools that only show application properties.
	PropDeadLetterReason = "sbretry-dead-letter-reason"
)

// Limits applied when decoding envelopes written by other producers.
const (
	// MaxMessageIDLength is the Service Bus limit on MessageId.
	MaxMessageIDLength = 128
	// MaxIdentifierLength bounds the identifier properties (key, correlation id, original id, source);
	// longer values are rejected as hostile.
	MaxIdentifierLength = 1024
	// maxLastErrorProperty bounds the last-error property we accept on input.
	maxLastErrorProperty = 32 * 1024
)

// Envelope is the retry state a message carries in its application properties. Attempts run in
// different processes (and after restarts), so this, not memory, is the source of truth.
type Envelope struct {
	// Attempt is the 1-based number of the current delivery's attempt.
	Attempt int
	// CorrelationID is shared by all attempts of one message. [Decode] leaves it empty on a first
	// delivery; the processor seeds it (and Key) before calling the handler.
	CorrelationID string
	// OriginalMessageID is the MessageID of the first delivery.
	OriginalMessageID string
	// Key is the idempotency key (Options.IdempotencyKey, by default the original MessageID).
	Key string
	// FirstEnqueuedTime is when the first delivery was enqueued (zero if unknown).
	FirstEnqueuedTime time.Time
	// LastError is the error text of the previous attempt, empty on a first delivery.
	LastError string
	// Source is the entity path on which the chain started. [Decode] leaves it empty on a first
	// delivery (and on a copy that does not carry it); the processor fills it with its own entity.
	Source string
	// FirstSequenceNumber is the sequence number of the delivery that started the chain, -1 if unknown.
	// For a copy that does not carry it (one written by an older version), the chain is re-based on that copy's own
	// delivery: its sequence number is as stable across redeliveries as the first one's.
	FirstSequenceNumber int64
	// ExpiresAt is the absolute expiry of the message as its producer set it (zero means never).
	ExpiresAt time.Time
	// Redrives is how many times an operator resubmitted the message from a dead-letter queue
	// ([Resubmit], `sbretry dlq redrive`), and RedrivenAt when the latest was made; zero for a
	// message never redriven. A redriven message keeps its OriginalMessageID, Key and CorrelationID,
	// and starts again at attempt 1.
	Redrives   int
	RedrivenAt time.Time
}

// retryIDPrefix starts every retry MessageID; with the hash that follows it, a producer's own id
// cannot collide with a retry id by accident.
const retryIDPrefix = "sbretry-"

// RetryMessageID returns the MessageID of the copy for attempt n of this envelope's chain:
// "sbretry-" + 40 hex digits + "-" + n. The hex digits are the first 160 bits of the SHA-256 of the
// chain's identity: its Source, its FirstSequenceNumber and its OriginalMessageID. Sequence numbers are
// unique per entity, so two chains never share an id, whatever their idempotency keys or MessageIDs;
// every redelivery of one attempt computes the same id, so duplicate detection absorbs the copy a crash
// between scheduling and completing would publish twice. The id is at most 59 characters.
func (e Envelope) RetryMessageID(attempt int) string {
	h := sha256.New()
	// Length-prefixed fields, so that no two different identities hash the same input.
	for _, f := range []string{e.Source, strconv.FormatInt(e.FirstSequenceNumber, 10), e.OriginalMessageID} {
		h.Write([]byte(strconv.Itoa(len(f))))
		h.Write([]byte{':'})
		h.Write([]byte(f))
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return retryIDPrefix + hex.EncodeToString(sum[:20]) + "-" + strconv.Itoa(attempt)
}

// ChainID names the retry chain: the hash part of [Envelope.RetryMessageID], shared by every copy.
func (e Envelope) ChainID() string {
	id := e.RetryMessageID(0)
	return id[len(retryIDPrefix) : len(id)-2]
}

// IsRetry reports whether the delivery is a retry copy rather than the original message.
func (e Envelope) IsRetry() bool { return e.Attempt > 1 }

// Error describes an invalid retry property. It wraps [ErrInvalid].
type Error struct {
	Property string
	Reason   string
}

func (e *Error) Error() string {
	return fmt.Sprintf("retry: invalid retry properties: %s: %s", e.Property, e.Reason)
}

// Unwrap returns [ErrInvalid].
func (e *Error) Unwrap() error { return ErrInvalid }

// Decode reads the retry envelope of msg. A message without retry properties is attempt 1 whose
// original id is its own MessageID and whose first enqueue time is its EnqueuedTime. Properties of the
// wrong type, out of range (attempt < 1 or beyond 32 bits) or too long return an *[Error]; the
// processor dead-letters such messages without calling the handler, because guessing could loop forever.
func Decode(msg *azservicebus.ReceivedMessage) (Envelope, error) {
	if msg == nil {
		return Envelope{}, ErrNilMessage
	}
	env := Envelope{Attempt: 1, OriginalMessageID: msg.MessageID, FirstSequenceNumber: -1}
	if msg.EnqueuedTime != nil {
		env.FirstEnqueuedTime = msg.EnqueuedTime.UTC()
	}
	props := msg.ApplicationProperties
	if len(props) == 0 {
		env.ExpiresAt = deliveryExpiry(msg)
		return env, nil // a first delivery: nothing else to read
	}
	if v, ok := props[PropAttempt]; ok {
		n, err := attemptValue(v)
		if err != nil {
			return Envelope{}, err
		}
		env.Attempt = n
	}
	var err error
	setString(props, PropCorrelationID, MaxIdentifierLength, &env.CorrelationID, &err)
	// A message resubmitted by an older version records the producer's id only in PropResubmittedFrom.
	setString(props, PropResubmittedFrom, MaxIdentifierLength, &env.OriginalMessageID, &err)
	setString(props, PropOriginalMessageID, MaxIdentifierLength, &env.OriginalMessageID, &err)
	setString(props, PropKey, MaxIdentifierLength, &env.Key, &err)
	setString(props, PropLastError, maxLastErrorProperty, &env.LastError, &err)
	setString(props, PropSource, MaxIdentifierLength, &env.Source, &err)
	if err != nil {
		return Envelope{}, err
	}
	// An absent first-enqueued time keeps the delivery's own EnqueuedTime: the retry budget then counts
	// from this delivery, which is the best information a first delivery has. Times are kept in UTC:
	// go-amqp decodes an AMQP timestamp in the local time zone, whatever wrote it.
	if v, ok := props[PropFirstEnqueuedTime]; ok {
		t, isTime := v.(time.Time)
		if !isTime {
			return Envelope{}, &Error{Property: PropFirstEnqueuedTime, Reason: fmt.Sprintf("want a timestamp, got %T", v)}
		}
		env.FirstEnqueuedTime = t.UTC()
	}
	if v, ok := props[PropFirstSequenceNumber]; ok {
		n, isLong := v.(int64)
		if !isLong || n < -1 {
			return Envelope{}, &Error{Property: PropFirstSequenceNumber, Reason: fmt.Sprintf("want an int64 of at least -1, got %T %v", v, v)}
		}
		env.FirstSequenceNumber = n
	}
	// The expiry travels in the envelope once a chain has started; a first delivery (or a copy written
	// by an older version) has only its own TimeToLive.
	env.ExpiresAt = deliveryExpiry(msg)
	if v, ok := props[PropExpiresAt]; ok {
		t, isTime := v.(time.Time)
		if !isTime {
			return Envelope{}, &Error{Property: PropExpiresAt, Reason: fmt.Sprintf("want a timestamp, got %T", v)}
		}
		env.ExpiresAt = t.UTC()
	}
	if v, ok := props[PropRedrives]; ok {
		n, isLong := v.(int64)
		if !isLong || n < 0 || n > math.MaxInt32 {
			return Envelope{}, &Error{Property: PropRedrives, Reason: fmt.Sprintf("want an int64 in [0, %d], got %T %v", math.MaxInt32, v, v)}
		}
		env.Redrives = int(n)
	}
	if v, ok := props[PropRedrivenAt]; ok {
		t, isTime := v.(time.Time)
		if !isTime {
			return Envelope{}, &Error{Property: PropRedrivenAt, Reason: fmt.Sprintf("want a timestamp, got %T", v)}
		}
		env.RedrivenAt = t.UTC()
	}
	return env, nil
}

// setString reads the string property name into dst, bounded by limit; the first problem goes to *err
// (later calls then do nothing).
func setString(props map[string]any, name string, limit int, dst *string, err *error) {
	if *err != nil {
		return
	}
	v, ok := props[name]
	if !ok {
		return
	}
	s, isString := v.(string)
	switch {
	case !isString:
		*err = &Error{Property: name, Reason: fmt.Sprintf("want a string, got %T", v)}
	case len(s) > limit:
		*err = &Error{Property: name, Reason: fmt.Sprintf("%d bytes exceed the limit of %d", len(s), limit)}
	default:
		*dst = s
	}
}

// deliveryExpiry is when this delivery expires by its own TimeToLive, counted from its enqueue time as
// Service Bus counts it (for a scheduled message, from its scheduled enqueue time). Zero means never: no
// TimeToLive, or a zero one (the SDK reports the AMQP header's ttl, which is 0 when unset).
func deliveryExpiry(msg *azservicebus.ReceivedMessage) time.Time {
	if msg.TimeToLive == nil || *msg.TimeToLive <= 0 || msg.EnqueuedTime == nil {
		return time.Time{}
	}
	return msg.EnqueuedTime.Add(*msg.TimeToLive).UTC()
}

// attemptValue accepts any AMQP integer type in [1, MaxInt32]. We write an int64, but producers in other
// languages (or tools that copy messages) may re-encode the property as int or short, and the SDK hands
// each AMQP integer type back as its own Go type; refusing them would dead-letter honest messages.
func attemptValue(v any) (int, error) {
	var n int64
	switch x := v.(type) {
	case int64:
		n = x
	case int32:
		n = int64(x)
	case int:
		n = int64(x)
	case int16:
		n = int64(x)
	case int8:
		n = int64(x)
	case uint8:
		n = int64(x)
	case uint16:
		n = int64(x)
	case uint32:
		n = int64(x)
	case uint64:
		if x > math.MaxInt32 {
			return 0, &Error{Property: PropAttempt, Reason: "out of range"}
		}
		n = int64(x)
	default:
		return 0, &Error{Property: PropAttempt, Reason: fmt.Sprintf("want an integer, got %T", v)}
	}
	if n < 1 || n > math.MaxInt32 {
		return 0, &Error{Property: PropAttempt, Reason: fmt.Sprintf("%d is out of range [1, %d]", n, math.MaxInt32)}
	}
	return int(n), nil
}

// envelopeKey is the context key of the handler's Envelope; unexported so no other package collides.
type envelopeKey struct{}

// NewContext returns ctx carrying env for a handler (package retry calls it before each handler call).
// It keeps the pointer, not a copy: the caller must not change env while the handler runs.
func NewContext(ctx context.Context, env *Envelope) context.Context {
	return context.WithValue(ctx, envelopeKey{}, env)
}

// FromContext returns the envelope of the message whose handler received ctx.
func FromContext(ctx context.Context) (Envelope, bool) {
	env, ok := ctx.Value(envelopeKey{}).(*Envelope)
	if !ok || env == nil {
		return Envelope{}, false
	}
	return *env, true
}

// RetryCopy builds the message to schedule for attempt next of env's chain, with the MessageID id
// (normally env.RetryMessageID(next)), lastError as [PropLastError] and ttl as its TimeToLive. Every
// property of msg is kept and the application properties are deep-copied, so neither message can alter
// the other; [PropHeld] is dropped, since a retry copy is never a held one.
func RetryCopy(msg *azservicebus.ReceivedMessage, env Envelope, next int, id, lastError string, ttl *time.Duration) *azservicebus.Message {
	props := make(map[string]any, len(msg.ApplicationProperties)+9)
	for k, v := range msg.ApplicationProperties {
		props[k] = cloneValue(v)
	}
	props[PropAttempt] = int64(next)
	delete(props, PropHeld)
	props[PropCorrelationID] = env.CorrelationID
	props[PropOriginalMessageID] = env.OriginalMessageID
	props[PropKey] = env.Key
	props[PropLastError] = lastError
	if !env.FirstEnqueuedTime.IsZero() {
		props[PropFirstEnqueuedTime] = env.FirstEnqueuedTime.UTC()
	}
	props[PropSource] = env.Source
	props[PropFirstSequenceNumber] = env.FirstSequenceNumber
	if !env.ExpiresAt.IsZero() {
		props[PropExpiresAt] = env.ExpiresAt.UTC()
	} else {
		delete(props, PropExpiresAt)
	}
	var body []byte
	if msg.Body != nil {
		body = append(make([]byte, 0, len(msg.Body)), msg.Body...)
	}
	return &azservicebus.Message{
		ApplicationProperties: props,
		Body:                  body,
		ContentType:           cloneString(msg.ContentType),
		CorrelationID:         cloneString(msg.CorrelationID),
		MessageID:             &id,
		PartitionKey:          cloneString(msg.PartitionKey),
		ReplyTo:               cloneString(msg.ReplyTo),
		ReplyToSessionID:      cloneString(msg.ReplyToSessionID),
		SessionID:             cloneString(msg.SessionID),
		Subject:               cloneString(msg.Subject),
		TimeToLive:            ttl,
		To:                    cloneString(msg.To),
	}
}

// cloneValue copies the one mutable property type the SDK produces, []byte; the others are values.
func cloneValue(v any) any {
	if b, ok := v.([]byte); ok {
		return append([]byte(nil), b...)
	}
	return v
}

func cloneString(s *string) *string {
	if s == nil {
		return nil
	}
	c := *s
	return &c
}
