package sbemu

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/sbretry/retry/sbemu/internal/wire"
)

// FuzzConnFrames feeds arbitrary bytes after a valid AMQP protocol header
// to a live emulator. The emulator must neither panic (which would crash
// the fuzzing process) nor hang: once the client half-closes, the
// connection must be closed from the emulator's side.
func FuzzConnFrames(f *testing.F) {
	frame := func(fr wire.Frame) []byte {
		b, err := wire.AppendFrame(nil, fr)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	open := frame(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Open{ContainerID: "fuzz", MaxFrameSize: 4096}})
	begin := frame(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Begin{IncomingWindow: 10, OutgoingWindow: 10, HandleMax: 4}})
	attachSend := frame(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Attach{Name: "s", Handle: 0, Role: wire.RoleSender, Target: &wire.Target{Address: "queue"}}})
	attachRecv := frame(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Attach{Name: "r", Handle: 1, Role: wire.RoleReceiver, Source: &wire.Source{Address: "queue"}}})
	id := uint32(0)
	credit := uint32(5)
	transfer := frame(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Transfer{Handle: 0, DeliveryID: &id, DeliveryTag: []byte{1}, Payload: []byte{0x00, 0x53, 0x75, 0xa0, 0x01, 0x41}}})
	more := frame(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Transfer{Handle: 0, DeliveryID: &id, DeliveryTag: []byte{1}, More: true, Payload: []byte{0x00, 0x53}}})
	flow := frame(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Flow{NextIncomingID: &id, IncomingWindow: 10, OutgoingWindow: 10, Handle: &id, LinkCredit: &credit, Drain: true}})
	disp := frame(wire.Frame{Type: wire.FrameAMQP, Body: &wire.Disposition{Role: wire.RoleReceiver, First: 0, Settled: false, State: &wire.Accepted{}}})
	join := func(parts ...[]byte) []byte {
		var out []byte
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	f.Add([]byte{})
	f.Add(open)
	f.Add(join(open, begin))
	f.Add(join(open, begin, attachSend, transfer))
	f.Add(join(open, begin, attachSend, more, transfer))
	f.Add(join(open, begin, attachRecv, flow, disp))
	f.Add(join(open, begin, begin))
	f.Add(join(open, open))
	f.Add(join(open, []byte{0, 0, 0, 8, 2, 0, 0, 0}))
	f.Add(join(open, []byte{0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0}))

	em, err := Start(Config{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = em.Close() })

	f.Fuzz(func(t *testing.T, data []byte) {
		nc, err := net.Dial("tcp", em.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		if err := wire.WriteProtocolHeader(nc, wire.ProtoAMQP); err != nil {
			t.Fatal(err)
		}
		// The emulator may close early on a protocol error; a failed
		// write is fine then.
		_, _ = nc.Write(data)
		_ = nc.(*net.TCPConn).CloseWrite()
		_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		// EOF or a reset (the emulator closed with input unread) both
		// mean "closed"; only a timeout means it hung.
		if _, err := io.Copy(io.Discard, nc); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("the emulator did not close the connection: %v", err)
			}
		}
	})
}
