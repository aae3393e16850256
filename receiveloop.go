package retry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// Health probing of a connection that is not delivering. The SDK hides link and connection errors
// from ReceiveMessages (it returns no messages and no error, and recovers on the next call), and a
// receive against a hung broker simply blocks; so a consumer that only looked at receive errors would
// report itself ready through a whole outage. Instead, a receive that returns nothing before
// idleProbeInterval, or after it, is followed by a probe of the connection (Connection.Ping, else
// Check), bounded by probeTimeout: with the defaults a dead namespace is noticed within about 10 s.
const (
	idleProbeInterval = 5 * time.Second
	probeTimeout      = 5 * time.Second
)

// receiveOptions shortens how long a receive that has its first message waits for more: the SDK's
// default, 20 ms, was the whole p99 of how late scheduled retries reached their handler. Under load the
// batch fills at once anyway, since the link's credit keeps messages streaming.
var receiveOptions = azservicebus.ReceiveMessagesOptions{TimeAfterFirstMessage: time.Millisecond}

// errIdle is the cause of a receive ended by the idle window.
var errIdle = errors.New("retry: no message within the idle window")

// errYield is the cause of a receive ended to give its handler slots to another source.
var errYield = errors.New("retry: receive yielded its slots to another source")

// shareWindow is the shortest time a receive on one source of a connection with several waits before
// it gives its slots to another source that needs them.
const shareWindow = 50 * time.Millisecond

// receiveLoop receives from one source of live and hands each message to a worker (dispatch), until
// ctx ends (nil) or it finds the connection broken (the reason). Each receive asks for as many messages
// as it holds handler slots and prefetch places (see slots).
func (r *run) receiveLoop(ctx context.Context, live *liveConnection, src Source) error {
	cfg := r.c.cfg
	clk := cfg.clock
	flaps := 0              // link errors swallowed by the SDK on this source since it last worked
	quietSince := clk.Now() // the last message or successful probe: the idle window counts from it
	var gather *time.Timer  // bounds a wait for prefetch places (see slots.fill); system clock only
	if _, system := clk.(realClock); system {
		gather = time.NewTimer(gatherWindow)
		gather.Stop()
		defer gather.Stop()
	}
	for {
		limit, err := r.awaitReceiving(ctx, live, &quietSince)
		if limit == 0 {
			return err // nil when ctx ended
		}
		h, pf, err := r.takeOne(ctx, live, &quietSince)
		if h+pf == 0 {
			return err // nil when ctx ended
		}
		h, pf = r.slots.fill(ctx, gather, h, pf, cfg.batchSize)
		h, pf, ok := r.fitBreaker(limit, h, pf)
		if !ok {
			continue
		}
		n := h + pf
		idleLeft := max(idleProbeInterval-clk.Now().Sub(quietSince), 0)
		msgs, idle, yielded, err := r.receive(ctx, src.Receiver, n, live.shared, idleLeft, h > 0)
		if limit > 0 && len(msgs) == 0 {
			r.c.outage.unask() // the probe's receive brought nothing: another may ask at once
		}
		// Give back the places the receive did not fill, prefetch places first; the filled ones are
		// given back by their messages.
		unfilled := max(n-len(msgs), 0)
		backPf := min(unfilled, pf)
		r.slots.giveBack(unfilled-backPf, backPf)
		h -= unfilled - backPf
		if len(msgs) > 0 {
			flaps = 0
			quietSince = clk.Now()
			live.proven.Store(true)
			r.dispatch(ctx, live, src, msgs, h, n)
			continue
		}
		if ctx.Err() != nil {
			return nil
		}
		var broken error
		switch {
		case yielded:
			continue // gave its slots to another source; nothing to judge
		case idle:
			if broken = r.probe(ctx, live); broken == nil {
				flaps = 0 // a quiet but healthy connection
				quietSince = clk.Now()
				live.proven.Store(true)
			}
		case err == nil:
			// The SDK hit a link or connection error and will recover on the next call. Probe at once:
			// after a single drop the SDK has usually recovered and messages flow again right away; a
			// connection that keeps dropping, or a namespace that is gone, is rebuilt on the schedule.
			flaps++
			r.c.recordFailure(func(h *Health) { h.ReceiveFailures++ }, errors.New("retry: the receive link or connection was lost"))
			if broken = r.probe(ctx, live); broken == nil && flaps > 1 {
				broken = errFlapping
			}
		default:
			broken = err
		}
		if broken != nil && ctx.Err() == nil {
			return broken
		}
	}
}

// fitBreaker trims the handler (h) and prefetch (pf) places taken to what the breaker's limit allows
// (see awaitReceiving), giving back the rest, prefetch first: none when it opened while the loop waited
// for a slot (ok false: wait on it), one when it is half-open and wants a message to probe with.
func (r *run) fitBreaker(limit, h, pf int) (int, int, bool) {
	if limit < 0 && !r.c.outage.closed.Load() {
		r.slots.giveBack(h, pf)
		return 0, 0, false
	}
	if limit > 0 && h+pf > limit {
		backPf := min(pf, h+pf-limit)
		backH := h + pf - limit - backPf
		r.slots.giveBack(backH, backPf)
		h, pf = h-backH, pf-backPf
	}
	return h, pf, true
}

// awaitReceiving waits while the outage breaker (outage.go) keeps the consumer from receiving, and
// returns how many messages the next receive may ask for: -1 for no limit of the breaker's, 1 for a
// half-open breaker's probe, 0 when ctx ended or the connection is broken (err then saying why). When
// the breaker wants its health check, this loop runs it. While it waits, the connection is probed on the
// idle schedule, as takeOne does: a paused consumer must still notice that Service Bus is gone.
func (r *run) awaitReceiving(ctx context.Context, live *liveConnection, quietSince *time.Time) (limit int, err error) {
	b, clk := r.c.outage, r.c.cfg.clock
	if b.closed.Load() {
		return -1, nil
	}
	return b.await(ctx, &errand{
		next: func() time.Duration { return max(idleProbeInterval-clk.Now().Sub(*quietSince), 0) },
		run: func() error {
			if err := r.probe(ctx, live); err != nil {
				return err
			}
			*quietSince = clk.Now()
			return nil
		},
	})
}

// takeOne takes one free handler slot or prefetch place, waiting for one if none is free, and returns
// which (h or pf is 1; both 0 when ctx ended or the connection is broken, err then saying why). While
// every slot is busy for long (long handlers) nothing is received, so it probes the connection on the
// idle schedule meanwhile: an outage must not go unnoticed just because handlers are slow.
func (r *run) takeOne(ctx context.Context, live *liveConnection, quietSince *time.Time) (h, pf int, err error) {
	s, clk := r.slots, r.c.cfg.clock
	select {
	case s.freeHandler() <- struct{}{}:
		return 1, 0, nil
	case s.prefetch <- struct{}{}: // a nil channel (prefetching off) is never ready
		return 0, 1, nil
	default:
	}
	// Say that a source is waiting, so that another source blocked in an empty receive gives its
	// slots back (see receive).
	s.waiting.Add(1)
	defer s.waiting.Add(-1)
	for {
		idle, stop := timerChan(clk, max(idleProbeInterval-clk.Now().Sub(*quietSince), 0))
		select {
		case s.freeHandler() <- struct{}{}:
			stop()
			return 1, 0, nil
		case s.prefetch <- struct{}{}:
			stop()
			return 0, 1, nil
		case <-ctx.Done():
			stop()
			return 0, 0, nil
		case <-idle:
			if err := r.probe(ctx, live); err != nil {
				if ctx.Err() != nil {
					return 0, 0, nil
				}
				return 0, 0, err
			}
			*quietSince = clk.Now()
		}
	}
}

// receive asks receiver for up to n messages. It ends the call after idleLeft, so that a quiet
// connection gets probed; idle reports that this is why it returned nothing. When the connection has
// several sources (shared), a receive waiting on an empty entity also ends once another source waits for
// a handler slot, after at least shareWindow, so that a quiet retry queue never holds the slots its
// subscription needs; yielded reports that.
func (r *run) receive(ctx context.Context, receiver Receiver, n int, shared bool, idleLeft time.Duration, holdsSlots bool) (msgs []*azservicebus.ReceivedMessage, idle, yielded bool, err error) {
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if shared {
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			r.yieldWhenNeeded(rctx, cancel, idleLeft, holdsSlots)
		}()
		defer func() { cancel(nil); <-watched }()
	} else {
		idleEnd := afterFunc(r.c.cfg.clock, idleLeft, func() { cancel(errIdle) })
		msgs, err = receiver.ReceiveMessages(rctx, n, &receiveOptions)
		// Only a window that ended the receive makes it idle: one that passes just after the SDK
		// returned (a swallowed link error, say) must not hide what the receive said.
		if !idleEnd.Stop() && len(msgs) == 0 && ctx.Err() == nil {
			idle = errors.Is(context.Cause(rctx), errIdle)
		}
		return msgs, idle, false, err
	}
	msgs, err = receiver.ReceiveMessages(rctx, n, &receiveOptions)
	if len(msgs) == 0 && ctx.Err() == nil {
		cause := context.Cause(rctx)
		idle = errors.Is(cause, errIdle)
		yielded = errors.Is(cause, errYield)
	}
	return msgs, idle, yielded, err
}

// yieldWhenNeeded ends a receive (rctx) on a connection with several sources after idleLeft, or once
// another source waits for a slot after at least shareWindow: a receive loop (waiting), or, when the
// receive holds handler slots (holdsSlots), a message received ahead, whose loop need not wait at all
// while it finds free prefetch places.
func (r *run) yieldWhenNeeded(rctx context.Context, cancel context.CancelCauseFunc, idleLeft time.Duration, holdsSlots bool) {
	clk := r.c.cfg.clock
	for waited := time.Duration(0); ; {
		if waited >= idleLeft {
			cancel(errIdle)
			return
		}
		step := min(shareWindow, idleLeft-waited)
		select {
		case <-clk.After(step):
			waited += step
			if r.slots.waiting.Load() > 0 || (holdsSlots && r.slots.ahead.Load() > 0) {
				cancel(errYield)
				return
			}
		case <-rctx.Done():
			return
		}
	}
}

// dispatch hands each received message to a worker (see workers.go). The first h messages hold the
// handler slots the receive took, the rest of the asked ones a prefetch place each; a receiver that
// returned more than asked for still never exceeds MaxConcurrency: such a message waits for a handler
// slot here, and once ctx has ended it and the rest are not started (the broker redelivers them when
// their locks run out).
func (r *run) dispatch(ctx context.Context, live *liveConnection, src Source, msgs []*azservicebus.ReceivedMessage, h, asked int) {
	c := r.c
	rt := route{settler: src.Receiver, sender: live.conn.Sender, entity: src.EntityPath}
	for i, msg := range msgs {
		j := job{live: live, rt: rt, msg: msg, place: place{s: r.slots, state: placeHandler}}
		switch {
		case i >= asked:
			select {
			case r.slots.handler <- struct{}{}:
			case <-ctx.Done():
				return
			}
		case i >= h:
			j.place.state = placePrefetch
			j.place.waitAhead() // before the loop takes its next slots (see slots.freeHandler)
		}
		c.received.Add(1)
		c.inFlight.Add(1)
		r.busy.Add(1)
		live.inFlight.Add(1)
		r.workers.start(j)
	}
}

// probe checks that the connection still works, bounded by probeTimeout.
func (r *run) probe(ctx context.Context, live *liveConnection) error {
	ping := live.conn.Ping
	if ping == nil {
		ping = live.conn.Check
	}
	if ping == nil {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if err := ping(pctx); err != nil {
		return fmt.Errorf("retry: connection health probe failed: %w", err)
	}
	return nil
}

// errFlapping breaks a connection whose links keep failing although each probe succeeds.
var errFlapping = errors.New("retry: the connection dropped twice without delivering a message")
