package wire

// SASL outcome codes for [SASLOutcome.Code] (part 5 section 5.3.3.6).
const (
	// SASLCodeOK: authentication succeeded.
	SASLCodeOK uint8 = 0
	// SASLCodeAuth: bad credentials.
	SASLCodeAuth uint8 = 1
	// SASLCodeSys: a system error, cause unknown.
	SASLCodeSys uint8 = 2
	// SASLCodeSysPerm: a permanent system error.
	SASLCodeSysPerm uint8 = 3
	// SASLCodeSysTemp: a transient system error.
	SASLCodeSysTemp uint8 = 4
)

// SASLMechanisms is the server's first SASL frame, listing the mechanisms it
// supports (part 5 section 5.3.3.1). The emulator offers ANONYMOUS, which is
// what the SDK uses against an emulator.
type SASLMechanisms struct {
	// Mechanisms the server supports; mandatory, sent even when empty.
	Mechanisms []Symbol
}

func (SASLMechanisms) descriptor() uint64 { return descSASLMechanisms }

func (m SASLMechanisms) fields() []any {
	// sasl-server-mechanisms is mandatory (part 5 section 5.3.3.1), so a nil list
	// goes out as an empty array instead of being trimmed away.
	mechs := m.Mechanisms
	if mechs == nil {
		mechs = []Symbol{}
	}
	return []any{mechs}
}

func decodeSASLMechanisms(r *fieldReader) *SASLMechanisms {
	m := &SASLMechanisms{}
	readSymbols(r, &m.Mechanisms)
	return m
}

// SASLInit is the client's choice of mechanism (part 5 section 5.3.3.2).
type SASLInit struct {
	// Mechanism is the chosen mechanism, such as "ANONYMOUS".
	Mechanism Symbol
	// InitialResponse is the mechanism's first message; nil is absent.
	InitialResponse []byte
	// Hostname is the host the client connects to; "" is absent.
	Hostname string
}

func (SASLInit) descriptor() uint64 { return descSASLInit }

func (i SASLInit) fields() []any {
	// A nil []byte inside an interface would encode as an empty binary; the
	// untyped nil keeps an absent initial-response absent, since SASL (RFC 4422)
	// tells an empty initial response apart from none.
	var resp any
	if i.InitialResponse != nil {
		resp = i.InitialResponse
	}
	return []any{i.Mechanism, resp, optZero(i.Hostname)}
}

func decodeSASLInit(r *fieldReader) *SASLInit {
	i := &SASLInit{}
	readField(r, &i.Mechanism)
	readField(r, &i.InitialResponse)
	readField(r, &i.Hostname)
	return i
}

// SASLChallenge carries a server challenge for challenge/response mechanisms
// (part 5 section 5.3.3.3); ANONYMOUS never uses it, but decoding it keeps a
// stray one from failing a connection obscurely.
type SASLChallenge struct {
	// Challenge is the mechanism's data.
	Challenge []byte
}

func (SASLChallenge) descriptor() uint64 { return descSASLChallenge }

func (c SASLChallenge) fields() []any { return []any{bytesField(c.Challenge)} }

func decodeSASLChallenge(r *fieldReader) *SASLChallenge {
	c := &SASLChallenge{}
	readField(r, &c.Challenge)
	return c
}

// SASLResponse is the client's answer to a [SASLChallenge] (part 5 section
// 5.3.3.4).
type SASLResponse struct {
	// Response is the mechanism's data.
	Response []byte
}

func (SASLResponse) descriptor() uint64 { return descSASLResponse }

func (s SASLResponse) fields() []any { return []any{bytesField(s.Response)} }

func decodeSASLResponse(r *fieldReader) *SASLResponse {
	s := &SASLResponse{}
	readField(r, &s.Response)
	return s
}

// SASLOutcome ends the SASL exchange (part 5 section 5.3.3.6); after an OK
// outcome the client sends the AMQP protocol header.
type SASLOutcome struct {
	// Code is one of the SASLCode constants.
	Code uint8
	// AdditionalData is mechanism data for the client; nil is absent.
	AdditionalData []byte
}

func (SASLOutcome) descriptor() uint64 { return descSASLOutcome }

func (o SASLOutcome) fields() []any {
	// code is mandatory; additional-data follows the same nil rule as the
	// initial-response of [SASLInit].
	var data any
	if o.AdditionalData != nil {
		data = o.AdditionalData
	}
	return []any{o.Code, data}
}

func decodeSASLOutcome(r *fieldReader) *SASLOutcome {
	o := &SASLOutcome{}
	readField(r, &o.Code)
	readField(r, &o.AdditionalData)
	return o
}

// bytesField sends a mandatory binary field, as an empty binary when nil.
func bytesField(b []byte) any {
	if b == nil {
		return []byte{}
	}
	return b
}
