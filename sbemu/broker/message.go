package broker

import (
	"strings"
	"time"

	"github.com/Azure/go-amqp"
	"github.com/google/uuid"
)

// Message annotation and application property names the SDK reads. The value
// types are part of the contract: azservicebus type-asserts them and panics on
// a mismatch, so sequence numbers are always int64 and times time.Time.
const (
	AnnotationSequenceNumber         = "x-opt-sequence-number"         // int64
	AnnotationEnqueuedTime           = "x-opt-enqueued-time"           // time.Time
	AnnotationLockedUntil            = "x-opt-locked-until"            // time.Time, peek-lock only
	AnnotationScheduledEnqueueTime   = "x-opt-scheduled-enqueue-time"  // time.Time, set by senders
	AnnotationDeadLetterSource       = "x-opt-deadletter-source"       // string, DLQ messages
	AnnotationEnqueuedSequenceNumber = "x-opt-enqueue-sequence-number" // int64, DLQ messages: the original number
	AnnotationMessageState           = "x-opt-message-state"           // int64: 1 deferred, 2 scheduled (peeked)

	PropertyDeadLetterReason           = "DeadLetterReason"
	PropertyDeadLetterErrorDescription = "DeadLetterErrorDescription"
)

// Dead-letter reasons the broker itself uses, matching Service Bus.
const (
	ReasonMaxDeliveryCountExceeded = "MaxDeliveryCountExceeded"
	ReasonTTLExpired               = "TTLExpiredException"
)

// messageStateScheduled is the x-opt-message-state value the SDK maps to
// MessageStateScheduled.
const messageStateScheduled int64 = 2

// assignMessageID gives a message sent without a MessageId one, as Service
// Bus does: every message a receiver gets has an id. The JavaScript SDK
// relies on it (its lock renewer keys messages by messageId and fails on a
// message without one), which is how the emulator learned it. The id is a
// random UUID written without dashes. Duplicate
// detection never sees such an id, because it only applies to ids the
// sender chose.
func assignMessageID(m *amqp.Message) {
	if m.Properties == nil {
		m.Properties = &amqp.MessageProperties{}
	}
	if m.Properties.MessageID == nil {
		m.Properties.MessageID = strings.ReplaceAll(uuid.NewString(), "-", "")
	}
}

// CopyMessage returns a deep copy of m: header, properties, every annotation
// and property map, body sections and the values inside them (byte slices,
// maps and slices are copied recursively). The broker copies every message it
// stores and every message it hands out, so a caller mutating a [Delivery] or
// reusing a sent message can never corrupt the stored one. A nil m gives nil.
func CopyMessage(m *amqp.Message) *amqp.Message {
	if m == nil {
		return nil
	}
	c := &amqp.Message{
		Format:              m.Format,
		DeliveryTag:         copyBytes(m.DeliveryTag),
		DeliveryAnnotations: copyAnnotations(m.DeliveryAnnotations),
		Annotations:         copyAnnotations(m.Annotations),
		Footer:              copyAnnotations(m.Footer),
		Value:               copyValue(m.Value),
	}
	if m.Header != nil {
		h := *m.Header
		c.Header = &h
	}
	if m.Properties != nil {
		p := *m.Properties
		p.MessageID = copyValue(p.MessageID)
		p.CorrelationID = copyValue(p.CorrelationID)
		p.UserID = copyBytes(p.UserID)
		p.To = copyPtr(p.To)
		p.Subject = copyPtr(p.Subject)
		p.ReplyTo = copyPtr(p.ReplyTo)
		p.ContentType = copyPtr(p.ContentType)
		p.ContentEncoding = copyPtr(p.ContentEncoding)
		p.AbsoluteExpiryTime = copyPtr(p.AbsoluteExpiryTime)
		p.CreationTime = copyPtr(p.CreationTime)
		p.GroupID = copyPtr(p.GroupID)
		p.GroupSequence = copyPtr(p.GroupSequence)
		p.ReplyToGroupID = copyPtr(p.ReplyToGroupID)
		c.Properties = &p
	}
	if m.ApplicationProperties != nil {
		c.ApplicationProperties = make(map[string]any, len(m.ApplicationProperties))
		for k, v := range m.ApplicationProperties {
			c.ApplicationProperties[k] = copyValue(v)
		}
	}
	if m.Data != nil {
		c.Data = make([][]byte, len(m.Data))
		for i, d := range m.Data {
			c.Data[i] = copyBytes(d)
		}
	}
	if m.Sequence != nil {
		c.Sequence = make([][]any, len(m.Sequence))
		for i, s := range m.Sequence {
			c.Sequence[i] = copyValue(s).([]any)
		}
	}
	return c
}

// copyBytes keeps nil as nil, so an absent field stays absent.
func copyBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}

// copyPtr copies the value behind an optional field.
func copyPtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// copyAnnotations deep-copies an annotation map, nil staying nil.
func copyAnnotations(a amqp.Annotations) amqp.Annotations {
	if a == nil {
		return nil
	}
	c := make(amqp.Annotations, len(a))
	for k, v := range a {
		c[k] = copyValue(v)
	}
	return c
}

// copyValue deep-copies the mutable AMQP value shapes (binary, maps, lists,
// arrays of binary); everything else the codec produces is immutable.
func copyValue(v any) any {
	switch v := v.(type) {
	case []byte:
		return copyBytes(v)
	case []any:
		if v == nil {
			return v
		}
		c := make([]any, len(v))
		for i, e := range v {
			c[i] = copyValue(e)
		}
		return c
	case [][]byte:
		if v == nil {
			return v
		}
		c := make([][]byte, len(v))
		for i, e := range v {
			c[i] = copyBytes(e)
		}
		return c
	case map[any]any:
		if v == nil {
			return v
		}
		c := make(map[any]any, len(v))
		for k, e := range v {
			c[k] = copyValue(e)
		}
		return c
	case amqp.Annotations:
		return copyAnnotations(v)
	case map[string]any:
		if v == nil {
			return v
		}
		c := make(map[string]any, len(v))
		for k, e := range v {
			c[k] = copyValue(e)
		}
		return c
	case map[amqp.Symbol]any:
		if v == nil {
			return v
		}
		c := make(map[amqp.Symbol]any, len(v))
		for k, e := range v {
			c[k] = copyValue(e)
		}
		return c
	default:
		return v
	}
}

// annotation looks up a message annotation whether its key arrived as a Go
// string or as an [amqp.Symbol]; the codec may produce either.
func annotation(m *amqp.Message, key string) (any, bool) {
	if m == nil || m.Annotations == nil {
		return nil, false
	}
	if v, ok := m.Annotations[key]; ok {
		return v, true
	}
	v, ok := m.Annotations[amqp.Symbol(key)]
	return v, ok
}

// scheduledEnqueueTime returns the x-opt-scheduled-enqueue-time annotation of
// m, if it is present and a time.
func scheduledEnqueueTime(m *amqp.Message) (time.Time, bool) {
	v, ok := annotation(m, AnnotationScheduledEnqueueTime)
	if !ok {
		return time.Time{}, false
	}
	t, ok := v.(time.Time)
	return t, ok && !t.IsZero()
}

// setAnnotation stores a system annotation under a string key, first removing
// a symbol-keyed duplicate so the encoder never writes the key twice.
func setAnnotation(m *amqp.Message, key string, value any) {
	if m.Annotations == nil {
		m.Annotations = amqp.Annotations{}
	}
	delete(m.Annotations, amqp.Symbol(key))
	m.Annotations[key] = value
}

// sessionID is the message's session id (AMQP group-id, the SDK's
// SessionID), empty without one.
func sessionID(m *amqp.Message) string {
	if m == nil || m.Properties == nil || m.Properties.GroupID == nil {
		return ""
	}
	return *m.Properties.GroupID
}

// groupID is the message's session id, nil without one.
func groupID(m *amqp.Message) *string {
	if m.Properties == nil {
		return nil
	}
	return m.Properties.GroupID
}

// headerTTL is the message's own time-to-live, zero if it has none.
func headerTTL(m *amqp.Message) time.Duration {
	if m.Header == nil {
		return 0
	}
	return m.Header.TTL
}
