package retry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/internal/redact"
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
	// ([ResubmitMessage]; an int64). Retry copies carry it on, so every attempt of a redriven chain
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
	// maxEnvelopeString bounds the identifier properties; longer values are rejected as hostile.
	maxEnvelopeString = 1024
	// maxLastErrorProperty bounds the last-error property we accept on input.
	maxLastErrorProperty = 32 * 1024
)

// Envelope is the retry state a message carries in its application properties. Attempts run in
// different processes (and after restarts), so this, not memory, is the source of truth.
type Envelope struct {
	// Attempt is the 1-based number of the current delivery's attempt.
	Attempt int
	// CorrelationID is shared by all attempts of one message. [DecodeEnvelope] leaves it empty on a first
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
	// Source is the entity path on which the chain started. [DecodeEnvelope] leaves it empty on a first
	// delivery (and on a copy that does not carry it); the processor fills it with its own entity.
	Source string
	// FirstSequenceNumber is the sequence number of the delivery that started the chain, -1 if unknown.
	// For a copy that does not carry it (one written by an older version), the chain is re-based on that copy's own
	// delivery: its sequence number is as stable across redeliveries as the first one's.
	FirstSequenceNumber int64
	// ExpiresAt is the absolute expiry of the message as its producer set it (zero means never).
	ExpiresAt time.Time
	// Redrives is how many times an operator resubmitted the message from a dead-letter queue
	// ([ResubmitMessage], `sbretry dlq redrive`), and RedrivenAt when the latest was made; zero for a
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

// EnvelopeError describes an invalid retry property. It wraps [ErrInvalidEnvelope].
type EnvelopeError struct {
	Property string
	Reason   string
}

func (e *EnvelopeError) Error() string {
	return fmt.Sprintf("retry: invalid retry properties: %s: %s", e.Property, e.Reason)
}

// Unwrap returns [ErrInvalidEnvelope].
func (e *EnvelopeError) Unwrap() error { return ErrInvalidEnvelope }

// DecodeEnvelope reads the retry envelope of msg. A message without retry properties is attempt 1 whose
// original id is its own MessageID and whose first enqueue time is its EnqueuedTime. Properties of the
// wrong type, out of range (attempt < 1 or beyond 32 bits) or too long return an *[EnvelopeError]; the
// processor dead-letters such messages without calling the handler, because guessing could loop forever.
func DecodeEnvelope(msg *azservicebus.ReceivedMessage) (Envelope, error) {
	if msg == nil {
		return Envelope{}, ErrNilMessage
	}
	env := Envelope{Attempt: 1, OriginalMessageID: msg.MessageID, FirstSequenceNumber: -1}
	if msg.EnqueuedTime != nil {
		env.FirstEnqueuedTime = *msg.EnqueuedTime
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
	setString(props, PropCorrelationID, maxEnvelopeString, &env.CorrelationID, &err)
	// A message resubmitted by an older version records the producer's id only in PropResubmittedFrom.
	setString(props, PropResubmittedFrom, maxEnvelopeString, &env.OriginalMessageID, &err)
	setString(props, PropOriginalMessageID, maxEnvelopeString, &env.OriginalMessageID, &err)
	setString(props, PropKey, maxEnvelopeString, &env.Key, &err)
	setString(props, PropLastError, maxLastErrorProperty, &env.LastError, &err)
	setString(props, PropSource, maxEnvelopeString, &env.Source, &err)
	if err != nil {
		return Envelope{}, err
	}
	// An absent first-enqueued time keeps the delivery's own EnqueuedTime: the retry budget then counts
	// from this delivery, which is the best information a first delivery has.
	if v, ok := props[PropFirstEnqueuedTime]; ok {
		t, isTime := v.(time.Time)
		if !isTime {
			return Envelope{}, &EnvelopeError{Property: PropFirstEnqueuedTime, Reason: fmt.Sprintf("want a timestamp, got %T", v)}
		}
		env.FirstEnqueuedTime = t
	}
	if v, ok := props[PropFirstSequenceNumber]; ok {
		n, isLong := v.(int64)
		if !isLong || n < -1 {
			return Envelope{}, &EnvelopeError{Property: PropFirstSequenceNumber, Reason: fmt.Sprintf("want an int64 of at least -1, got %T %v", v, v)}
		}
		env.FirstSequenceNumber = n
	}
	// The expiry travels in the envelope once a chain has started; a first delivery (or a copy written
	// by an older version) has only its own TimeToLive.
	env.ExpiresAt = deliveryExpiry(msg)
	if v, ok := props[PropExpiresAt]; ok {
		t, isTime := v.(time.Time)
		if !isTime {
			return Envelope{}, &EnvelopeError{Property: PropExpiresAt, Reason: fmt.Sprintf("want a timestamp, got %T", v)}
		}
		env.ExpiresAt = t
	}
	if v, ok := props[PropRedrives]; ok {
		n, isLong := v.(int64)
		if !isLong || n < 0 || n > math.MaxInt32 {
			return Envelope{}, &EnvelopeError{Property: PropRedrives, Reason: fmt.Sprintf("want an int64 in [0, %d], got %T %v", math.MaxInt32, v, v)}
		}
		env.Redrives = int(n)
	}
	if v, ok := props[PropRedrivenAt]; ok {
		t, isTime := v.(time.Time)
		if !isTime {
			return Envelope{}, &EnvelopeError{Property: PropRedrivenAt, Reason: fmt.Sprintf("want a timestamp, got %T", v)}
		}
		env.RedrivenAt = t
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
		*err = &EnvelopeError{Property: name, Reason: fmt.Sprintf("want a string, got %T", v)}
	case len(s) > limit:
		*err = &EnvelopeError{Property: name, Reason: fmt.Sprintf("%d bytes exceed the limit of %d", len(s), limit)}
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
	return msg.EnqueuedTime.Add(*msg.TimeToLive)
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
			return 0, &EnvelopeError{Property: PropAttempt, Reason: "out of range"}
		}
		n = int64(x)
	default:
		return 0, &EnvelopeError{Property: PropAttempt, Reason: fmt.Sprintf("want an integer, got %T", v)}
	}
	if n < 1 || n > math.MaxInt32 {
		return 0, &EnvelopeError{Property: PropAttempt, Reason: fmt.Sprintf("%d is out of range [1, %d]", n, math.MaxInt32)}
	}
	return int(n), nil
}

// envelopeKey is the context key of the handler's Envelope; unexported so no other package collides.
type envelopeKey struct{}

// withEnvelope returns ctx carrying env for the handler. It keeps the pointer, not a copy: the
// processor does not change env while the handler runs.
func withEnvelope(ctx context.Context, env *Envelope) context.Context {
	return context.WithValue(ctx, envelopeKey{}, env)
}

// EnvelopeFromContext returns the envelope of the message whose handler received ctx.
func EnvelopeFromContext(ctx context.Context) (Envelope, bool) {
	env, ok := ctx.Value(envelopeKey{}).(*Envelope)
	if !ok || env == nil {
		return Envelope{}, false
	}
	return *env, true
}

// retryCopy builds the message scheduled for attempt next, with the MessageID id. Every property is
// preserved and the application properties are deep-copied, so neither message can alter the other.
func retryCopy(msg *azservicebus.ReceivedMessage, env Envelope, next int, id, lastError string, ttl *time.Duration) *azservicebus.Message {
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

// Service Bus limits on message headers (the quotas page): one property may take 32 KiB, and all
// properties, system and application, 64 KiB together. A retry copy over them is refused by the broker
// on every redelivery, so the processor dead-letters it instead.
const (
	maxPropertySize = 32 * 1024
	maxHeaderSize   = 64 * 1024
)

// oversize says why the retry copy m would not fit the Service Bus limits, with the size and the limit
// ("" when it fits): its estimated encoded size within maxMessageSize, each application property
// within 32 KiB and the headers within 64 KiB. The estimates err on the large side (a fixed allowance
// for framing, the widest encoding for numbers). The text becomes the dead-letter's description, so an
// operator sees what was too large by how much without opening the message.
func oversize(m *azservicebus.Message, maxMessageSize int) string {
	const framing = 512
	header := 0
	for _, s := range []*string{m.ContentType, m.CorrelationID, m.MessageID, m.PartitionKey, m.ReplyTo, m.ReplyToSessionID, m.SessionID, m.Subject, m.To} {
		if s != nil {
			header += len(*s) + 5
		}
	}
	for k, v := range m.ApplicationProperties {
		size := len(k) + 5 + valueSize(v)
		if size > maxPropertySize {
			return fmt.Sprintf("the retry copy's application property %q takes about %d bytes; the limit is %d", redact.String(truncate(k, 64)), size, maxPropertySize)
		}
		header += size
	}
	if header > maxHeaderSize {
		return fmt.Sprintf("the retry copy's header and application properties take about %d bytes; the limit is %d", header, maxHeaderSize)
	}
	if total := framing + header + len(m.Body); total > maxMessageSize {
		return fmt.Sprintf("the retry copy would take about %d bytes (body %d); the limit is %d (Options.MaxMessageSize)", total, len(m.Body), maxMessageSize)
	}
	return ""
}

// propertiesSize estimates the encoded size of application properties, as oversize counts them.
func propertiesSize(props map[string]any) int {
	n := 0
	for k, v := range props {
		n += len(k) + 5 + valueSize(v)
	}
	return n
}

func valueSize(v any) int {
	switch x := v.(type) {
	case string:
		return len(x) + 5
	case []byte:
		return len(x) + 5
	default:
		return 9
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

// truncate cuts s to at most limit bytes without splitting a UTF-8 sequence, marking the cut.
func truncate(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	mark := "…"
	if limit < len(mark) {
		mark = "" // no room for the mark: a plain cut keeps the bound
	}
	cut := max(limit-len(mark), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// seed fills what a first delivery's envelope lacks: the key, the correlation id (the message's
// CorrelationID, else the key) and the chain's identity (this processor's entity and the delivery's
// sequence number). A copy written by an older version has no chain identity either; its chain is re-based on
// its own delivery, whose sequence number is as stable across redeliveries.
func seed(msg *azservicebus.ReceivedMessage, env Envelope, entity string, key func(*azservicebus.ReceivedMessage) string) Envelope {
	if env.Key == "" {
		env.Key = key(msg)
		if len(env.Key) > maxEnvelopeString {
			sum := sha256.Sum256([]byte(env.Key))
			env.Key = "sha256-" + hex.EncodeToString(sum[:])
		}
	}
	if env.CorrelationID == "" {
		env.CorrelationID = env.Key
		if msg.CorrelationID != nil && *msg.CorrelationID != "" && len(*msg.CorrelationID) <= maxEnvelopeString {
			env.CorrelationID = *msg.CorrelationID
		}
	}
	if env.Source == "" {
		env.Source = entity
	}
	if env.FirstSequenceNumber < 0 && msg.SequenceNumber != nil {
		env.FirstSequenceNumber = *msg.SequenceNumber
	}
	return env
}

// idempotencyKey returns the configured key, falling back to the sequence number and then the lock
// token so that a message without a MessageID still gets a stable key.
func (p *Processor) idempotencyKey(msg *azservicebus.ReceivedMessage) string {
	if p.cfg.userKey {
		return p.userIdempotencyKey(msg)
	}
	return keyOrFallback(defaultKey(msg), msg)
}

// userIdempotencyKey is idempotencyKey with Options.IdempotencyKey, which may panic.
func (p *Processor) userIdempotencyKey(msg *azservicebus.ReceivedMessage) (key string) {
	defer func() {
		if r := recover(); r != nil {
			key = msg.MessageID // a panicking IdempotencyKey must not take the consumer down
			p.log(context.Background(), slog.LevelError, "Options.IdempotencyKey panicked; using the MessageID", msg, Envelope{}, slog.Any("panic", r))
		}
	}()
	return keyOrFallback(p.cfg.key(msg), msg)
}

// keyOrFallback returns k, or, if it is empty, the sequence number and then the lock token.
func keyOrFallback(k string, msg *azservicebus.ReceivedMessage) string {
	if k != "" {
		return k
	}
	if msg.SequenceNumber != nil {
		return fmt.Sprintf("seq-%d", *msg.SequenceNumber)
	}
	return fmt.Sprintf("lock-%x", msg.LockToken)
}
