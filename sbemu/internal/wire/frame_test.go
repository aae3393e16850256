package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProtocolHeader(t *testing.T) {
	for _, id := range []uint8{ProtoAMQP, ProtoSASL} {
		var buf bytes.Buffer
		require.NoError(t, WriteProtocolHeader(&buf, id))
		assert.Equal(t, []byte{'A', 'M', 'Q', 'P', id, 1, 0, 0}, buf.Bytes())
		got, err := ReadProtocolHeader(&buf)
		require.NoError(t, err)
		assert.Equal(t, id, got)
	}
}

func TestReadProtocolHeaderErrors(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
	}{
		{name: "short", in: []byte("AMQP")},
		{name: "http", in: []byte("GET / HT")},
		{name: "tls id", in: []byte{'A', 'M', 'Q', 'P', 2, 1, 0, 0}},
		{name: "old version", in: []byte{'A', 'M', 'Q', 'P', 0, 0, 9, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadProtocolHeader(bytes.NewReader(tc.in))
			assert.Error(t, err)
		})
	}
}

func TestFrameRoundTrip(t *testing.T) {
	tests := []struct {
		name  string
		frame Frame
	}{
		{name: "heartbeat", frame: Frame{Type: FrameAMQP, Channel: 0}},
		{name: "open", frame: Frame{Type: FrameAMQP, Body: &Open{ContainerID: "c", MaxFrameSize: 65536, ChannelMax: 7, IdleTimeout: 30000}}},
		{name: "begin on channel 5", frame: Frame{Type: FrameAMQP, Channel: 5, Body: &Begin{RemoteChannel: ptr(uint16(5)), IncomingWindow: 1, OutgoingWindow: 1, HandleMax: 9}}},
		{name: "transfer with payload", frame: Frame{Type: FrameAMQP, Channel: 1, Body: &Transfer{Handle: 1, DeliveryID: ptr(uint32(0)), DeliveryTag: []byte{1}, MessageFormat: ptr(uint32(0)), Payload: []byte{0x00, 0x53, 0x75, 0xa0, 0x01, 'x'}}}},
		{name: "transfer without payload", frame: Frame{Type: FrameAMQP, Body: &Transfer{Handle: 2, More: true}}},
		{name: "disposition", frame: Frame{Type: FrameAMQP, Channel: 65535, Body: &Disposition{Role: RoleReceiver, Settled: true, State: &Accepted{}}}},
		{name: "close", frame: Frame{Type: FrameAMQP, Body: &Close{Error: &Error{Condition: ConditionInternalError}}}},
		{name: "sasl mechanisms", frame: Frame{Type: FrameSASL, Body: &SASLMechanisms{Mechanisms: []Symbol{"ANONYMOUS"}}}},
		{name: "sasl init", frame: Frame{Type: FrameSASL, Body: &SASLInit{Mechanism: "ANONYMOUS", Hostname: "h"}}},
		{name: "sasl outcome", frame: Frame{Type: FrameSASL, Body: &SASLOutcome{Code: SASLCodeOK}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			require.NoError(t, WriteFrame(&buf, tc.frame))
			size := binary.BigEndian.Uint32(buf.Bytes())
			assert.Equal(t, uint32(buf.Len()), size, "size field covers the whole frame")

			got, err := ReadFrame(&buf, 1<<20)
			require.NoError(t, err)
			assert.Zero(t, buf.Len(), "frame fully consumed")
			assert.Truef(t, Equal(tc.frame, got), "got %#v, want %#v", got, tc.frame)
		})
	}
}

func TestAppendFrameHeartbeatBytes(t *testing.T) {
	got, err := AppendFrame(nil, Frame{Type: FrameAMQP, Channel: 0x0102})
	require.NoError(t, err)
	assert.Equal(t, []byte{0, 0, 0, 8, 2, 0, 1, 2}, got)
}

func TestAppendFrameErrors(t *testing.T) {
	tests := []struct {
		name  string
		frame Frame
	}{
		{name: "unknown type", frame: Frame{Type: 7}},
		{name: "sasl body in amqp frame", frame: Frame{Type: FrameAMQP, Body: &SASLInit{}}},
		{name: "amqp body in sasl frame", frame: Frame{Type: FrameSASL, Body: &Open{}}},
		{name: "not a performative", frame: Frame{Type: FrameAMQP, Body: &Accepted{}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := AppendFrame([]byte{9}, tc.frame)
			assert.Error(t, err)
			assert.Equal(t, []byte{9}, out, "dst is left as it was")
		})
	}
}

// frameBytes builds a raw frame with the given header fields around body.
func frameBytes(size uint32, doff, typ uint8, body []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, size)
	b = append(b, doff, typ, 0, 0)
	return append(b, body...)
}

func TestReadFrameMalformed(t *testing.T) {
	open := []byte{0x00, 0x53, 0x10, 0xc0, 0x03, 0x01, 0xa1, 0x00}
	tests := []struct {
		name string
		in   []byte
		max  uint32
	}{
		{name: "empty input", in: nil, max: 512},
		{name: "short header", in: []byte{0, 0, 0, 8, 2}, max: 512},
		{name: "size below header", in: frameBytes(7, 2, 0, nil), max: 512},
		{name: "size above max", in: frameBytes(600, 2, 0, make([]byte, 592)), max: 512},
		{name: "default max is 512", in: frameBytes(600, 2, 0, make([]byte, 592)), max: 0},
		{name: "doff below 2", in: frameBytes(8, 1, 0, nil), max: 512},
		{name: "doff beyond size", in: frameBytes(12, 4, 0, make([]byte, 4)), max: 512},
		{name: "unknown type", in: frameBytes(8, 2, 9, nil), max: 512},
		{name: "truncated body", in: frameBytes(20, 2, 0, open[:4]), max: 512},
		{name: "garbage body", in: frameBytes(9, 2, 0, []byte{0xff}), max: 512},
		{name: "not a performative", in: frameBytes(12, 2, 0, []byte{0x00, 0x53, 0x24, 0x45}), max: 512},
		{name: "sasl frame with open", in: frameBytes(uint32(8+len(open)), 2, 1, open), max: 512},
		{name: "bytes after open", in: frameBytes(uint32(9+len(open)), 2, 0, append(open[:len(open):len(open)], 0x40)), max: 512},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadFrame(bytes.NewReader(tc.in), tc.max)
			assert.Error(t, err)
		})
	}
}

func TestReadFrameExtendedHeaderSkipped(t *testing.T) {
	body := []byte{0xde, 0xad, 0xbe, 0xef, 0x00, 0x53, 0x18, 0x45} // 4 bytes of extended header, then close
	f, err := ReadFrame(bytes.NewReader(frameBytes(uint32(8+len(body)), 3, 0, body)), 512)
	require.NoError(t, err)
	assert.Equal(t, &Close{}, f.Body)
}

func TestReadFrameEOF(t *testing.T) {
	_, err := ReadFrame(bytes.NewReader(nil), 512)
	assert.True(t, errors.Is(err, io.EOF), "a clean EOF stays recognisable: %v", err)
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("boom") }

func TestWriteErrors(t *testing.T) {
	assert.Error(t, WriteFrame(failingWriter{}, Frame{}))
	assert.Error(t, WriteProtocolHeader(failingWriter{}, ProtoAMQP))
	assert.Error(t, WriteFrame(io.Discard, Frame{Type: 5}))
}
