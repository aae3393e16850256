package sbemu

import (
	"fmt"

	"github.com/sbretry/retry/sbemu/internal/wire"
)

// SASL mechanisms the emulator offers. The Go SDK always picks ANONYMOUS
// (it authenticates later through "$cbs"); PLAIN is accepted for other AMQP
// clients, with any user name and password. MSSBCBS is Microsoft's
// mechanism for "no SASL credentials, claims follow on $cbs": the Python
// SDK's uamqp transport insists on it and closes the connection when it is
// not offered, which is how the emulator learned of it. All three carry no
// credentials the emulator checks.
const (
	saslAnonymous wire.Symbol = "ANONYMOUS"
	saslPlain     wire.Symbol = "PLAIN"
	saslMSSBCBS   wire.Symbol = "MSSBCBS"
)

// SASL outcome codes (AMQP 1.0 section 5.3.3.6).
const (
	saslOK   uint8 = 0
	saslAuth uint8 = 1
)

// negotiateSASL runs the SASL layer after the client's SASL protocol header:
// offer the mechanisms, read sasl-init, answer with an outcome. Credentials
// are not checked here; [Config.StrictAuth] is enforced by "$cbs".
func (c *conn) negotiateSASL() error {
	if err := wire.WriteProtocolHeader(c.nc, wire.ProtoSASL); err != nil {
		return fmt.Errorf("writing SASL header: %w", err)
	}
	mechs := &wire.SASLMechanisms{Mechanisms: []wire.Symbol{saslAnonymous, saslPlain, saslMSSBCBS}}
	if err := c.writeSASL(mechs); err != nil {
		return fmt.Errorf("writing SASL mechanisms: %w", err)
	}
	f, err := wire.ReadFrame(c.br, maxFrameSize)
	if err != nil {
		return fmt.Errorf("reading sasl-init: %w", err)
	}
	c.logFrame("rx", f)
	init, ok := f.Body.(*wire.SASLInit)
	if !ok || f.Type != wire.FrameSASL {
		return fmt.Errorf("expected sasl-init, got %T", f.Body)
	}
	// The PLAIN initial response (user and password) is deliberately never
	// parsed or logged.
	if init.Mechanism != saslAnonymous && init.Mechanism != saslPlain && init.Mechanism != saslMSSBCBS {
		_ = c.writeSASL(&wire.SASLOutcome{Code: saslAuth})
		return fmt.Errorf("unsupported SASL mechanism %q", init.Mechanism)
	}
	if err := c.writeSASL(&wire.SASLOutcome{Code: saslOK}); err != nil {
		return fmt.Errorf("writing SASL outcome: %w", err)
	}
	return nil
}

// writeSASL writes one SASL frame directly to the socket.
func (c *conn) writeSASL(body any) error {
	f := wire.Frame{Type: wire.FrameSASL, Body: body}
	c.logFrame("tx", f)
	return wire.WriteFrame(c.nc, f)
}
