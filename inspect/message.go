package inspect

import (
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
)

// Pending is a scheduled retry copy: the message will be retried when it falls due.
type Pending struct {
	// Entity is where the copy is scheduled; [Inspector.Cancel] cancels it there.
	Entity string
	// SequenceNumber identifies the scheduled copy; cancel it with this number. It changes when the
	// copy activates (Service Bus gives an activated scheduled message a new one).
	SequenceNumber int64
	// MessageID is the retry MessageID of the copy ([envelope.Envelope.RetryMessageID]).
	MessageID string
	// DueTime is the ScheduledEnqueueTime: when the copy becomes receivable. Service Bus activates
	// scheduled messages close to, but not exactly at, this time.
	DueTime time.Time
	// Attempt is the attempt the copy will run as (2 for the first retry).
	Attempt int
	// LastError is the error of the attempt that scheduled the copy (already truncated and redacted by
	// the processor that wrote it).
	LastError string
	// Envelope is the decoded retry envelope of the copy.
	Envelope envelope.Envelope
}

// Ref addresses the copy: [Inspector.Cancel] takes it.
func (p Pending) Ref() Ref { return Ref{Entity: p.Entity, SequenceNumber: p.SequenceNumber} }

// Active is a copy that is receivable now or locked by a consumer processing it; Service Bus peek does
// not tell the two apart.
type Active struct {
	// Entity is the entity holding the message.
	Entity string
	// SequenceNumber is the message's sequence number there.
	SequenceNumber int64
	// MessageID is the message's id: the original's for a first delivery, a retry MessageID for a copy.
	MessageID string
	// Attempt is the attempt this delivery runs as (1 for a first delivery).
	Attempt int
	// EnqueuedTime is when the message became receivable.
	EnqueuedTime time.Time
	// DeliveryCount counts the broker's deliveries of this message (redeliveries after lock loss, not
	// retry attempts).
	DeliveryCount uint32
	// LastError is the error of the previous attempt, empty for a first delivery.
	LastError string
	// Envelope is the decoded retry envelope (attempt 1 and no chain fields for a first delivery).
	Envelope envelope.Envelope
}

// Ref addresses the message in its entity.
func (a Active) Ref() Ref { return Ref{Entity: a.Entity, SequenceNumber: a.SequenceNumber} }

// DeadLetter is a message in the entity's dead-letter queue.
type DeadLetter struct {
	// Entity is the path of the dead-letter queue holding it: the entity's, or its retry queue's.
	Entity string
	// SequenceNumber is the message's sequence number in that dead-letter queue, which counts on its
	// own: only with Entity does it name the message ([DeadLetter.Ref]).
	SequenceNumber int64
	// MessageID is the dead letter's MessageID.
	MessageID string
	// Key is the idempotency key the consumer recorded on it (sbretry-key), empty when the dead letter
	// carries none, as for a message the retry library did not dead-letter.
	Key string
	// CorrelationID is the chain's correlation id as the consumer recorded it, else the message's own
	// CorrelationID.
	CorrelationID string
	// Reason is the broker's DeadLetterReason ("RetryMaxAttemptsExceeded", "MaxDeliveryCountExceeded",
	// ...), or the retry library's sbretry-dead-letter-reason when the broker's is missing.
	Reason string
	// Description is the broker's DeadLetterErrorDescription.
	Description string
	// Attempt is the attempt whose failure dead-lettered the message: sbretry-dead-letter-attempt, else
	// the envelope's attempt; 0 when the envelope is invalid and the property absent.
	Attempt int
	// DeadLetteredAt is sbretry-dead-letter-time, else the time the message entered the dead-letter
	// queue (its EnqueuedTime there).
	DeadLetteredAt time.Time
	// LastError is the final attempt's error (sbretry-last-error), empty if the retry library did not
	// write one.
	LastError string
	// Source is the entity the message was dead-lettered from (the broker's DeadLetterSource), when the
	// broker reports it.
	Source string
	// Envelope is the decoded retry envelope; EnvelopeErr is set instead when its properties are invalid
	// (the processor dead-letters such messages with reason RetryInvalidProperties).
	Envelope    envelope.Envelope
	EnvelopeErr error
	// Message is the peeked dead letter, body and properties included, for display or resubmission
	// ([envelope.Resubmit]).
	Message *azservicebus.ReceivedMessage
}

// Ref addresses the dead letter: [Inspector.DeadLetter] and [DeadLetterFilter.Refs] take it.
func (dl DeadLetter) Ref() Ref { return Ref{Entity: dl.Entity, SequenceNumber: dl.SequenceNumber} }

// Who dead-lettered a message, as [DeadLetter.DeadLetteredBy] tells it.
const (
	// ByRetry is the retry library: the dead letter carries its sbretry-dead-letter-* properties.
	ByRetry = "retry"
	// ByServiceBus is the broker itself: a dead letter without the retry library's properties whose
	// reason is one Service Bus gives (MaxDeliveryCountExceeded, TTLExpiredException, ...).
	ByServiceBus = "Service Bus"
	// ByApplication is anything else: an application (or an operator's tool) that dead-lettered the
	// message with a reason of its own.
	ByApplication = "application"
)

// brokerReasons are the DeadLetterReasons Service Bus itself writes, in lower case
// (learn.microsoft.com/azure/service-bus-messaging/service-bus-dead-letter-queues).
var brokerReasons = map[string]bool{
	"maxdeliverycountexceeded":    true,
	"ttlexpiredexception":         true,
	"headersizeexceeded":          true,
	"maxtransferhopcountexceeded": true,
	"session id is null":          true,
}

// DeadLetteredBy says who dead-lettered the message: [ByRetry] when it carries the retry library's
// dead-letter properties, else [ByServiceBus] for a reason the broker gives, else [ByApplication].
// Service Bus's own dead letters carry none of the retry library's metadata (a message that ran out
// of deliveries, or expired in a queue that dead-letters on expiration): their reason and description
// are the broker's, and they are grouped, filtered and redriven like the retry library's.
func (dl DeadLetter) DeadLetteredBy() string {
	if m := dl.Message; m != nil {
		for _, p := range []string{envelope.PropDeadLetterReason, envelope.PropDeadLetterAttempt, envelope.PropDeadLetterTime} {
			if _, ok := m.ApplicationProperties[p]; ok {
				return ByRetry
			}
		}
	}
	if brokerReasons[strings.ToLower(strings.TrimSuffix(dl.Reason, "."))] {
		return ByServiceBus
	}
	return ByApplication
}

// OriginalMessageID is the MessageID of the chain's first delivery, the id the producer knows: the
// envelope's, else the dead letter's own MessageID.
func (dl DeadLetter) OriginalMessageID() string {
	if dl.EnvelopeErr == nil && dl.Envelope.OriginalMessageID != "" {
		return dl.Envelope.OriginalMessageID
	}
	return dl.MessageID
}

// decoded is a peeked message with its envelope, decoded once.
type decoded struct {
	msg    *azservicebus.ReceivedMessage
	env    envelope.Envelope
	envErr error
}

func decode(m *azservicebus.ReceivedMessage) decoded {
	env, err := envelope.Decode(m)
	return decoded{msg: m, env: env, envErr: err}
}

// isProbe reports the retry library's send-rights probe (see [retry.PropProbe]): scheduled and
// cancelled at once by a connection check, never a retry.
func (d decoded) isProbe() bool {
	v, ok := d.msg.ApplicationProperties[retry.PropProbe].(string)
	return ok && v == retry.ProbeValue
}

// isScheduled reports a message that is not receivable yet.
func (d decoded) isScheduled() bool { return d.msg.State == azservicebus.MessageStateScheduled }

// isRetryCopy reports a message the retry library scheduled: it carries a valid envelope with an
// attempt property.
func (d decoded) isRetryCopy() bool {
	_, has := d.msg.ApplicationProperties[envelope.PropAttempt]
	return has && d.envErr == nil
}

// matches reports whether the message belongs to id: its MessageID, or its envelope's Key,
// CorrelationID or OriginalMessageID, or (for a first delivery, which has no envelope yet) its own
// CorrelationID, or the original MessageID a resubmission recorded in [envelope.PropResubmittedFrom].
func (d decoded) matches(id string) bool {
	m := d.msg
	if m.MessageID == id {
		return true
	}
	if d.envErr == nil && (d.env.Key == id || d.env.CorrelationID == id || d.env.OriginalMessageID == id) {
		return true
	}
	if m.CorrelationID != nil && *m.CorrelationID == id {
		return true
	}
	v, ok := m.ApplicationProperties[envelope.PropResubmittedFrom].(string)
	return ok && v == id
}

func seqOf(m *azservicebus.ReceivedMessage) int64 {
	if m.SequenceNumber == nil {
		return -1
	}
	return *m.SequenceNumber
}

func (d decoded) pending(entity string) Pending {
	p := Pending{
		Entity:         entity,
		SequenceNumber: seqOf(d.msg),
		MessageID:      d.msg.MessageID,
		Attempt:        d.env.Attempt,
		LastError:      d.env.LastError,
		Envelope:       d.env,
	}
	if d.msg.ScheduledEnqueueTime != nil {
		p.DueTime = *d.msg.ScheduledEnqueueTime
	}
	return p
}

func (d decoded) active(entity string) Active {
	a := Active{
		Entity:         entity,
		SequenceNumber: seqOf(d.msg),
		MessageID:      d.msg.MessageID,
		Attempt:        d.env.Attempt,
		DeliveryCount:  d.msg.DeliveryCount,
		LastError:      d.env.LastError,
		Envelope:       d.env,
	}
	if d.msg.EnqueuedTime != nil {
		a.EnqueuedTime = *d.msg.EnqueuedTime
	}
	return a
}

func (d decoded) deadLetter(entity string) DeadLetter {
	m := d.msg
	dl := DeadLetter{
		Entity:         entity,
		SequenceNumber: seqOf(m),
		MessageID:      m.MessageID,
		Key:            d.env.Key,
		CorrelationID:  d.env.CorrelationID,
		Envelope:       d.env,
		EnvelopeErr:    d.envErr,
		Message:        m,
	}
	if dl.CorrelationID == "" && m.CorrelationID != nil {
		dl.CorrelationID = *m.CorrelationID
	}
	props := m.ApplicationProperties
	if m.DeadLetterReason != nil {
		dl.Reason = *m.DeadLetterReason
	}
	if dl.Reason == "" {
		dl.Reason, _ = props[envelope.PropDeadLetterReason].(string)
	}
	if m.DeadLetterErrorDescription != nil {
		dl.Description = *m.DeadLetterErrorDescription
	}
	if m.DeadLetterSource != nil {
		dl.Source = *m.DeadLetterSource
	}
	dl.LastError, _ = props[envelope.PropLastError].(string)
	if n, ok := props[envelope.PropDeadLetterAttempt].(int64); ok && n > 0 && n <= 1<<31-1 {
		dl.Attempt = int(n)
	} else if d.envErr == nil {
		dl.Attempt = d.env.Attempt
	}
	if t, ok := props[envelope.PropDeadLetterTime].(time.Time); ok {
		dl.DeadLetteredAt = t
	} else if m.EnqueuedTime != nil {
		dl.DeadLetteredAt = *m.EnqueuedTime
	}
	return dl
}
