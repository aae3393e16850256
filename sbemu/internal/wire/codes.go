package wire

// Format codes of the AMQP 1.0 type system (part 1, section 1.6). The names
// follow the encoding names of the specification.
//
// The high nibble of a code names its subcategory (part 1 section 1.2): 0x4 to
// 0x9 are fixed widths of 0, 1, 2, 4, 8 and 16 bytes, 0xa and 0xb variable
// widths with a 1- or 4-byte length, 0xc and 0xd compound, 0xe and 0xf arrays.
// The decoder still lists codes rather than trusting the nibble, so an unknown
// code is rejected instead of skipped.
const (
	codeDescribed  byte = 0x00
	codeNull       byte = 0x40
	codeTrue       byte = 0x41
	codeFalse      byte = 0x42
	codeUint0      byte = 0x43
	codeUlong0     byte = 0x44
	codeList0      byte = 0x45
	codeUbyte      byte = 0x50
	codeByte       byte = 0x51
	codeSmallUint  byte = 0x52
	codeSmallUlong byte = 0x53
	codeSmallInt   byte = 0x54
	codeSmallLong  byte = 0x55
	codeBool       byte = 0x56
	codeUshort     byte = 0x60
	codeShort      byte = 0x61
	codeUint       byte = 0x70
	codeInt        byte = 0x71
	codeFloat      byte = 0x72
	codeChar       byte = 0x73
	codeDecimal32  byte = 0x74
	codeUlong      byte = 0x80
	codeLong       byte = 0x81
	codeDouble     byte = 0x82
	codeTimestamp  byte = 0x83
	codeDecimal64  byte = 0x84
	codeDecimal128 byte = 0x94
	codeUUID       byte = 0x98
	codeVbin8      byte = 0xa0
	codeStr8       byte = 0xa1
	codeSym8       byte = 0xa3
	codeVbin32     byte = 0xb0
	codeStr32      byte = 0xb1
	codeSym32      byte = 0xb3
	codeList8      byte = 0xc0
	codeMap8       byte = 0xc1
	codeList32     byte = 0xd0
	codeMap32      byte = 0xd1
	codeArray8     byte = 0xe0
	codeArray32    byte = 0xf0
)

// fixedWidth returns the number of data bytes that follow a fixed-width format
// code, and false for variable-width and compound codes (and unknown ones).
func fixedWidth(code byte) (int, bool) {
	switch code {
	case codeNull, codeTrue, codeFalse, codeUint0, codeUlong0, codeList0:
		return 0, true
	case codeUbyte, codeByte, codeSmallUint, codeSmallUlong, codeSmallInt, codeSmallLong, codeBool:
		return 1, true
	case codeUshort, codeShort:
		return 2, true
	case codeUint, codeInt, codeFloat, codeChar, codeDecimal32:
		return 4, true
	case codeUlong, codeLong, codeDouble, codeTimestamp, codeDecimal64:
		return 8, true
	case codeDecimal128, codeUUID:
		return 16, true
	}
	return 0, false
}

// Descriptor codes of the composite types this package decodes into Go
// structs (part 2 sections 2.7 and 2.8, part 3 section 3.4 and 3.5, part 5
// section 5.3). The full numeric descriptor is the domain 0x00000000 in the high
// half and the code in the low half, so these are the whole uint64 values.
const (
	descOpen           uint64 = 0x10
	descBegin          uint64 = 0x11
	descAttach         uint64 = 0x12
	descFlow           uint64 = 0x13
	descTransfer       uint64 = 0x14
	descDisposition    uint64 = 0x15
	descDetach         uint64 = 0x16
	descEnd            uint64 = 0x17
	descClose          uint64 = 0x18
	descError          uint64 = 0x1d
	descReceived       uint64 = 0x23
	descAccepted       uint64 = 0x24
	descRejected       uint64 = 0x25
	descReleased       uint64 = 0x26
	descModified       uint64 = 0x27
	descSource         uint64 = 0x28
	descTarget         uint64 = 0x29
	descSASLMechanisms uint64 = 0x40
	descSASLInit       uint64 = 0x41
	descSASLChallenge  uint64 = 0x42
	descSASLResponse   uint64 = 0x43
	descSASLOutcome    uint64 = 0x44
)

// descriptorNames maps each known numeric descriptor to its symbolic name, so
// that a peer that sends the symbolic form ("amqp:open:list") is understood.
var descriptorNames = map[uint64]Symbol{
	descOpen:           "amqp:open:list",
	descBegin:          "amqp:begin:list",
	descAttach:         "amqp:attach:list",
	descFlow:           "amqp:flow:list",
	descTransfer:       "amqp:transfer:list",
	descDisposition:    "amqp:disposition:list",
	descDetach:         "amqp:detach:list",
	descEnd:            "amqp:end:list",
	descClose:          "amqp:close:list",
	descError:          "amqp:error:list",
	descReceived:       "amqp:received:list",
	descAccepted:       "amqp:accepted:list",
	descRejected:       "amqp:rejected:list",
	descReleased:       "amqp:released:list",
	descModified:       "amqp:modified:list",
	descSource:         "amqp:source:list",
	descTarget:         "amqp:target:list",
	descSASLMechanisms: "amqp:sasl-mechanisms:list",
	descSASLInit:       "amqp:sasl-init:list",
	descSASLChallenge:  "amqp:sasl-challenge:list",
	descSASLResponse:   "amqp:sasl-response:list",
	descSASLOutcome:    "amqp:sasl-outcome:list",
}

// descriptorCodes is the inverse of descriptorNames.
// It is built once at package init so a symbolic descriptor costs one map
// lookup, and it cannot drift from descriptorNames.
var descriptorCodes = func() map[Symbol]uint64 {
	m := make(map[Symbol]uint64, len(descriptorNames))
	for code, name := range descriptorNames {
		m[name] = code
	}
	return m
}()
