package sbemu

import (
	"bufio"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
	"github.com/sbretry/retry/sbemu/internal/wire"
)

// rawClient is a hand-driven AMQP peer for protocol-level tests.
type rawClient struct {
	t  testing.TB
	nc net.Conn
	br *bufio.Reader
}

func dialRaw(t testing.TB, em *Emulator) *rawClient {
	t.Helper()
	nc, err := net.Dial("tcp", em.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = nc.Close() })
	return &rawClient{t: t, nc: nc, br: bufio.NewReader(nc)}
}

func (c *rawClient) write(f wire.Frame) {
	c.t.Helper()
	require.NoError(c.t, wire.WriteFrame(c.nc, f))
}

// read returns the next frame, failing the test after testTimeout.
func (c *rawClient) read() wire.Frame {
	c.t.Helper()
	require.NoError(c.t, c.nc.SetReadDeadline(time.Now().Add(testTimeout)))
	f, err := wire.ReadFrame(c.br, 1<<20)
	require.NoError(c.t, err)
	return f
}

// open runs the SASL ANONYMOUS and open exchange with the given idle
// timeout and returns the emulator's open.
func (c *rawClient) open(idle time.Duration) *wire.Open {
	c.t.Helper()
	require.NoError(c.t, wire.WriteProtocolHeader(c.nc, wire.ProtoSASL))
	proto, err := wire.ReadProtocolHeader(c.br)
	require.NoError(c.t, err)
	require.Equal(c.t, wire.ProtoSASL, proto)
	mechs, ok := c.read().Body.(*wire.SASLMechanisms)
	require.True(c.t, ok)
	assert.ElementsMatch(c.t, []wire.Symbol{"ANONYMOUS", "PLAIN", "MSSBCBS"}, mechs.Mechanisms)
	c.write(wire.Frame{Type: wire.FrameSASL, Body: &wire.SASLInit{Mechanism: "PLAIN", InitialResponse: []byte("\x00user\x00pass")}})
	outcome, ok := c.read().Body.(*wire.SASLOutcome)
	require.True(c.t, ok)
	require.Equal(c.t, uint8(0), outcome.Code)

	require.NoError(c.t, wire.WriteProtocolHeader(c.nc, wire.ProtoAMQP))
	proto, err = wire.ReadProtocolHeader(c.br)
	require.NoError(c.t, err)
	require.Equal(c.t, wire.ProtoAMQP, proto)
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Open{ContainerID: "raw", MaxFrameSize: 65536, IdleTimeout: uint32(idle / time.Millisecond)}})
	open, ok := c.read().Body.(*wire.Open)
	require.True(c.t, ok)
	return open
}

func TestConnSendsHeartbeatsAtHalfTheClientIdleTimeout(t *testing.T) {
	em := startEmulator(t, Config{})
	c := dialRaw(t, em)
	open := c.open(100 * time.Millisecond)
	assert.Equal(t, uint32(DefaultIdleTimeout/2/time.Millisecond), open.IdleTimeout)

	start := time.Now()
	for i := 0; i < 3; i++ {
		f := c.read()
		assert.Nil(t, f.Body, "only heartbeats flow on an idle connection")
	}
	assert.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond, "three heartbeats at 50ms intervals")
}

func TestConnClosesIdleClients(t *testing.T) {
	em := startEmulator(t, Config{IdleTimeout: 200 * time.Millisecond})
	c := dialRaw(t, em)
	open := c.open(0)
	assert.Equal(t, uint32(100), open.IdleTimeout, "half the real limit is advertised")

	start := time.Now()
	require.NoError(t, c.nc.SetReadDeadline(time.Now().Add(testTimeout)))
	_, err := wire.ReadFrame(c.br, 1<<20)
	require.Error(t, err)
	assert.True(t, errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF), "got %v", err)
	assert.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond)
}

func TestConnRefusesUnknownEntityAttach(t *testing.T) {
	em := startEmulator(t, Config{})
	c := dialRaw(t, em)
	c.open(0)
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Begin{NextOutgoingID: 0, IncomingWindow: 100, OutgoingWindow: 100, HandleMax: 10}})
	begin, ok := c.read().Body.(*wire.Begin)
	require.True(t, ok)
	require.NotNil(t, begin.RemoteChannel)

	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Attach{Name: "l", Handle: 0, Role: wire.RoleReceiver, Source: &wire.Source{Address: "missing"}, Target: &wire.Target{}}})
	attach, ok := c.read().Body.(*wire.Attach)
	require.True(t, ok)
	assert.Nil(t, attach.Source, "nil source: not attached")
	detach, ok := c.read().Body.(*wire.Detach)
	require.True(t, ok)
	require.NotNil(t, detach.Error)
	assert.Equal(t, condNotFound, detach.Error.Condition)
}

func TestConnAnswersCloseAndEchoedFlow(t *testing.T) {
	em := startEmulator(t, Config{})
	c := dialRaw(t, em)
	c.open(0)
	c.write(wire.Frame{Type: wire.FrameAMQP, Channel: 3, Body: &wire.Begin{IncomingWindow: 100, OutgoingWindow: 100, HandleMax: 10}})
	f := c.read()
	require.IsType(t, &wire.Begin{}, f.Body)
	assert.Equal(t, uint16(3), f.Channel)

	zero := uint32(0)
	c.write(wire.Frame{Type: wire.FrameAMQP, Channel: 3, Body: &wire.Flow{NextIncomingID: &zero, IncomingWindow: 100, OutgoingWindow: 100, Echo: true}})
	flow, ok := c.read().Body.(*wire.Flow)
	require.True(t, ok)
	assert.Equal(t, uint32(sessionWindow), flow.IncomingWindow)

	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Close{}})
	require.IsType(t, &wire.Close{}, c.read().Body)
	_, err := wire.ReadFrame(c.br, 1<<20)
	assert.Error(t, err, "the emulator closes the socket after close")
}

func TestConnRejectsNonAMQPHeader(t *testing.T) {
	em := startEmulator(t, Config{})
	c := dialRaw(t, em)
	_, err := c.nc.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	require.NoError(t, err)
	require.NoError(t, c.nc.SetReadDeadline(time.Now().Add(testTimeout)))
	_, err = io.ReadAll(c.br)
	require.NoError(t, err, "the emulator closes the connection")
}

func TestConnDrainSendsAvailableThenSpendsCredit(t *testing.T) {
	em := startEmulator(t, Config{})
	q, _ := em.Broker().Queue("queue")
	for _, body := range []string{"a", "b"} {
		_, _, err := q.Send(amqp.NewMessage([]byte(body)), 10)
		require.NoError(t, err)
	}
	c := dialRaw(t, em)
	c.open(0)
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Begin{IncomingWindow: 100, OutgoingWindow: 100, HandleMax: 10}})
	require.IsType(t, &wire.Begin{}, c.read().Body)
	second := uint8(1)
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Attach{Name: "r", Handle: 7, Role: wire.RoleReceiver, RcvSettleMode: &second, Source: &wire.Source{Address: "queue"}, Target: &wire.Target{}}})
	attach, ok := c.read().Body.(*wire.Attach)
	require.True(t, ok)
	require.NotNil(t, attach.RcvSettleMode)
	assert.Equal(t, second, *attach.RcvSettleMode, "settle mode echoed")
	require.NotNil(t, attach.InitialDeliveryCount)

	zero, credit, handle := uint32(0), uint32(5), uint32(7)
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Flow{NextIncomingID: &zero, IncomingWindow: 100, OutgoingWindow: 100, Handle: &handle, DeliveryCount: &zero, LinkCredit: &credit, Drain: true}})

	var bodies []string
	for {
		f := c.read()
		if f.Body == nil {
			continue // heartbeat
		}
		if tr, ok := f.Body.(*wire.Transfer); ok {
			require.NotNil(t, tr.DeliveryID)
			require.NotNil(t, tr.MessageFormat)
			assert.Len(t, tr.DeliveryTag, 16)
			var m amqp.Message
			require.NoError(t, m.UnmarshalBinary(tr.Payload))
			bodies = append(bodies, string(m.GetData()))
			continue
		}
		flow, ok := f.Body.(*wire.Flow)
		require.True(t, ok, "got %T", f.Body)
		assert.True(t, flow.Drain)
		require.NotNil(t, flow.DeliveryCount)
		require.NotNil(t, flow.LinkCredit)
		assert.Equal(t, uint32(5), *flow.DeliveryCount, "unused credit is spent by advancing the delivery count")
		assert.Zero(t, *flow.LinkCredit)
		break
	}
	assert.Equal(t, []string{"a", "b"}, bodies, "available messages go out before the drain reply")
}

func TestConnEndsSessionOnHandleInUse(t *testing.T) {
	em := startEmulator(t, Config{})
	c := dialRaw(t, em)
	c.open(0)
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Begin{IncomingWindow: 100, OutgoingWindow: 100, HandleMax: 10}})
	require.IsType(t, &wire.Begin{}, c.read().Body)
	attach := &wire.Attach{Name: "s", Handle: 1, Role: wire.RoleSender, Target: &wire.Target{Address: "queue"}}
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: attach})
	require.IsType(t, &wire.Attach{}, c.read().Body)
	require.IsType(t, &wire.Flow{}, c.read().Body)

	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Attach{Name: "other", Handle: 1, Role: wire.RoleSender, Target: &wire.Target{Address: "queue"}}})
	end, ok := c.read().Body.(*wire.End)
	require.True(t, ok)
	require.NotNil(t, end.Error)
	assert.Equal(t, condHandleInUse, end.Error.Condition)

	// Frames still in flight on the ended session are ignored, and after the
	// client's end the channel can be reused.
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Detach{Handle: 1, Closed: true}})
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.End{}})
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Begin{IncomingWindow: 100, OutgoingWindow: 100, HandleMax: 10}})
	require.IsType(t, &wire.Begin{}, c.read().Body)
}

func TestConnRejectsOversizedTransfer(t *testing.T) {
	em := startEmulator(t, Config{Queues: []broker.QueueConfig{{Name: "q", MaxMessageSize: 1024}}})
	c := dialRaw(t, em)
	c.open(0)
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Begin{IncomingWindow: 100, OutgoingWindow: 100, HandleMax: 10}})
	require.IsType(t, &wire.Begin{}, c.read().Body)
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Attach{Name: "s", Handle: 0, Role: wire.RoleSender, Target: &wire.Target{Address: "q"}}})
	attach, ok := c.read().Body.(*wire.Attach)
	require.True(t, ok)
	require.NotNil(t, attach.MaxMessageSize)
	assert.Equal(t, uint64(1024), *attach.MaxMessageSize, "the queue limit is advertised")
	require.IsType(t, &wire.Flow{}, c.read().Body)

	// A client ignoring the advertised limit is rejected by the emulator.
	payload, err := amqp.NewMessage(make([]byte, 2048)).MarshalBinary()
	require.NoError(t, err)
	id, format := uint32(0), uint32(0)
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Transfer{Handle: 0, DeliveryID: &id, DeliveryTag: []byte{1}, MessageFormat: &format, Payload: payload}})
	disp, ok := c.read().Body.(*wire.Disposition)
	require.True(t, ok)
	assert.True(t, disp.Settled)
	rej, ok := disp.State.(*wire.Rejected)
	require.True(t, ok, "got %T", disp.State)
	require.NotNil(t, rej.Error)
	assert.Equal(t, condMessageSizeExceded, rej.Error.Condition)
	q, _ := em.Broker().Queue("q")
	assert.Zero(t, q.Stats().Active)
}

// TestConnAcceptsMSSBCBS checks the SASL mechanism the Python SDK's uamqp
// transport uses: no credentials, claims follow on $cbs.
func TestConnAcceptsMSSBCBS(t *testing.T) {
	em := startEmulator(t, Config{})
	c := dialRaw(t, em)
	require.NoError(t, wire.WriteProtocolHeader(c.nc, wire.ProtoSASL))
	proto, err := wire.ReadProtocolHeader(c.br)
	require.NoError(t, err)
	require.Equal(t, wire.ProtoSASL, proto)
	mechs, ok := c.read().Body.(*wire.SASLMechanisms)
	require.True(t, ok)
	assert.Contains(t, mechs.Mechanisms, wire.Symbol("MSSBCBS"))
	c.write(wire.Frame{Type: wire.FrameSASL, Body: &wire.SASLInit{Mechanism: "MSSBCBS"}})
	outcome, ok := c.read().Body.(*wire.SASLOutcome)
	require.True(t, ok)
	assert.Equal(t, uint8(0), outcome.Code)
}
