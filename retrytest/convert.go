package retrytest

import (
	"errors"
	"fmt"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"

	"github.com/sbretry/retry/sbemu/broker"
)

// The broker model stores AMQP messages, the form in which the SDK hands them to the emulator. This
// file translates between that form and the SDK's types the way azservicebus does on the wire
// (message.go in the SDK: toAMQPMessage on the way in, newReceivedMessage on the way out), so a
// message sent through this package and one sent through the SDK to the emulator are the same message
// to the broker, and a handler sees the same fields either way. Unlike the SDK, a system annotation of
// an unexpected type is ignored instead of panicking.

// Annotation the SDK writes for a PartitionKey; the others come from the broker package.
const annotationPartitionKey = "x-opt-partition-key"

// errNilMessage reports a nil *azservicebus.Message handed to Send or ScheduleMessages.
var errNilMessage = errors.New("retrytest: nil message")

// toAMQPMessage builds the AMQP message the SDK would send for m: its Body as the one data section
// (an empty section for a nil Body, as the SDK sends), the header TTL, the properties, the application
// properties and the partition key and scheduled enqueue time annotations. The maps are shallow copies;
// the broker deep-copies what it stores.
func toAMQPMessage(m *azservicebus.Message) (*amqp.Message, error) {
	if m == nil {
		return nil, errNilMessage
	}
	a := &amqp.Message{
		Data: [][]byte{m.Body},
		Properties: &amqp.MessageProperties{
			GroupID:        m.SessionID,
			ContentType:    m.ContentType,
			Subject:        m.Subject,
			To:             m.To,
			ReplyTo:        m.ReplyTo,
			ReplyToGroupID: m.ReplyToSessionID,
		},
		Annotations: amqp.Annotations{},
	}
	if m.TimeToLive != nil {
		a.Header = &amqp.MessageHeader{TTL: *m.TimeToLive}
	}
	if m.MessageID != nil {
		a.Properties.MessageID = *m.MessageID
	}
	if m.CorrelationID != nil {
		a.Properties.CorrelationID = *m.CorrelationID
	}
	if len(m.ApplicationProperties) > 0 {
		a.ApplicationProperties = make(map[string]any, len(m.ApplicationProperties))
		for k, v := range m.ApplicationProperties {
			a.ApplicationProperties[k] = v
		}
	}
	if m.PartitionKey != nil {
		a.Annotations[annotationPartitionKey] = *m.PartitionKey
	}
	if m.ScheduledEnqueueTime != nil {
		a.Annotations[broker.AnnotationScheduledEnqueueTime] = *m.ScheduledEnqueueTime
	}
	return a, nil
}

// encodedSize is the size of m on the wire, which is what the broker's MaxMessageSize limits. Encoding
// also refuses what the SDK could not send, such as an application property of a type AMQP has no
// encoding for.
func encodedSize(m *amqp.Message) (int, error) {
	b, err := m.MarshalBinary()
	if err != nil {
		return 0, fmt.Errorf("retrytest: message cannot be encoded as AMQP: %w", err)
	}
	return len(b), nil
}

// receivedMessage converts a message the broker handed out into what a receiver sees. deliveryCount is
// the DeliveryCount to report: on a fresh delivery the SDK reports the header's count plus one.
// lockToken and lockedUntil are the lock of a peek-lock delivery (zero for inspection copies). Like the
// SDK, it reports TimeToLive whenever the message has a header (zero when no TTL was set) and ExpiresAt
// as EnqueuedTime plus TimeToLive.
func receivedMessage(a *amqp.Message, deliveryCount uint32, lockToken [16]byte) *azservicebus.ReceivedMessage {
	// The optional scalar fields point into one allocation instead of one each: a receive is the hot
	// path of every unit test.
	v := new(struct {
		ttl                                time.Duration
		seq, enqSeq                        int64
		lockedUntil, enqueued, sched, exps time.Time
	})
	rm := &azservicebus.ReceivedMessage{
		RawAMQPMessage: rawMessage(a),
		State:          azservicebus.MessageStateActive,
		DeliveryCount:  deliveryCount,
		LockToken:      lockToken,
	}
	if len(a.Data) == 1 {
		rm.Body = a.Data[0]
	}
	if p := a.Properties; p != nil {
		if id, ok := p.MessageID.(string); ok {
			rm.MessageID = id
		}
		if id, ok := p.CorrelationID.(string); ok {
			rm.CorrelationID = &id
		}
		rm.SessionID = p.GroupID
		rm.ContentType = p.ContentType
		rm.Subject = p.Subject
		rm.To = p.To
		rm.ReplyTo = p.ReplyTo
		rm.ReplyToSessionID = p.ReplyToGroupID
	}
	if a.Header != nil {
		v.ttl = a.Header.TTL
		rm.TimeToLive = &v.ttl
	}
	if a.ApplicationProperties != nil {
		rm.ApplicationProperties = make(map[string]any, len(a.ApplicationProperties))
		for k, v := range a.ApplicationProperties {
			rm.ApplicationProperties[k] = v
		}
		if s, ok := a.ApplicationProperties[broker.PropertyDeadLetterReason].(string); ok {
			rm.DeadLetterReason = &s
		}
		if s, ok := a.ApplicationProperties[broker.PropertyDeadLetterErrorDescription].(string); ok {
			rm.DeadLetterErrorDescription = &s
		}
	}
	var ok bool
	if v.lockedUntil, ok = annotation[time.Time](a, broker.AnnotationLockedUntil); ok {
		rm.LockedUntil = &v.lockedUntil
	}
	if v.seq, ok = annotation[int64](a, broker.AnnotationSequenceNumber); ok {
		rm.SequenceNumber = &v.seq
	}
	if s, ok := annotation[string](a, annotationPartitionKey); ok {
		rm.PartitionKey = &s
	}
	if v.enqueued, ok = annotation[time.Time](a, broker.AnnotationEnqueuedTime); ok {
		rm.EnqueuedTime = &v.enqueued
	}
	if s, ok := annotation[string](a, broker.AnnotationDeadLetterSource); ok {
		rm.DeadLetterSource = &s
	}
	if v.sched, ok = annotation[time.Time](a, broker.AnnotationScheduledEnqueueTime); ok {
		rm.ScheduledEnqueueTime = &v.sched
	}
	if v.enqSeq, ok = annotation[int64](a, broker.AnnotationEnqueuedSequenceNumber); ok {
		rm.EnqueuedSequenceNumber = &v.enqSeq
	}
	// x-opt-message-state as the SDK reads it (message.go newReceivedMessage): 1 deferred, 2 scheduled.
	switch n, _ := annotation[int64](a, broker.AnnotationMessageState); n {
	case 1:
		rm.State = azservicebus.MessageStateDeferred
	case 2:
		rm.State = azservicebus.MessageStateScheduled
	}
	if rm.EnqueuedTime != nil && rm.TimeToLive != nil {
		v.exps = rm.EnqueuedTime.Add(*rm.TimeToLive)
		rm.ExpiresAt = &v.exps
	}
	return rm
}

// rawMessage is the RawAMQPMessage the SDK attaches to every received message, sharing a's maps and
// sections as the SDK does.
func rawMessage(a *amqp.Message) *azservicebus.AMQPAnnotatedMessage {
	raw := &azservicebus.AMQPAnnotatedMessage{
		ApplicationProperties: a.ApplicationProperties,
		Body:                  azservicebus.AMQPAnnotatedMessageBody{Data: a.Data, Sequence: a.Sequence, Value: a.Value},
		DeliveryAnnotations:   map[any]any(a.DeliveryAnnotations),
		DeliveryTag:           a.DeliveryTag,
		MessageAnnotations:    map[any]any(a.Annotations),
	}
	if a.Footer != nil {
		raw.Footer = map[any]any(a.Footer)
	}
	if h := a.Header; h != nil {
		raw.Header = &azservicebus.AMQPAnnotatedMessageHeader{
			DeliveryCount: h.DeliveryCount, Durable: h.Durable, FirstAcquirer: h.FirstAcquirer, Priority: h.Priority, TTL: h.TTL,
		}
	}
	if p := a.Properties; p != nil {
		raw.Properties = &azservicebus.AMQPAnnotatedMessageProperties{
			AbsoluteExpiryTime: p.AbsoluteExpiryTime, ContentEncoding: p.ContentEncoding, ContentType: p.ContentType,
			CorrelationID: p.CorrelationID, CreationTime: p.CreationTime, GroupID: p.GroupID, GroupSequence: p.GroupSequence,
			MessageID: p.MessageID, ReplyTo: p.ReplyTo, ReplyToGroupID: p.ReplyToGroupID, Subject: p.Subject, To: p.To,
			UserID: p.UserID,
		}
	}
	return raw
}

// annotation reads a message annotation of type T stored under key as a string or as an AMQP symbol.
func annotation[T any](a *amqp.Message, key string) (T, bool) {
	v, ok := a.Annotations[key]
	if !ok {
		v, ok = a.Annotations[amqp.Symbol(key)]
	}
	t, isT := v.(T)
	return t, ok && isT
}

// headerDeliveryCount is the header's delivery-count: the deliveries before this one on a fresh
// delivery, every delivery on an inspection copy.
func headerDeliveryCount(a *amqp.Message) uint32 {
	if a.Header == nil {
		return 0
	}
	return a.Header.DeliveryCount
}
