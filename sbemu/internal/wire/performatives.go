package wire

import "math"

// Role says which end of a link a peer is, in [Attach] and [Disposition]. It
// travels as a boolean.
type Role bool

const (
	// RoleSender is the sending end of a link (false on the wire).
	RoleSender Role = false
	// RoleReceiver is the receiving end of a link (true on the wire).
	RoleReceiver Role = true
)

// Sender settle modes for [Attach.SndSettleMode] (part 2 section 2.8.2).
const (
	// SndSettleModeUnsettled: the sender sends every delivery unsettled.
	SndSettleModeUnsettled uint8 = 0
	// SndSettleModeSettled: the sender sends every delivery settled.
	SndSettleModeSettled uint8 = 1
	// SndSettleModeMixed: the sender chooses per delivery; the default.
	SndSettleModeMixed uint8 = 2
)

// Receiver settle modes for [Attach.RcvSettleMode] (part 2 section 2.8.3).
const (
	// RcvSettleModeFirst: the receiver settles first; the default.
	RcvSettleModeFirst uint8 = 0
	// RcvSettleModeSecond: the receiver settles only after the sender settled,
	// which is how the Service Bus SDK receives in peek-lock mode.
	RcvSettleModeSecond uint8 = 1
)

// Open is the first performative of a connection (part 2 section 2.7.1); it
// negotiates frame size, channel count and idle timeout.
//
// Decoding fills absent fields with their defaults. Encoding sends every field
// as it is (zero included), except that a field equal to its default is left
// out, so set MaxFrameSize and ChannelMax deliberately.
type Open struct {
	// ContainerID names the peer's container; mandatory.
	ContainerID string
	// Hostname is the virtual host the client wants; "" is absent.
	Hostname string
	// MaxFrameSize is the largest frame the sender of this Open accepts;
	// math.MaxUint32 when absent.
	MaxFrameSize uint32
	// ChannelMax is the highest channel number the sender accepts; 65535 when
	// absent.
	ChannelMax uint16
	// IdleTimeout in milliseconds: the peer must send a frame (a heartbeat
	// will do) at least this often; 0 (absent) means no timeout.
	IdleTimeout uint32
	// OutgoingLocales are the locales the sender may use in error texts.
	OutgoingLocales []Symbol
	// IncomingLocales are the locales the sender wants to receive.
	IncomingLocales []Symbol
	// OfferedCapabilities are extensions the sender supports.
	OfferedCapabilities []Symbol
	// DesiredCapabilities are extensions the sender would use if offered.
	DesiredCapabilities []Symbol
	// Properties are connection properties; nil is absent.
	Properties *Map
}

func (Open) descriptor() uint64 { return descOpen }

func (o Open) fields() []any {
	return []any{
		// container-id is mandatory, so it is sent even when empty.
		o.ContainerID,
		optZero(o.Hostname),
		optDefault(o.MaxFrameSize, math.MaxUint32),
		optDefault(o.ChannelMax, math.MaxUint16),
		optZero(o.IdleTimeout),
		optSymbols(o.OutgoingLocales),
		optSymbols(o.IncomingLocales),
		optSymbols(o.OfferedCapabilities),
		optSymbols(o.DesiredCapabilities),
		optRef(o.Properties),
	}
}

func decodeOpen(r *fieldReader) *Open {
	// The defaults of part 2 section 2.7.1: an absent max-frame-size or
	// channel-max means the largest value of its type, not zero.
	o := &Open{MaxFrameSize: math.MaxUint32, ChannelMax: math.MaxUint16}
	readField(r, &o.ContainerID)
	readField(r, &o.Hostname)
	readField(r, &o.MaxFrameSize)
	readField(r, &o.ChannelMax)
	readField(r, &o.IdleTimeout)
	readSymbols(r, &o.OutgoingLocales)
	readSymbols(r, &o.IncomingLocales)
	readSymbols(r, &o.OfferedCapabilities)
	readSymbols(r, &o.DesiredCapabilities)
	readField(r, &o.Properties)
	return o
}

// Begin starts a session on a channel (part 2 section 2.7.2). A server answers
// a client's Begin with its own, whose RemoteChannel is the client's channel.
type Begin struct {
	// RemoteChannel is the channel of the Begin being answered; nil when this
	// Begin starts the session.
	RemoteChannel *uint16
	// NextOutgoingID is the transfer-id of the sender's next transfer.
	NextOutgoingID uint32
	// IncomingWindow is how many transfers the sender can accept.
	IncomingWindow uint32
	// OutgoingWindow is how many transfers the sender may send.
	OutgoingWindow uint32
	// HandleMax is the highest link handle the sender accepts;
	// math.MaxUint32 when absent. Zero is sent as 0 (a single link), so set it.
	HandleMax uint32
	// OfferedCapabilities are extensions the sender supports.
	OfferedCapabilities []Symbol
	// DesiredCapabilities are extensions the sender would use if offered.
	DesiredCapabilities []Symbol
	// Properties are session properties; nil is absent.
	Properties *Map
}

func (Begin) descriptor() uint64 { return descBegin }

func (b Begin) fields() []any {
	return []any{
		optPtr(b.RemoteChannel),
		// next-outgoing-id, incoming-window and outgoing-window are mandatory and
		// go out even when zero; a zero incoming-window stops the peer sending.
		b.NextOutgoingID,
		b.IncomingWindow,
		b.OutgoingWindow,
		optDefault(b.HandleMax, math.MaxUint32),
		optSymbols(b.OfferedCapabilities),
		optSymbols(b.DesiredCapabilities),
		optRef(b.Properties),
	}
}

func decodeBegin(r *fieldReader) *Begin {
	// handle-max defaults to the largest uint32 (part 2 section 2.7.2).
	b := &Begin{HandleMax: math.MaxUint32}
	readOptional(r, &b.RemoteChannel)
	readField(r, &b.NextOutgoingID)
	readField(r, &b.IncomingWindow)
	readField(r, &b.OutgoingWindow)
	readField(r, &b.HandleMax)
	readSymbols(r, &b.OfferedCapabilities)
	readSymbols(r, &b.DesiredCapabilities)
	readField(r, &b.Properties)
	return b
}

// Attach opens a link on a session (part 2 section 2.7.3). The server answers
// with an Attach of the opposite role that echoes the name, settle modes and
// terminus; the Service Bus SDK insists that the settle modes match exactly.
type Attach struct {
	// Name identifies the link within the connection.
	Name string
	// Handle is the sender's number for the link within the session.
	Handle uint32
	// Role is the role of the sender of this Attach.
	Role Role
	// SndSettleMode is one of the SndSettleMode constants; nil is absent
	// (mixed).
	SndSettleMode *uint8
	// RcvSettleMode is one of the RcvSettleMode constants; nil is absent
	// (first).
	RcvSettleMode *uint8
	// Source is where messages come from; nil is absent.
	Source *Source
	// Target is where messages go; nil is absent.
	Target *Target
	// Unsettled maps delivery tags to delivery states for link recovery.
	Unsettled *Map
	// IncompleteUnsettled says Unsettled was too large to send whole.
	IncompleteUnsettled bool
	// InitialDeliveryCount is the sender's delivery count; set it when the
	// Attach's Role is sender.
	InitialDeliveryCount *uint32
	// MaxMessageSize is the largest message the sender of this Attach accepts;
	// nil or 0 means no limit.
	MaxMessageSize *uint64
	// OfferedCapabilities are extensions the sender supports.
	OfferedCapabilities []Symbol
	// DesiredCapabilities are extensions the sender would use if offered.
	DesiredCapabilities []Symbol
	// Properties are link properties; nil is absent.
	Properties *Map
}

func (Attach) descriptor() uint64 { return descAttach }

func (a Attach) fields() []any {
	return []any{
		// name, handle and role are mandatory. The settle modes stay pointers so a
		// reply can echo exactly what the client sent, present or absent.
		a.Name,
		a.Handle,
		a.Role,
		optPtr(a.SndSettleMode),
		optPtr(a.RcvSettleMode),
		optRef(a.Source),
		optRef(a.Target),
		optRef(a.Unsettled),
		optZero(a.IncompleteUnsettled),
		optPtr(a.InitialDeliveryCount),
		optPtr(a.MaxMessageSize),
		optSymbols(a.OfferedCapabilities),
		optSymbols(a.DesiredCapabilities),
		optRef(a.Properties),
	}
}

func decodeAttach(r *fieldReader) *Attach {
	a := &Attach{}
	readField(r, &a.Name)
	readField(r, &a.Handle)
	readRole(r, &a.Role)
	readOptional(r, &a.SndSettleMode)
	readOptional(r, &a.RcvSettleMode)
	// DecodeValue already turned the terminus lists into *Source and *Target,
	// so they read like any other typed field.
	readField(r, &a.Source)
	readField(r, &a.Target)
	readField(r, &a.Unsettled)
	readField(r, &a.IncompleteUnsettled)
	readOptional(r, &a.InitialDeliveryCount)
	readOptional(r, &a.MaxMessageSize)
	readSymbols(r, &a.OfferedCapabilities)
	readSymbols(r, &a.DesiredCapabilities)
	readField(r, &a.Properties)
	return a
}

// Flow updates session windows and, when Handle is set, link credit (part 2
// section 2.7.4). The emulator must keep granting credit and window or the
// SDK's sends stall.
type Flow struct {
	// NextIncomingID is the next transfer-id the sender expects; nil until
	// the sender has seen the peer's Begin.
	NextIncomingID *uint32
	// IncomingWindow is how many more transfers the sender can accept.
	IncomingWindow uint32
	// NextOutgoingID is the transfer-id of the sender's next transfer.
	NextOutgoingID uint32
	// OutgoingWindow is how many more transfers the sender may send.
	OutgoingWindow uint32
	// Handle selects a link; nil makes this a session-only flow.
	Handle *uint32
	// DeliveryCount is the link's delivery count (link flow only).
	DeliveryCount *uint32
	// LinkCredit is how many more messages the receiver accepts.
	LinkCredit *uint32
	// Available is how many messages the sender has ready.
	Available *uint32
	// Drain asks the sender to use up all credit now.
	Drain bool
	// Echo asks the peer to answer with its own flow state.
	Echo bool
	// Properties are link-state properties; nil is absent.
	Properties *Map
}

func (Flow) descriptor() uint64 { return descFlow }

func (f Flow) fields() []any {
	return []any{
		optPtr(f.NextIncomingID),
		// incoming-window, next-outgoing-id and outgoing-window are mandatory; the
		// link fields are pointers because a session-only flow leaves them out.
		f.IncomingWindow,
		f.NextOutgoingID,
		f.OutgoingWindow,
		optPtr(f.Handle),
		optPtr(f.DeliveryCount),
		optPtr(f.LinkCredit),
		optPtr(f.Available),
		optZero(f.Drain),
		optZero(f.Echo),
		optRef(f.Properties),
	}
}

func decodeFlow(r *fieldReader) *Flow {
	f := &Flow{}
	readOptional(r, &f.NextIncomingID)
	readField(r, &f.IncomingWindow)
	readField(r, &f.NextOutgoingID)
	readField(r, &f.OutgoingWindow)
	readOptional(r, &f.Handle)
	readOptional(r, &f.DeliveryCount)
	readOptional(r, &f.LinkCredit)
	readOptional(r, &f.Available)
	readField(r, &f.Drain)
	readField(r, &f.Echo)
	readField(r, &f.Properties)
	return f
}

// Transfer carries (part of) a message on a link (part 2 section 2.7.5). The
// message bytes are not part of the performative: they follow it in the frame
// and live in Payload. A message split over several frames has More set on
// all but the last; the emulator reassembles the payloads.
type Transfer struct {
	// Handle is the link.
	Handle uint32
	// DeliveryID numbers the delivery within the session; required on the
	// first transfer of a delivery.
	DeliveryID *uint32
	// DeliveryTag identifies the delivery within the link; required on the
	// first transfer. nil is absent.
	DeliveryTag []byte
	// MessageFormat is 0 for standard AMQP messages; required on the first
	// transfer.
	MessageFormat *uint32
	// Settled says the sender already settled the delivery.
	Settled *bool
	// More says further transfers of this delivery follow.
	More bool
	// RcvSettleMode overrides the link's receiver settle mode.
	RcvSettleMode *uint8
	// State is the sender's view of the delivery state.
	State DeliveryState
	// Resume marks a resumed delivery.
	Resume bool
	// Aborted discards the delivery's earlier transfers.
	Aborted bool
	// Batchable lets the receiver delay its disposition.
	Batchable bool
	// Payload holds the frame bytes after the performative. [ReadFrame] fills
	// it and [AppendFrame] writes it; [AppendValue] ignores it.
	Payload []byte
}

func (Transfer) descriptor() uint64 { return descTransfer }

func (t Transfer) fields() []any {
	// A nil []byte inside an interface is not nil and would encode as an empty
	// binary; an untyped nil leaves an absent tag out, while an empty non-nil tag
	// is still sent.
	var tag any
	if t.DeliveryTag != nil {
		tag = t.DeliveryTag
	}
	return []any{
		t.Handle,
		optPtr(t.DeliveryID),
		tag,
		optPtr(t.MessageFormat),
		optPtr(t.Settled),
		optZero(t.More),
		optPtr(t.RcvSettleMode),
		optState(t.State),
		optZero(t.Resume),
		optZero(t.Aborted),
		optZero(t.Batchable),
	}
}

func decodeTransfer(r *fieldReader) *Transfer {
	t := &Transfer{}
	readField(r, &t.Handle)
	readOptional(r, &t.DeliveryID)
	readField(r, &t.DeliveryTag)
	readOptional(r, &t.MessageFormat)
	readOptional(r, &t.Settled)
	readField(r, &t.More)
	readOptional(r, &t.RcvSettleMode)
	// Unknown delivery states decode to *Described, which implements
	// DeliveryState, so only a non-described value fails here.
	readField(r, &t.State)
	readField(r, &t.Resume)
	readField(r, &t.Aborted)
	readField(r, &t.Batchable)
	return t
}

// Disposition settles or updates the state of a range of deliveries (part 2
// section 2.7.6): the server answers a send with a settled [Accepted], and the
// client settles received messages with one.
type Disposition struct {
	// Role is the role of the sender of this Disposition.
	Role Role
	// First is the first delivery-id of the range.
	First uint32
	// Last is the last delivery-id of the range; nil means First only.
	Last *uint32
	// Settled says the deliveries are now settled.
	Settled bool
	// State is the new delivery state; nil is absent.
	State DeliveryState
	// Batchable lets the peer delay its reaction.
	Batchable bool
}

func (Disposition) descriptor() uint64 { return descDisposition }

func (d Disposition) fields() []any {
	return []any{
		// role and first are mandatory (part 2 section 2.7.6).
		d.Role,
		d.First,
		optPtr(d.Last),
		optZero(d.Settled),
		optState(d.State),
		optZero(d.Batchable),
	}
}

func decodeDisposition(r *fieldReader) *Disposition {
	d := &Disposition{}
	readRole(r, &d.Role)
	readField(r, &d.First)
	readOptional(r, &d.Last)
	readField(r, &d.Settled)
	readField(r, &d.State)
	readField(r, &d.Batchable)
	return d
}

// Detach ends a link (part 2 section 2.7.7); with Closed false the link may be
// re-attached later.
type Detach struct {
	// Handle is the link.
	Handle uint32
	// Closed says the link is closed for good.
	Closed bool
	// Error says why, if the link ends because of an error.
	Error *Error
}

func (Detach) descriptor() uint64 { return descDetach }

func (d Detach) fields() []any {
	// handle is mandatory and closed defaults to false, so a plain detach (the
	// link may be re-attached) encodes as a one-element list.
	return []any{d.Handle, optZero(d.Closed), optRef(d.Error)}
}

func decodeDetach(r *fieldReader) *Detach {
	d := &Detach{}
	readField(r, &d.Handle)
	readField(r, &d.Closed)
	readField(r, &d.Error)
	return d
}

// End ends a session (part 2 section 2.7.8).
type End struct {
	// Error says why, if the session ends because of an error.
	Error *Error
}

func (End) descriptor() uint64 { return descEnd }

func (e End) fields() []any { return []any{optRef(e.Error)} }

func decodeEnd(r *fieldReader) *End {
	e := &End{}
	readField(r, &e.Error)
	return e
}

// Close ends a connection (part 2 section 2.7.9).
type Close struct {
	// Error says why, if the connection ends because of an error.
	Error *Error
}

func (Close) descriptor() uint64 { return descClose }

// A clean close (no error) encodes as a bare described list0.
func (c Close) fields() []any { return []any{optRef(c.Error)} }

func decodeClose(r *fieldReader) *Close {
	c := &Close{}
	readField(r, &c.Error)
	return c
}
