package retry

import (
	"sync"
	"sync/atomic"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// job is one received message on its way to a worker.
type job struct {
	live *liveConnection
	rt   route
	msg  *azservicebus.ReceivedMessage
	hold hold
}

// workers run the received messages, one goroutine per message in flight. A worker that has finished
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
type workers struct {
	deliver func(job)
	work    chan job // unbuffered: a send goes through only to a worker waiting on it; closed at the end
	maxIdle int32
	idle    atomic.Int32
	wg      sync.WaitGroup
}

// start runs j on a waiting worker, or on a new one.
func (w *workers) start(j job) {
	select {
	case w.work <- j:
	default:
		w.wg.Add(1)
		go w.run(j)
	}
}

// run delivers j and then every message handed to it, until close or enough others wait.
func (w *workers) run(j job) {
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
func (w *workers) close() { close(w.work) }

// wait waits for every worker to exit.
func (w *workers) wait() { w.wg.Wait() }

// deliver processes one message (processor.go) and gives back its slot: what a worker does with a job.
func (r *run) deliver(j job) {
	res := r.c.proc.process(r.handlerCtx, r.settleBase, j.msg, j.rt, &j.hold)
	j.hold.done()
	r.c.count(res)
	j.live.inFlight.Done()
	r.busy.Add(-1)
}
