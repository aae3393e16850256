package retry

import (
	"sync"
	"sync/atomic"
)

// workers run the received messages (jobs of type J: the queue consumer's job), one goroutine per message in flight. A worker that has finished
// one waits for the next instead of exiting, so that a busy consumer neither starts a goroutine per
// message nor grows a fresh stack for each: the SDK's settle path is deep, and a new goroutine's stack
// is grown (copied) several times on the way down. It stays for its measured gain: against a goroutine
// per message, BenchmarkPaired measured 7.5 % less CPU per message on the success path and 5.6 % less
// with 20 % failures, and 6.8 % more throughput with failures (BENCHMARKS.md, "Primitives kept and
// removed").
//
// start gives a message to a worker that waits, or starts a new one when none does; at most
// maxIdle workers wait at once (a worker that finishes when that many already wait exits), so the
// goroutines stay within the messages in flight plus that constant. Workers exit once close is called.
type workers[J any] struct {
	deliver func(J)
	work    chan J // unbuffered: a send goes through only to a worker waiting on it; closed at the end
	maxIdle int32
	idle    atomic.Int32
	wg      sync.WaitGroup
}

// start runs j on a waiting worker, or on a new one.
func (w *workers[J]) start(j J) {
	select {
	case w.work <- j:
	default:
		w.wg.Add(1)
		go w.run(j)
	}
}

// run delivers j and then every message handed to it, until close or enough others wait.
func (w *workers[J]) run(j J) {
	defer w.wg.Done()
	for {
		w.deliver(j)
		if w.idle.Add(1) > w.maxIdle {
			w.idle.Add(-1)
			return
		}
		var ok bool
		j, ok = <-w.work
		w.idle.Add(-1)
		if !ok {
			return
		}
	}
}

// close makes the waiting workers exit, and the busy ones once done; call it once nothing is started
// any more (the receive loops have returned).
func (w *workers[J]) close() { close(w.work) }

// wait waits for every worker to exit.
func (w *workers[J]) wait() { w.wg.Wait() }
