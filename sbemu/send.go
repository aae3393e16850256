package sbemu

import (
	"errors"
	"fmt"

	"github.com/Azure/go-amqp"

	"github.com/sbretry/retry/sbemu/broker"
	"github.com/sbretry/retry/sbemu/internal/wire"
)

// batchMessageFormat is the message-format of the SDK's SendMessageBatch:
// the transfer carries an envelope whose data sections are complete encoded
// messages.
const batchMessageFormat = 0x80013700

// acceptTransfer stores the message (or, for a batch, every message) of one
// client transfer and returns the outcome. A batch is all-or-nothing only
// as far as validation goes: every inner message is decoded and checked
// before any is stored.
func (l *link) acceptTransfer(payload []byte, format uint32) wire.DeliveryState {
	if format != batchMessageFormat {
		return l.acceptMessage(payload)
	}
	if cond, ok := l.s.c.em.faults.TakeSendRejection(); ok {
		return rejectedState(wire.Symbol(cond), "sbemu: send rejected by fault injection")
	}
	// The whole batch counts against the queue limit, as on Service Bus,
	// where a batch travels as one transfer of at most max-message-size.
	if limit := l.maxSize; len(payload) > limit {
		return rejectedState(condMessageSizeExceded, fmt.Sprintf("sbemu: batch of %d bytes exceeds the limit of %d bytes", len(payload), limit))
	}
	var envelope amqp.Message
	if err := envelope.UnmarshalBinary(payload); err != nil {
		return rejectedState(condDecodeError, "sbemu: undecodable batch envelope: "+err.Error())
	}
	msgs := make([]*amqp.Message, len(envelope.Data))
	for i, data := range envelope.Data {
		msgs[i] = new(amqp.Message)
		if err := msgs[i].UnmarshalBinary(data); err != nil {
			return rejectedState(condDecodeError, fmt.Sprintf("sbemu: undecodable message %d of batch: %v", i, err))
		}
	}
	// Each inner message is sized by its own encoding, so the broker's
	// per-message limit and duplicate detection apply message by message;
	// decoded for this send only, each is handed over uncopied.
	for i, m := range msgs {
		if _, _, err := l.queue.SendOwned(m, len(envelope.Data[i])); err != nil {
			return sendErrorState(err)
		}
	}
	return &wire.Accepted{}
}

// acceptMessage stores one message a client sent to a queue and returns
// the outcome for the client: accepted (also for a dropped duplicate, as
// Service Bus does) or rejected with the condition the SDK maps to the
// right error — amqp:link:message-size-exceeded for oversized messages.
func (l *link) acceptMessage(payload []byte) wire.DeliveryState {
	if cond, ok := l.s.c.em.faults.TakeSendRejection(); ok {
		return rejectedState(wire.Symbol(cond), "sbemu: send rejected by fault injection")
	}
	if limit := l.maxSize; len(payload) > limit {
		return rejectedState(condMessageSizeExceded, fmt.Sprintf("sbemu: message of %d bytes exceeds the limit of %d bytes", len(payload), limit))
	}
	var m amqp.Message
	if err := m.UnmarshalBinary(payload); err != nil {
		return rejectedState(condDecodeError, "sbemu: undecodable message: "+err.Error())
	}
	// A scheduled enqueue time in the annotations is honoured by the broker;
	// the sender never learns the sequence number (the SDK does not ask).
	// m was decoded for this send only: the broker keeps it, uncopied.
	seq, dup, err := l.queue.SendOwned(&m, len(payload))
	if err != nil {
		return sendErrorState(err)
	}
	if dup {
		l.log.Debug("sbemu: duplicate message dropped", "seq", seq)
	}
	return &wire.Accepted{}
}

// sendErrorState maps a broker send error to a rejected outcome.
func sendErrorState(err error) wire.DeliveryState {
	switch {
	case errors.Is(err, broker.ErrEntityDisabled):
		return rejectedState(condEntityDisabled, disabledDescription(err))
	case errors.Is(err, broker.ErrMessageTooLarge):
		return rejectedState(condMessageSizeExceded, "sbemu: "+err.Error())
	case errors.Is(err, broker.ErrPropertiesTooLarge):
		// Service Bus refuses these with a SerializationException; amqp:decode-error is the closest
		// standard condition, and the SDK surfaces it as a non-retriable error.
		return rejectedState(condDecodeError, "sbemu: "+err.Error())
	case errors.Is(err, broker.ErrNotSupported), errors.Is(err, broker.ErrSessionRequired), errors.Is(err, broker.ErrInvalidSessionID):
		return rejectedState(condNotAllowed, "sbemu: "+err.Error())
	default:
		return rejectedState(condInternalError, "sbemu: "+err.Error())
	}
}
