package broker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/Azure/go-amqp"
)

// A stored message is kept as its AMQP encoding (entry.data), the bytes a
// transfer carries and the journal writes, not as a decoded
// [amqp.Message]. For a 1 KiB message with a MessageId and three
// application properties the decoded form held about 700 bytes besides
// the body (the message struct, its properties section, the property map
// and its strings) in a dozen objects the collector has to mark; the
// encoding is one pointer-free slice about 120 bytes longer than the body
// (BenchmarkScaleBytesPerMessage). A restart keeps the bytes it read from
// the journal and only checks them (checkStored), instead of decoding a
// million messages. What the broker reads often, the session id, is kept
// beside the bytes in the entry; what it reads rarely (the time-to-live
// when a message activates) it reads from them (storedTTL); everything
// else decodes the message (entry.message), changes it and encodes it
// again (entry.rewrite).

// encodeEntry returns a new entry holding m, encoded.
func encodeEntry(m *amqp.Message, size int) (*entry, error) {
	data, err := m.MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("broker: encoding the message: %w", err)
	}
	return newEntry(data, sessionID(m), size), nil
}

// mustEncodeEntry is encodeEntry for a message moved inside the broker
// (fan-out, forwarding, dead-lettering): decoded from a stored encoding
// and changed only in ways that encode (rule actions set numbers, strings
// and booleans; dead-letter properties are checked by [Queue.DeadLetter]),
// so a failure is a broker bug.
func mustEncodeEntry(m *amqp.Message, size int) *entry {
	e, err := encodeEntry(m, size)
	if err != nil {
		panic(err)
	}
	return e
}

// message decodes e's message into a new value the caller owns. The bytes
// were encoded by the broker or checked by checkStored when they were read
// from disk, which accepts nothing go-amqp does not decode
// (FuzzCheckStored), so a failure here is a broker bug.
func (e *entry) message() *amqp.Message {
	m := new(amqp.Message)
	if err := m.UnmarshalBinary(e.data); err != nil {
		panic(fmt.Sprintf("broker: stored message %d does not decode: %v", e.seq, err))
	}
	return m
}

// rewrite decodes e's message, lets change modify it and stores the
// result, which the next journal record then carries in full. On an error
// (a value change added that has no AMQP encoding) e is left as it was.
// The session id must not change: the session indexes are keyed on it.
func (e *entry) rewrite(change func(m *amqp.Message)) error {
	m := e.message()
	change(m)
	data, err := m.MarshalBinary()
	if err != nil {
		return fmt.Errorf("broker: encoding the changed message: %w", err)
	}
	e.data, e.msgChanged = data, true
	return nil
}

// The section descriptors of an AMQP message (amqp-core-messaging 3.2).
const (
	sectionHeader              = 0x70
	sectionDeliveryAnnotations = 0x71
	sectionMessageAnnotations  = 0x72
	sectionProperties          = 0x73
	sectionApplicationProps    = 0x74
	sectionData                = 0x75
	sectionSequence            = 0x76
	sectionValue               = 0x77
	sectionFooter              = 0x78
)

// errBadEncoding is what checkStored reports for bytes that are not a
// message go-amqp decodes.
var errBadEncoding = errors.New("not an AMQP message")

// maxValueDepth bounds the nesting checkStored follows: the broker never
// stores deeper values, and the bound keeps crafted bytes from recursing
// without end.
const maxValueDepth = 32

// checkStored checks that data, read from disk, is a message the broker
// may store: every section framed and of the shape go-amqp decodes, every
// value of a type it decodes. It returns the message's session id. The
// sections up to the properties (header, annotations, properties; tens of
// bytes) are decoded by go-amqp itself, so the fields the broker reads
// are exactly what a delivery will carry; the rest (the application
// properties and the body) is walked without being decoded, which is what
// makes a restart with a million messages cheap: no allocation, no
// reflection.
func checkStored(data []byte) (session string, err error) {
	prefix := 0 // the end of the sections go-amqp decodes here
	for off := 0; off < len(data); {
		code, n, err := sectionCode(data[off:])
		if err != nil {
			return "", err
		}
		body := data[off+n:]
		size, err := valueSize(body, 0)
		if err != nil {
			return "", err
		}
		if err := checkSection(code, body[:size]); err != nil {
			return "", err
		}
		off += n + size
		if code <= sectionProperties {
			prefix = off
		}
	}
	if prefix == 0 {
		return "", nil
	}
	var m amqp.Message
	if err := m.UnmarshalBinary(data[:prefix]); err != nil {
		return "", err
	}
	return sessionID(&m), nil
}

// sectionCode reads a section's descriptor: 0x00, then the code as a
// smallulong or a ulong. It returns the code and the descriptor's length.
func sectionCode(b []byte) (code uint64, n int, err error) {
	switch {
	case len(b) >= 3 && b[0] == 0x00 && b[1] == 0x53:
		code, n = uint64(b[2]), 3
	case len(b) >= 10 && b[0] == 0x00 && b[1] == 0x80:
		code, n = binary.BigEndian.Uint64(b[2:]), 10
	default:
		return 0, 0, fmt.Errorf("%w: no section descriptor", errBadEncoding)
	}
	if code < sectionHeader || code > sectionFooter {
		return 0, 0, fmt.Errorf("%w: unknown section %#x", errBadEncoding, code)
	}
	return code, n, nil
}

// checkSection checks the shape of one section's value v: the sections
// decoded as maps must be maps (or null), the data section binary, a
// sequence a list; the application properties' keys must be strings.
// Header and properties are left to go-amqp (checkStored).
func checkSection(code uint64, v []byte) error {
	t := v[0]
	switch code {
	case sectionDeliveryAnnotations, sectionMessageAnnotations, sectionFooter:
		if t != 0x40 && t != 0xc1 && t != 0xd1 {
			return fmt.Errorf("%w: section %#x is not a map", errBadEncoding, code)
		}
	case sectionApplicationProps:
		if t == 0x40 {
			return nil
		}
		if t != 0xc1 && t != 0xd1 {
			return fmt.Errorf("%w: application properties are not a map", errBadEncoding)
		}
		return forEachElement(v, func(i int, e []byte) error {
			if i%2 == 0 && e[0] != 0xa1 && e[0] != 0xb1 {
				return fmt.Errorf("%w: an application property key is not a string", errBadEncoding)
			}
			return nil
		})
	case sectionData:
		if t != 0xa0 && t != 0xb0 {
			return fmt.Errorf("%w: a data section is not binary", errBadEncoding)
		}
	case sectionSequence:
		if t != 0x45 && t != 0xc0 && t != 0xd0 {
			return fmt.Errorf("%w: a sequence section is not a list", errBadEncoding)
		}
	}
	return nil
}

// fixedWidth is the width after the type code of each fixed-width AMQP
// type go-amqp decodes (amqp-core-types 1.6; the decimals and char, which
// it refuses, are left out), -1 for the rest.
var fixedWidth = func() [256]int {
	var w [256]int
	for i := range w {
		w[i] = -1
	}
	for _, c := range []byte{0x40, 0x41, 0x42, 0x43, 0x44, 0x45} {
		w[c] = 0
	}
	for _, c := range []byte{0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56} {
		w[c] = 1
	}
	w[0x60], w[0x61] = 2, 2
	w[0x70], w[0x71], w[0x72] = 4, 4, 4
	w[0x80], w[0x81], w[0x82], w[0x83] = 8, 8, 8, 8
	w[0x98] = 16
	return w
}()

// valueSize returns the encoded length of the AMQP value at the start of
// b, constructor included, after checking that it and every value inside
// it are well formed and of types go-amqp decodes in a message.
func valueSize(b []byte, depth int) (int, error) {
	if len(b) == 0 {
		return 0, fmt.Errorf("%w: truncated", errBadEncoding)
	}
	if b[0] == 0x00 {
		// A described value: go-amqp decodes only its own composites
		// (link frames, errors), which a message's values never are.
		return 0, fmt.Errorf("%w: a described value", errBadEncoding)
	}
	n, err := bodySize(b[0], b[1:], depth)
	return 1 + n, err
}

// bodySize returns the length of the value of type t whose encoding
// after the constructor starts b (in an array, every element is encoded
// so), checking it as valueSize does.
func bodySize(t byte, b []byte, depth int) (int, error) {
	if depth > maxValueDepth {
		return 0, fmt.Errorf("%w: values nested too deep", errBadEncoding)
	}
	if w := fixedWidth[t]; w >= 0 {
		if len(b) < w {
			return 0, fmt.Errorf("%w: truncated", errBadEncoding)
		}
		return w, nil
	}
	if !variableWidth(t) {
		return 0, fmt.Errorf("%w: unknown type %#x", errBadEncoding, t)
	}
	n, head, err := lengthPrefix(t, b)
	if err != nil {
		return 0, err
	}
	switch t {
	case 0xc0, 0xc1, 0xd0, 0xd1: // list, map
		err = forEachElementDepth(t, b[:head+n], depth, nil)
	case 0xe0, 0xf0: // array
		err = checkArray(t, b[:head+n], depth)
	}
	return head + n, err
}

// arrayElement lists the element types go-amqp decodes in an array.
var arrayElement = func() [256]bool {
	var ok [256]bool
	for _, c := range []byte{
		0x51, 0x50, 0x60, 0x61, 0x43, 0x52, 0x70, 0x54, 0x71, 0x44, 0x53, 0x80, 0x55, 0x81,
		0x72, 0x82, 0x56, 0x41, 0x42, 0xa1, 0xb1, 0xa3, 0xb3, 0xa0, 0xb0, 0x83, 0x98, 0xc1, 0xd1,
	} {
		ok[c] = true
	}
	return ok
}()

// checkArray checks the array of type t (0xe0 or 0xf0) whose encoding
// after the constructor is b: a count, one element constructor, then
// count elements without one, filling the size exactly.
func checkArray(t byte, b []byte, depth int) error {
	var count, head int
	if t == 0xe0 {
		if len(b) < 3 {
			return fmt.Errorf("%w: array without an element type", errBadEncoding)
		}
		count, head = int(b[1]), 2
	} else {
		if len(b) < 9 {
			return fmt.Errorf("%w: array without an element type", errBadEncoding)
		}
		count, head = int(binary.BigEndian.Uint32(b[4:])), 8
	}
	elem := b[head]
	if !arrayElement[elem] {
		return fmt.Errorf("%w: array of type %#x", errBadEncoding, elem)
	}
	if count > maxCompoundCount {
		return fmt.Errorf("%w: array of %d elements", errBadEncoding, count)
	}
	rest := b[head+1:]
	for range count {
		n, err := bodySize(elem, rest, depth+1)
		if err != nil {
			return err
		}
		rest = rest[n:]
	}
	if len(rest) != 0 {
		return fmt.Errorf("%w: array size and count disagree", errBadEncoding)
	}
	return nil
}

// maxCompoundCount is the most elements go-amqp decodes in one list, map
// or array (its own maxCompoundCount).
const maxCompoundCount = 65536

// variableWidth reports whether t is a variable-width type go-amqp
// decodes: binary, string, symbol, list, map, array.
func variableWidth(t byte) bool {
	switch t {
	case 0xa0, 0xa1, 0xa3, 0xb0, 0xb1, 0xb3, 0xc0, 0xc1, 0xd0, 0xd1, 0xe0, 0xf0:
		return true
	}
	return false
}

// lengthPrefix reads the size of a variable-width value of type t from b,
// its encoding after the constructor (the 1-byte forms 0xa*, 0xc*, 0xe*,
// the 4-byte forms 0xb*, 0xd*, 0xf*): the byte count after the size
// field, and the size field's length.
func lengthPrefix(t byte, b []byte) (n, head int, err error) {
	switch t >> 4 {
	case 0xa, 0xc, 0xe:
		if len(b) < 1 {
			return 0, 0, fmt.Errorf("%w: truncated", errBadEncoding)
		}
		n, head = int(b[0]), 1
	default:
		if len(b) < 4 {
			return 0, 0, fmt.Errorf("%w: truncated", errBadEncoding)
		}
		size := binary.BigEndian.Uint32(b)
		if uint64(size) > uint64(len(b)) {
			return 0, 0, fmt.Errorf("%w: truncated", errBadEncoding)
		}
		n, head = int(size), 4
	}
	if head+n > len(b) {
		return 0, 0, fmt.Errorf("%w: truncated", errBadEncoding)
	}
	return n, head, nil
}

// mapKey reports whether a map key of type t can be decoded: go-amqp
// decodes maps into Go maps, and panics on a key whose Go value is not
// comparable (binary, list, map, array).
func mapKey(t byte) bool {
	switch t {
	case 0xa1, 0xb1, 0xa3, 0xb3:
		return true
	}
	return fixedWidth[t] >= 0
}

// forEachElement calls fn with each element of the list or map v (its
// whole encoding, constructor included) and its index.
func forEachElement(v []byte, fn func(i int, e []byte) error) error {
	return forEachElementDepth(v[0], v[1:], 0, fn)
}

// forEachElementDepth checks each element of the list or map of type t
// at depth, whose encoding after the constructor is b, and that the count
// matches the size; fn, if not nil, sees each element.
func forEachElementDepth(t byte, b []byte, depth int, fn func(i int, e []byte) error) error {
	var count, head int
	switch t {
	case 0xc0, 0xc1:
		if len(b) < 2 {
			return fmt.Errorf("%w: compound without a count", errBadEncoding)
		}
		count, head = int(b[1]), 2
	default:
		if len(b) < 8 {
			return fmt.Errorf("%w: compound without a count", errBadEncoding)
		}
		count, head = int(binary.BigEndian.Uint32(b[4:])), 8
	}
	if count > maxCompoundCount {
		return fmt.Errorf("%w: compound of %d elements", errBadEncoding, count)
	}
	if (t == 0xc1 || t == 0xd1) && count%2 != 0 {
		return fmt.Errorf("%w: map with an odd count", errBadEncoding)
	}
	isMap := t == 0xc1 || t == 0xd1
	rest := b[head:]
	for i := range count {
		n, err := valueSize(rest, depth+1)
		if err != nil {
			return err
		}
		if isMap && i%2 == 0 && !mapKey(rest[0]) {
			return fmt.Errorf("%w: a map key of type %#x", errBadEncoding, rest[0])
		}
		if fn != nil {
			if err := fn(i, rest[:n]); err != nil {
				return err
			}
		}
		rest = rest[n:]
	}
	if len(rest) != 0 {
		return fmt.Errorf("%w: compound size and count disagree", errBadEncoding)
	}
	return nil
}

// storedTTL is the time-to-live in the header of the encoded message
// data, zero without one; the header, when present, is the first section
// the broker writes (go-amqp encodes it first).
func storedTTL(data []byte) time.Duration {
	code, n, err := sectionCode(data)
	if err != nil || code != sectionHeader {
		return 0
	}
	var ttl time.Duration
	list := data[n:]
	if len(list) == 0 || (list[0] != 0xc0 && list[0] != 0xd0) {
		return 0 // list0: no fields
	}
	size, err := valueSize(list, 0)
	if err != nil {
		return 0
	}
	list = list[:size]
	_ = forEachElement(list, func(i int, v []byte) error {
		if i != 2 {
			return nil
		}
		switch v[0] {
		case 0x52, 0x50, 0x53:
			ttl = time.Duration(v[1]) * time.Millisecond
		case 0x60:
			ttl = time.Duration(binary.BigEndian.Uint16(v[1:])) * time.Millisecond
		case 0x70:
			ttl = time.Duration(binary.BigEndian.Uint32(v[1:])) * time.Millisecond
		case 0x80:
			ttl = time.Duration(binary.BigEndian.Uint64(v[1:])) * time.Millisecond
		}
		return errStop
	})
	return ttl
}

// errStop ends a forEachElement early.
var errStop = errors.New("stop")
