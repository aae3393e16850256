package sbemu

import (
	"bufio"
	"sync"
	"time"
)

// heartbeatFrame is an AMQP frame with no body: size 8, data offset 2, type
// AMQP, channel 0. Peers treat any frame as proof of life.
var heartbeatFrame = []byte{0x00, 0x00, 0x00, 0x08, 0x02, 0x00, 0x00, 0x00}

// writeTimeout bounds one flush to the socket. A client that stops reading
// for this long is considered dead and its connection is closed.
const writeTimeout = 30 * time.Second

// outbound is the unbounded queue of encoded frames waiting for the writer
// goroutine. Producers (the reader, link goroutines, fault hooks) never
// block on it, so the reader can always keep draining the socket; that
// rules out the classic deadlock where both peers block writing to each
// other. Memory stays bounded in practice because every producer is itself
// bounded by link credit and session windows.
type outbound struct {
	mu     sync.Mutex
	frames [][]byte
	notify chan struct{} // capacity 1: "frames is not empty"
}

func newOutbound() *outbound {
	return &outbound{notify: make(chan struct{}, 1)}
}

// push queues one encoded frame.
func (o *outbound) push(frame []byte) {
	o.mu.Lock()
	o.frames = append(o.frames, frame)
	o.mu.Unlock()
	select {
	case o.notify <- struct{}{}:
	default:
	}
}

// take removes and returns every queued frame.
func (o *outbound) take() [][]byte {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := o.frames
	o.frames = nil
	return out
}

// writeLoop owns the write side of the socket: it batches queued frames into
// one flush, sends a heartbeat every heartbeat interval (half the client's
// idle timeout) and honours [Emulator.Hang]. It returns after flushing what
// is queued once the connection is done, so a final close frame still goes
// out on a graceful shutdown.
func (c *conn) writeLoop() {
	defer close(c.writerDone)
	bw := bufio.NewWriterSize(c.nc, 64*1024)

	var tick <-chan time.Time
	if c.heartbeat > 0 {
		t := time.NewTicker(c.heartbeat)
		defer t.Stop()
		tick = t.C
	}

	flush := func(frames [][]byte) bool {
		if len(frames) == 0 {
			return true
		}
		_ = c.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
		for _, f := range frames {
			if _, err := bw.Write(f); err != nil {
				c.fail(err)
				return false
			}
		}
		if err := bw.Flush(); err != nil {
			c.fail(err)
			return false
		}
		return true
	}

	for {
		select {
		case <-c.out.notify:
		case <-tick:
			c.out.push(heartbeatFrame)
		case <-c.done:
			flush(c.out.take())
			return
		}
		if !c.em.faults.waitHang(c.done, c.kill) {
			flush(c.out.take())
			return
		}
		if !flush(c.out.take()) {
			return
		}
	}
}
