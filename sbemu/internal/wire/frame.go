package wire

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// Protocol ids of the 8-byte protocol header "AMQP" id 1 0 0 (part 2 section
// 2.2 and part 5 section 5.3.1).
const (
	// ProtoAMQP announces plain AMQP frames.
	ProtoAMQP uint8 = 0
	// ProtoSASL announces a SASL exchange before AMQP.
	ProtoSASL uint8 = 3
)

// protocolHeaderLen is the size of the protocol header.
const protocolHeaderLen = 8

// ReadProtocolHeader reads an 8-byte protocol header and returns its protocol
// id. It fails on anything but "AMQP" followed by 0 or 3 and version 1.0.0,
// which is the point at which a server must give up on a peer that does not
// speak AMQP 1.0 (it should then send its own header and close).
func ReadProtocolHeader(r io.Reader) (protoID uint8, err error) {
	var h [protocolHeaderLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, fmt.Errorf("wire: reading protocol header: %w", err)
	}
	// Bytes 5..7 are major, minor and revision; only 1.0.0 exists for AMQP
	// 1.0, and AMQP 0-9-1 clients send a different layout that fails here.
	if !bytes.Equal(h[:4], []byte("AMQP")) || h[5] != 1 || h[6] != 0 || h[7] != 0 {
		return 0, fmt.Errorf("wire: unsupported protocol header % x", h[:])
	}
	if h[4] != ProtoAMQP && h[4] != ProtoSASL {
		return 0, fmt.Errorf("wire: unsupported protocol id %d", h[4])
	}
	return h[4], nil
}

// WriteProtocolHeader writes the protocol header for protoID in one Write.
func WriteProtocolHeader(w io.Writer, protoID uint8) error {
	if _, err := w.Write([]byte{'A', 'M', 'Q', 'P', protoID, 1, 0, 0}); err != nil {
		return fmt.Errorf("wire: writing protocol header: %w", err)
	}
	return nil
}

// Frame types (part 2 section 2.3).
const (
	// FrameAMQP frames carry performatives on a channel.
	FrameAMQP uint8 = 0
	// FrameSASL frames carry the SASL exchange; their channel is ignored.
	FrameSASL uint8 = 1
)

// frameHeaderLen is the fixed frame header: size, doff, type, channel.
const frameHeaderLen = 8

// minMaxFrameSize is the frame size every peer must accept
// (MIN-MAX-FRAME-SIZE); ReadFrame uses it when given no limit.
const minMaxFrameSize = 512

// Frame is one AMQP or SASL frame.
type Frame struct {
	// Type is [FrameAMQP] or [FrameSASL].
	Type uint8
	// Channel is the session channel of an AMQP frame; 0 for SASL frames.
	Channel uint16
	// Body is the frame's performative: *[Open], *[Begin], *[Attach],
	// *[Flow], *[Transfer] (message bytes in its Payload), *[Disposition],
	// *[Detach], *[End] or *[Close] for AMQP frames; *[SASLMechanisms],
	// *[SASLInit], *[SASLChallenge], *[SASLResponse] or *[SASLOutcome] for SASL
	// frames; nil for an empty frame, which AMQP uses as a heartbeat.
	// [AppendFrame] also accepts the same types by value.
	Body any
}

// ReadFrame reads one frame. It rejects a size below 8 or above maxFrameSize
// (the limit this side announced in its Open; 0 means the 512-byte minimum
// every peer must accept, which applies before Open), a data offset below 2 or
// beyond the frame, an unknown frame type, a body that is not a performative
// of the frame's type, and bytes after any performative but a transfer. It
// allocates at most the frame's size.
func ReadFrame(r io.Reader, maxFrameSize uint32) (Frame, error) {
	if maxFrameSize == 0 {
		maxFrameSize = minMaxFrameSize
	}
	var h [frameHeaderLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return Frame{}, fmt.Errorf("wire: reading frame header: %w", err)
	}
	// Header layout (section 2.3.1): 4-byte size including the header,
	// 1-byte data offset in 4-byte words, 1-byte type, 2-byte channel.
	size := binary.BigEndian.Uint32(h[0:4])
	doff := uint32(h[4]) * 4
	f := Frame{Type: h[5], Channel: binary.BigEndian.Uint16(h[6:8])}
	switch {
	case size < frameHeaderLen:
		return Frame{}, fmt.Errorf("wire: frame size %d is below the %d-byte header", size, frameHeaderLen)
	case size > maxFrameSize:
		return Frame{}, fmt.Errorf("wire: frame size %d exceeds the maximum %d", size, maxFrameSize)
	case doff < frameHeaderLen:
		return Frame{}, fmt.Errorf("wire: frame data offset %d is below 2", h[4])
	case doff > size:
		return Frame{}, fmt.Errorf("wire: frame data offset %d is beyond the frame size %d", doff, size)
	case f.Type != FrameAMQP && f.Type != FrameSASL:
		return Frame{}, fmt.Errorf("wire: unknown frame type %d", f.Type)
	}
	// The size was checked against maxFrameSize above, so a hostile header
	// cannot make this allocation large.
	rest := make([]byte, size-frameHeaderLen)
	if _, err := io.ReadFull(r, rest); err != nil {
		return Frame{}, fmt.Errorf("wire: reading frame body: %w", err)
	}
	body := rest[doff-frameHeaderLen:] // skip the extended header, unused by AMQP 1.0
	// An empty body is a heartbeat (section 2.4.5) and carries no
	// performative at all.
	if len(body) == 0 {
		return f, nil
	}
	v, payload, err := DecodeValue(body)
	if err != nil {
		return Frame{}, err
	}
	if !isFrameBody(f.Type, v) {
		return Frame{}, fmt.Errorf("wire: %T is not a performative of frame type %d", v, f.Type)
	}
	// Only a transfer is followed by payload bytes: the message section
	// bytes, which stay undecoded here.
	if t, ok := v.(*Transfer); ok {
		t.Payload = payload
	} else if len(payload) > 0 {
		return Frame{}, fmt.Errorf("wire: %d unexpected bytes after %T", len(payload), v)
	}
	f.Body = v
	return f, nil
}

// isFrameBody reports whether v may be the body of a frame of type typ.
func isFrameBody(typ uint8, v any) bool {
	switch v.(type) {
	case *Open, *Begin, *Attach, *Flow, *Transfer, *Disposition, *Detach, *End, *Close,
		Open, Begin, Attach, Flow, Transfer, Disposition, Detach, End, Close:
		return typ == FrameAMQP
	case *SASLMechanisms, *SASLInit, *SASLChallenge, *SASLResponse, *SASLOutcome,
		SASLMechanisms, SASLInit, SASLChallenge, SASLResponse, SASLOutcome:
		return typ == FrameSASL
	}
	return false
}

// AppendFrame appends the encoding of f to dst: the header, the performative
// and, for a transfer, its Payload. It fails when the body does not belong in
// a frame of f's type or the frame would exceed 4 GiB; keeping within the
// peer's max-frame-size is the caller's job.
func AppendFrame(dst []byte, f Frame) ([]byte, error) {
	if f.Type != FrameAMQP && f.Type != FrameSASL {
		return dst, fmt.Errorf("wire: unknown frame type %d", f.Type)
	}
	start := len(dst)
	// The size is a placeholder, patched once the body length is known; the
	// data offset 2 (words) means no extended header.
	dst = append(dst, 0, 0, 0, 0, frameHeaderLen/4, f.Type, 0, 0)
	binary.BigEndian.PutUint16(dst[start+6:], f.Channel)
	// A nil body, also a typed nil pointer, produces an empty heartbeat frame.
	if f.Body != nil && !isNilPointer(f.Body) {
		if !isFrameBody(f.Type, f.Body) {
			return dst[:start], fmt.Errorf("wire: %T is not a performative of frame type %d", f.Body, f.Type)
		}
		var err error
		if dst, err = AppendValue(dst, f.Body); err != nil {
			return dst[:start], err
		}
		switch t := f.Body.(type) {
		case *Transfer:
			dst = append(dst, t.Payload...)
		case Transfer:
			dst = append(dst, t.Payload...)
		}
	}
	size := len(dst) - start
	if uint64(size) > math.MaxUint32 {
		return dst[:start], fmt.Errorf("wire: frame of %d bytes is too large", size)
	}
	binary.BigEndian.PutUint32(dst[start:], uint32(size))
	return dst, nil
}

// WriteFrame encodes f and writes it with a single Write, so frames from
// concurrent writers never interleave as long as each Write on w is atomic (a
// net.Conn's is). Callers still serialise writes per connection.
func WriteFrame(w io.Writer, f Frame) error {
	b, err := AppendFrame(nil, f)
	if err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("wire: writing frame: %w", err)
	}
	return nil
}
