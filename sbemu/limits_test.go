package sbemu

import (
	"errors"
	"io"
	"net"
	"testing"

	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbretry/retry/sbemu/broker"
	"github.com/sbretry/retry/sbemu/internal/wire"
)

// dialAMQPConn opens a go-amqp connection to em, closed at cleanup.
func dialAMQPConn(t *testing.T, em *Emulator) *amqp.Conn {
	t.Helper()
	conn, err := amqp.Dial(ctxT(t), "amqp://"+em.Addr().String(), &amqp.ConnOptions{SASLType: amqp.SASLTypeAnonymous()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// requireLimitError checks that err carries amqp:resource-limit-exceeded
// from the emulator and names the limit.
func requireLimitError(t *testing.T, err error, name string) {
	t.Helper()
	require.Error(t, err)
	var remote *amqp.Error
	var connErr *amqp.ConnError
	var sessErr *amqp.SessionError
	var linkErr *amqp.LinkError
	switch {
	case errors.As(err, &connErr):
		remote = connErr.RemoteErr
	case errors.As(err, &sessErr):
		remote = sessErr.RemoteErr
	case errors.As(err, &linkErr):
		remote = linkErr.RemoteErr
	case errors.As(err, &remote):
	}
	require.NotNil(t, remote, "no remote AMQP error in %v", err)
	assert.Equal(t, amqp.ErrCond(condResourceLimit), remote.Condition)
	assert.Contains(t, remote.Description, name+" limit of")
}

func TestLimitDefaults(t *testing.T) {
	l := Limits{MaxPeekCount: -1}.withDefaults()
	assert.Equal(t, DefaultMaxConnections, l.MaxConnections)
	assert.Equal(t, DefaultMaxSessionsPerConnection, l.MaxSessionsPerConnection)
	assert.Equal(t, DefaultMaxLinksPerSession, l.MaxLinksPerSession)
	assert.Equal(t, DefaultMaxOutgoingBytesPerConnection, l.MaxOutgoingBytesPerConnection)
	assert.Equal(t, DefaultMaxPartialMessageBytesPerConnection, l.MaxPartialMessageBytesPerConnection)
	assert.Greater(t, l.MaxPeekCount, 1<<40, "negative means no limit")
}

func TestLimitConnections(t *testing.T) {
	em := startEmulator(t, Config{Limits: Limits{MaxConnections: 1}})
	first := dialAMQPConn(t, em)
	_, err := first.NewSession(ctxT(t), nil)
	require.NoError(t, err)

	// The second connection is told why it is closed: open, then close.
	second, err := amqp.Dial(ctxT(t), "amqp://"+em.Addr().String(), &amqp.ConnOptions{SASLType: amqp.SASLTypeAnonymous()})
	if err == nil {
		_, err = second.NewSession(ctxT(t), nil)
		_ = second.Close()
	}
	requireLimitError(t, err, "connection")

	// A closed connection frees its place.
	require.NoError(t, first.Close())
	waitFor(t, func() bool { em.mu.Lock(); defer em.mu.Unlock(); return em.admitted == 0 })
	_, err = dialAMQPConn(t, em).NewSession(ctxT(t), nil)
	require.NoError(t, err)
}

func TestLimitSessionsPerConnection(t *testing.T) {
	em := startEmulator(t, Config{Limits: Limits{MaxSessionsPerConnection: 2}})
	conn := dialAMQPConn(t, em)
	s1, err := conn.NewSession(ctxT(t), nil)
	require.NoError(t, err)
	_, err = conn.NewSession(ctxT(t), nil)
	require.NoError(t, err)

	// go-amqp returns from NewSession on the begin reply; the end with the
	// error follows at once and fails the session's next call.
	s3, err := conn.NewSession(ctxT(t), nil)
	if err == nil {
		_, err = s3.NewReceiver(ctxT(t), "queue", nil)
	}
	requireLimitError(t, err, "sessions per connection")

	// The connection survives, and an ended session frees its place.
	require.NoError(t, s1.Close(ctxT(t)))
	_, err = conn.NewSession(ctxT(t), nil)
	require.NoError(t, err)
}

func TestLimitLinksPerSession(t *testing.T) {
	em := startEmulator(t, Config{Limits: Limits{MaxLinksPerSession: 2}})
	session, err := dialAMQPConn(t, em).NewSession(ctxT(t), nil)
	require.NoError(t, err)
	r1, err := session.NewReceiver(ctxT(t), "queue", nil)
	require.NoError(t, err)
	_, err = session.NewSender(ctxT(t), "queue", nil)
	require.NoError(t, err)

	_, err = session.NewReceiver(ctxT(t), "queue", nil)
	requireLimitError(t, err, "links per session")

	require.NoError(t, r1.Close(ctxT(t)))
	_, err = session.NewReceiver(ctxT(t), "queue", nil)
	require.NoError(t, err, "a detached link frees its place")
}

// TestLimitOutgoingBytesPerConnection grants far more credit and window than
// the client reads: the emulator's queue of frames for it stays within the
// limit (plus the one frame being added), the deliveries wait instead, and
// every message still arrives once the client reads.
func TestLimitOutgoingBytesPerConnection(t *testing.T) {
	const limit = 128 << 10
	em := startEmulator(t, Config{Limits: Limits{MaxOutgoingBytesPerConnection: limit}})
	q, _ := em.Broker().Queue("queue")
	const n = 200
	for range n {
		_, _, err := q.Send(amqp.NewMessage(make([]byte, 60<<10)), 60<<10)
		require.NoError(t, err)
	}

	c := dialRaw(t, em)
	// A small receive buffer fills fast, so the emulator's writer blocks.
	require.NoError(t, c.nc.(*net.TCPConn).SetReadBuffer(16<<10))
	c.open(0)
	window := uint32(1 << 20)
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Begin{IncomingWindow: window, OutgoingWindow: 100, HandleMax: 10}})
	require.IsType(t, &wire.Begin{}, c.read().Body)
	first := uint8(0)
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Attach{Name: "r", Handle: 0, Role: wire.RoleReceiver, RcvSettleMode: &first, Source: &wire.Source{Address: "queue"}, Target: &wire.Target{}}})
	require.IsType(t, &wire.Attach{}, c.read().Body)
	zero, credit, handle := uint32(0), uint32(n), uint32(0)
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Flow{NextIncomingID: &zero, IncomingWindow: window, OutgoingWindow: 100, Handle: &handle, DeliveryCount: &zero, LinkCredit: &credit}})

	conn := em.snapshotConns()[0]
	waitFor(t, func() bool { _, _, waiting := conn.out.stats(); return waiting > 0 })
	_, peak, _ := conn.out.stats()
	assert.LessOrEqual(t, peak, limit+maxFrameSize, "queued bytes stay within the limit plus one frame")

	got := 0
	for got < n {
		if tr, ok := c.read().Body.(*wire.Transfer); ok && tr.DeliveryID != nil {
			got++
		}
	}
	_, peak, _ = conn.out.stats()
	assert.LessOrEqual(t, peak, limit+maxFrameSize)
}

func TestLimitPeekCount(t *testing.T) {
	em := startEmulator(t, Config{
		Queues: []broker.QueueConfig{{Name: "q", MaxMessageSize: 2 << 20}},
		Limits: Limits{MaxPeekCount: 5},
	})
	q, _ := em.Broker().Queue("q")
	for range 6 {
		_, _, err := q.Send(amqp.NewMessage(make([]byte, 1<<20)), 1<<20)
		require.NoError(t, err)
	}
	client := newClient(t, em)
	receiver := newReceiver(t, client, "q", nil)

	_, err := receiver.PeekMessages(ctxT(t), 6, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "peek count limit of 5")

	// Within the count, the reply is still cut at 4 MiB of messages: a peek
	// may return fewer than asked for.
	msgs, err := receiver.PeekMessages(ctxT(t), 5, nil)
	require.NoError(t, err)
	assert.Len(t, msgs, 3)
	more, err := receiver.PeekMessages(ctxT(t), 5, nil)
	require.NoError(t, err)
	assert.Len(t, more, 3, "the next peek continues after the last one returned")
	assert.Equal(t, *msgs[2].SequenceNumber+1, *more[0].SequenceNumber)
}

// TestLimitPartialMessageBytesPerConnection assembles multi-frame messages
// from a raw client: an aborted or finished message gives its bytes back,
// and holding more than the limit closes the connection with a clear error.
func TestLimitPartialMessageBytesPerConnection(t *testing.T) {
	const limit = 100 << 10
	em := startEmulator(t, Config{
		Queues: []broker.QueueConfig{{Name: "q", MaxMessageSize: 1 << 20}},
		Limits: Limits{MaxPartialMessageBytesPerConnection: limit},
	})
	c := dialRaw(t, em)
	c.open(0)
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Begin{IncomingWindow: 100, OutgoingWindow: 100, HandleMax: 10}})
	require.IsType(t, &wire.Begin{}, c.read().Body)
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Attach{Name: "s", Handle: 0, Role: wire.RoleSender, Target: &wire.Target{Address: "q"}}})
	require.IsType(t, &wire.Attach{}, c.read().Body)
	require.IsType(t, &wire.Flow{}, c.read().Body)

	chunk := make([]byte, 60<<10)
	format := uint32(0)
	deliveryID := uint32(0)
	start := func() {
		id := deliveryID
		deliveryID++
		c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Transfer{Handle: 0, DeliveryID: &id, DeliveryTag: []byte{byte(id)}, MessageFormat: &format, More: true, Payload: chunk}})
	}
	// 60 KiB held, then aborted: the budget is free again.
	start()
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Transfer{Handle: 0, Aborted: true}})
	// A complete two-frame message of 60 KiB + a small tail fits.
	payload, err := amqp.NewMessage(make([]byte, 70<<10)).MarshalBinary()
	require.NoError(t, err)
	id := deliveryID
	deliveryID++
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Transfer{Handle: 0, DeliveryID: &id, DeliveryTag: []byte{9}, MessageFormat: &format, More: true, Payload: payload[:60<<10]}})
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Transfer{Handle: 0, More: false, Payload: payload[60<<10:]}})
	disp, ok := c.read().Body.(*wire.Disposition)
	require.True(t, ok)
	assert.IsType(t, &wire.Accepted{}, disp.State)
	q, _ := em.Broker().Queue("q")
	assert.Equal(t, 1, q.Stats().Active)

	// Two frames of 60 KiB without an end exceed 100 KiB.
	start()
	c.write(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Transfer{Handle: 0, More: true, Payload: chunk}})
	var closeFrame *wire.Close
	for closeFrame == nil {
		f := c.read()
		closeFrame, _ = f.Body.(*wire.Close)
	}
	require.NotNil(t, closeFrame.Error)
	assert.Equal(t, condResourceLimit, closeFrame.Error.Condition)
	assert.Contains(t, closeFrame.Error.Description, "partial-message bytes per connection limit of")
	_, err = c.br.ReadByte()
	assert.ErrorIs(t, err, io.EOF, "the emulator closes the socket after the close frame")
	assert.Equal(t, 1, q.Stats().Active, "nothing of the partial message was stored")
}
