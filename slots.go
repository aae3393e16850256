package retry

import (
	"context"
	"sync/atomic"
	"time"
)

// extraSettleSlots is how many more messages than MaxConcurrency may be between their handler's return
// and the end of their settle. A settle can hang for up to SettleTimeout on a lock that died with its
// connection; while it does, the consumer keeps receiving and handling, up to this many such settles.
const extraSettleSlots = 64

// gatherWindow bounds how long a receive loop waits for more prefetch places while messages received
// ahead keep its handlers busy (see slots.fill).
const gatherWindow = 2 * time.Millisecond

// slots bounds what one Run holds at once, with three channel semaphores:
//   - handler: one place per running handler (MaxConcurrency);
//   - prefetch: one place per message received ahead of a free handler slot (Options.Prefetch; nil when
//     prefetching is off). Such a message waits, its lock kept, until a handler slot frees up;
//   - settling: one place per message whose handler has returned and whose settle is in flight
//     (MaxConcurrency + extraSettleSlots), so that the next handler can start while a settle is still on
//     its way, and a settle stuck on a dead lock never stops the consumer.
//
// A receive loop takes handler slots and prefetch places for a receive (fill) and hands each message
// the one it took, as a [place].
type slots struct {
	handler  chan struct{}
	prefetch chan struct{}
	settling chan struct{}
	// ahead counts the messages received ahead that wait for a handler slot. While there are some, a
	// receive loop takes no handler slot for a receive of its own: a freed slot goes to a message already
	// here, not to a receive that may wait for the idle window holding it.
	ahead atomic.Int32
	// waiting counts the receive loops waiting for a slot: on a connection with several sources, a
	// receive on a quiet source then gives its slots back (see receive).
	waiting atomic.Int32
	// stopping is closed when receiving stops: a message received ahead that has not started by then is
	// not started any more (Run gives handlers in flight the grace period, not new ones).
	stopping chan struct{}
}

func newSlots(cfg *config) *slots {
	s := &slots{
		handler:  make(chan struct{}, cfg.maxConcurrency),
		settling: make(chan struct{}, cfg.maxConcurrency+extraSettleSlots),
		stopping: make(chan struct{}),
	}
	if cfg.prefetch > 0 {
		s.prefetch = make(chan struct{}, cfg.prefetch)
	}
	return s
}

// freeHandler is the handler semaphore as a receive loop may take from it: a nil channel (never ready)
// while messages received ahead wait for a slot.
func (s *slots) freeHandler() chan struct{} {
	if s.ahead.Load() > 0 {
		return nil
	}
	return s.handler
}

// takeFree takes up to n free places of sem without waiting and returns how many it took.
func takeFree(sem chan struct{}, n int) int {
	for took := 0; took < n; took++ {
		select {
		case sem <- struct{}{}:
		default:
			return took
		}
	}
	return n
}

// fill takes, for a receive that already holds h handler slots and pf prefetch places, every other
// slot and place free now, up to batch in all: handler slots first. While messages received ahead keep
// the handlers busy and fewer than half a batch is held, it waits up to gatherWindow for more places,
// since a receive costs the SDK and the broker about as much for one message as for a batch. gather is
// the receive loop's timer for that wait, stopped between waits; nil means no waiting (the timer is on
// the system clock, so a consumer on an injected clock does not gather).
func (s *slots) fill(ctx context.Context, gather *time.Timer, h, pf, batch int) (int, int) {
	if sem := s.freeHandler(); sem != nil {
		h += takeFree(sem, batch-h-pf)
	}
	if s.prefetch == nil {
		return h, pf
	}
	pf += takeFree(s.prefetch, batch-h-pf)
	if gather == nil || h+pf >= batch/2 || s.ahead.Load() == 0 {
		return h, pf
	}
	gather.Reset(gatherWindow)
	defer gather.Stop()
	for h+pf < batch/2 && s.ahead.Load() > 0 {
		select {
		case s.prefetch <- struct{}{}:
			pf++
		case <-gather.C:
			return h, pf + takeFree(s.prefetch, batch-h-pf)
		case <-ctx.Done():
			return h, pf
		}
	}
	return h, pf + takeFree(s.prefetch, batch-h-pf)
}

// giveBack returns what a receive took and did not fill: prefetch places first.
func (s *slots) giveBack(h, pf int) {
	for ; pf > 0; pf-- {
		<-s.prefetch
	}
	for ; h > 0; h-- {
		<-s.handler
	}
}

// What a place holds.
const (
	placeNothing  = iota // the zero value: a stray place gives nothing back
	placeHandler         // a handler slot
	placePrefetch        // a prefetch place: received ahead of a free handler slot
	placeSettling        // a settling place: the handler has returned, or the delivery waits for another
)

// place is one delivery's place in the slots. The processor sees it as a [handlerSlot]: acquire before
// the handler runs, release once it has returned. The consumer gives it back (done) when the delivery
// is finished.
type place struct {
	s     *slots
	state int
	ahead bool // counted in s.ahead
}

var _ handlerSlot = (*place)(nil)

// acquire takes a handler slot before a handler runs, waiting for one unless the delivery holds one;
// false if ctx ended, the lock did, or receiving stopped first.
// Waiting while holding a settling place could close a cycle between the semaphores, so that place is
// given back first.
func (h *place) acquire(ctx context.Context, lock lockState) bool {
	switch h.state {
	case placeHandler:
		return true
	case placeSettling:
		<-h.s.settling
		h.state = placeNothing
	}
	if h.state == placePrefetch {
		h.waitAhead()
		defer h.stopWaiting() // whichever way the wait ends
	}
	// A delivery that may not run must not take a free slot. A delivery that has to take a slot has not
	// started its handler: once receiving has stopped it is not started any more (Run gives handlers in
	// flight the grace period, not new ones).
	select {
	case <-h.s.stopping:
		return false
	default:
	}
	if ctx.Err() != nil || lock.ended() {
		return false
	}
	// A free slot is taken at once, without the select below, which costs the lock's channel and the
	// runtime's set-up of a four-case select (BENCHMARKS.md, "Primitives kept and removed").
	select {
	case h.s.handler <- struct{}{}:
	default:
		select {
		case h.s.handler <- struct{}{}:
		case <-h.s.stopping:
			return false
		case <-ctx.Done():
			return false
		case <-lock.Done():
			return false
		}
	}
	if h.state == placePrefetch {
		h.stopWaiting() // before the place frees: a receive loop woken by it must see the count
		<-h.s.prefetch
	}
	h.state = placeHandler
	return true
}

// release trades the handler slot (or prefetch place) for a settling place, if one is free; with none
// free it keeps what it holds, as if settles were not pipelined. Nothing ever waits for a settling
// place, so no cycle of waits can form.
func (h *place) release() {
	if h.state != placeHandler && h.state != placePrefetch {
		return
	}
	h.stopWaiting()
	select {
	case h.s.settling <- struct{}{}:
	default:
		return
	}
	h.giveUp()
	h.state = placeSettling
}

// done gives back whatever the place holds.
func (h *place) done() {
	h.stopWaiting()
	if h.state == placeSettling {
		<-h.s.settling
	}
	h.giveUp()
	h.state = placeNothing
}

// giveUp gives back a handler slot or prefetch place.
func (h *place) giveUp() {
	switch h.state {
	case placeHandler:
		<-h.s.handler
	case placePrefetch:
		<-h.s.prefetch
	}
}

// waitAhead counts the message as one received ahead that waits for a handler slot.
func (h *place) waitAhead() {
	if !h.ahead {
		h.ahead = true
		h.s.ahead.Add(1)
	}
}

// stopWaiting ends that count.
func (h *place) stopWaiting() {
	if h.ahead {
		h.ahead = false
		h.s.ahead.Add(-1)
	}
}
