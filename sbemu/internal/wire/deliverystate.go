package wire

// DeliveryState is the state of a delivery carried by [Transfer.State] and
// [Disposition.State]: one of the outcomes [Accepted], [Rejected],
// [Released], [Modified], the non-terminal [Received], or a [Described] for a
// state this package does not know (for example a transactional state).
//
// Both values and pointers satisfy it; [DecodeValue] always returns pointers,
// so type-switch on *Accepted, *Rejected, and so on.
type DeliveryState interface {
	isDeliveryState()
}

// Accepted is the outcome for a message processed successfully (part 3
// section 3.4.2). Service Bus: the answer to a send, and Complete on receive.
// It has no fields, so on the wire it is a described list0: 00 53 24 45.
type Accepted struct{}

func (Accepted) isDeliveryState()   {}
func (Accepted) descriptor() uint64 { return descAccepted }
func (Accepted) fields() []any      { return nil }

// Rejected is the outcome for an invalid message (part 3 section 3.4.3).
// Service Bus: DeadLetter from the client (condition com.microsoft:dead-letter)
// and lock-lost from the server.
type Rejected struct {
	// Error says why; nil is absent.
	Error *Error
}

func (Rejected) isDeliveryState()   {}
func (Rejected) descriptor() uint64 { return descRejected }
func (r Rejected) fields() []any    { return []any{optRef(r.Error)} }

func decodeRejected(r *fieldReader) *Rejected {
	out := &Rejected{}
	readField(r, &out.Error)
	return out
}

// Released is the outcome for a message that was not processed and may be
// redelivered without counting an attempt (part 3 section 3.4.4). The SDK
// releases messages that arrive after a receive call has returned.
type Released struct{}

func (Released) isDeliveryState()   {}
func (Released) descriptor() uint64 { return descReleased }
func (Released) fields() []any      { return nil }

// Modified is the outcome for a message to be redelivered, possibly with new
// annotations (part 3 section 3.4.5). Service Bus: Abandon.
type Modified struct {
	// DeliveryFailed asks to count this as a failed delivery attempt.
	DeliveryFailed bool
	// UndeliverableHere asks not to redeliver to this link.
	UndeliverableHere bool
	// MessageAnnotations are merged into the message's annotations.
	MessageAnnotations *Map
}

func (Modified) isDeliveryState()   {}
func (Modified) descriptor() uint64 { return descModified }

// Both flags default to false and are trimmed when false, so the server's
// reply to an Abandon (no annotations) is a bare described list0.
func (m Modified) fields() []any {
	return []any{optZero(m.DeliveryFailed), optZero(m.UndeliverableHere), optRef(m.MessageAnnotations)}
}

func decodeModified(r *fieldReader) *Modified {
	m := &Modified{}
	readField(r, &m.DeliveryFailed)
	readField(r, &m.UndeliverableHere)
	readField(r, &m.MessageAnnotations)
	return m
}

// Received is the non-terminal state saying how much of a message arrived
// (part 3 section 3.4.1), used to resume partial deliveries.
// Both fields are mandatory on the wire, so neither is ever trimmed.
type Received struct {
	// SectionNumber is the first section not yet fully received.
	SectionNumber uint32
	// SectionOffset is the first byte of that section not yet received.
	SectionOffset uint64
}

func (Received) isDeliveryState()   {}
func (Received) descriptor() uint64 { return descReceived }
func (r Received) fields() []any    { return []any{r.SectionNumber, r.SectionOffset} }

func decodeReceived(r *fieldReader) *Received {
	out := &Received{}
	readField(r, &out.SectionNumber)
	readField(r, &out.SectionOffset)
	return out
}
