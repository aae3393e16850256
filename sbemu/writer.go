package sbemu

import (
	"bufio"
	"context"
	"sync"
	"time"
)

// heartbeatFrame is an AMQP frame with no body: size 8, data offset 2, type
// AMQP, channel 0. Peers treat any frame as proof of life.
var heartbeatFrame = []byte{0x00, 0x00, 0x00, 0x08, 0x02, 0x00, 0x00, 0x00}

// writeTimeout bounds one flush to the socket. A client that stops reading
// for this long is considered dead and its connection is closed.
const writeTimeout = 30 * time.Second

// outbound is the queue of encoded frames waiting for the writer goroutine.
// push never blocks, so the reader can always keep draining the socket;
// that rules out the classic deadlock where both peers block writing to
// each other. Memory is bounded by Limits.MaxOutgoingBytesPerConnection
// instead: message transfers (the only frames whose volume the client
// controls, through credit and window) call waitRoom before each frame and
// wait while the queued bytes are over the limit. Control frames only
// answer what the client sends, so they are bounded by the reader's pace.
type outbound struct {
	// mu guards the fields below. frames are complete encoded frames in the
	// order they were pushed; the writer sends them in that order, so the
	// order in which callers push is the order on the wire. bytes counts
	// the frames queued or being written (released after the flush); peak
	// is its high-water mark, for tests.
	mu     sync.Mutex
	frames [][]byte
	bytes  int
	peak   int
	notify chan struct{} // capacity 1: "frames is not empty"
	// room is closed (and replaced) when bytes drops while waiters > 0.
	room    chan struct{}
	waiters int
}

// newOutbound returns an empty queue whose notify channel has room for
// one pending wakeup, so push never blocks.
func newOutbound() *outbound {
	return &outbound{notify: make(chan struct{}, 1), room: make(chan struct{})}
}

// push queues one encoded frame.
func (o *outbound) push(frame []byte) {
	o.mu.Lock()
	o.frames = append(o.frames, frame)
	o.bytes += len(frame)
	o.peak = max(o.peak, o.bytes)
	o.mu.Unlock()
	select {
	case o.notify <- struct{}{}:
	default:
	}
}

// take removes and returns every queued frame; their bytes stay counted
// until release. Taking everything at once lets the writer flush many small
// frames (dispositions, flows) with one system call.
func (o *outbound) take() [][]byte {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := o.frames
	o.frames = nil
	return out
}

// release uncounts frames the writer has written (or given up on) and
// wakes transfers waiting for room.
func (o *outbound) release(frames [][]byte) {
	n := 0
	for _, f := range frames {
		n += len(f)
	}
	if n == 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.bytes -= n
	if o.waiters > 0 {
		close(o.room)
		o.room = make(chan struct{})
	}
}

// waitRoom blocks while more than limit bytes are queued, until room is
// made, ctx is done or stop is closed.
func (o *outbound) waitRoom(ctx context.Context, stop <-chan struct{}, limit int) error {
	o.mu.Lock()
	for o.bytes > limit {
		// room is read under mu and release closes it before replacing it,
		// so a release after Unlock still wakes this waiter.
		room := o.room
		o.waiters++
		o.mu.Unlock()
		var err error
		select {
		case <-room:
		case <-ctx.Done():
			err = ctx.Err()
		case <-stop:
			err = errConnKilled
		}
		o.mu.Lock()
		o.waiters--
		if err != nil {
			o.mu.Unlock()
			return err
		}
	}
	o.mu.Unlock()
	return nil
}

// stats reports the queued bytes, their high-water mark and the number of
// transfers waiting for room, for tests.
func (o *outbound) stats() (queued, peak, waiting int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.bytes, o.peak, o.waiters
}

// writeLoop owns the write side of the socket: it batches queued frames into
// one flush, sends a heartbeat every heartbeat interval (half the client's
// idle timeout) and honours [Emulator.Hang]. It returns after flushing what
// is queued once the connection is done, so a final close frame still goes
// out on a graceful shutdown.
func (c *conn) writeLoop() {
	defer close(c.writerDone)
	// The buffer matches maxFrameSize so a full frame usually goes out in one
	// write.
	bw := bufio.NewWriterSize(c.nc, 64*1024)

	var tick <-chan time.Time
	if c.heartbeat > 0 {
		t := time.NewTicker(c.heartbeat)
		defer t.Stop()
		tick = t.C
	}

	// flush reports false after a write error; c.fail has then recorded it
	// and closed the socket, which ends the reader and so the connection.
	flush := func(frames [][]byte) bool {
		// Written or not (a failed write ends the connection), the frames
		// no longer occupy the queue.
		defer c.out.release(frames)
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
			// Heartbeats go through the queue, so they never interleave with a
			// frame being written and are delayed by a hang like everything else.
			c.out.push(heartbeatFrame)
		case <-c.done:
			flush(c.out.take())
			return
		}
		// During a hang frames accumulate in the queue and go out together when
		// it ends; a client whose idle timeout passes meanwhile drops the
		// connection, as it would during a real network partition.
		if !c.em.faults.WaitHang(c.done, c.kill) {
			flush(c.out.take())
			return
		}
		if !flush(c.out.take()) {
			return
		}
	}
}
