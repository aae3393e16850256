package retry

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// acceptWindow bounds one accept of the next session. An accept that times out only means no session
// is available now; the worker asks again, so the window decides how often an idle worker talks to the
// broker, not how long a new session waits. It is also how a dead connection shows: the broker answers
// an empty accept with a timeout of its own just inside the window, and unansweredAccepts windows that
// end on our deadline instead break the connection.
const acceptWindow = 10 * time.Second

// unansweredAccepts is how many accepts in a row may end on our own deadline, with no answer from the
// broker, before the connection is taken for broken.
const unansweredAccepts = 2

// acceptFloor is the shortest time between two accepts of one worker that found no session: an accept
// that answers at once (a broker that does not wait) must not make the worker spin.
const acceptFloor = time.Second

// errSessionIdle is the cause of a receive ended by SessionIdleTimeout.
var errSessionIdle = errors.New("retry: no message in the session within SessionIdleTimeout")

// errAcceptUnanswered breaks a connection whose accepts keep ending on our deadline.
var errAcceptUnanswered = errors.New("retry: the broker answered no accept of a session in time; the connection is taken for broken")

// sessionWorker accepts sessions one after the other and serves each until it is released, until ctx
// ends (nil) or an accept finds the connection broken (the reason). It holds one of the run's session
// tokens while it accepts and serves, so that the run never holds more than MaxConcurrentSessions.
func (r *sessionRun) sessionWorker(ctx context.Context, live *liveSessionConnection) error {
	clk := r.sc.cfg.clock
	unanswered := 0
	for ctx.Err() == nil {
		// Paused, or the outage breaker open: accept nothing until it lets a receive through.
		limit, _ := r.sc.stats.outage.await(ctx, nil)
		if limit == 0 {
			return nil
		}
		select {
		case r.sessions <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		start := clk.Now()
		recv, err := r.acceptNext(ctx, live)
		if err != nil && limit == 1 {
			r.sc.stats.outage.unask() // no session to probe with: another worker may try at once
		}
		if err == nil {
			unanswered = 0
			r.proven(live)
			r.serve(ctx, recv, live)
			if limit == 1 {
				// Accepted to probe with: if its message did not become the probe (the session had
				// none, or was released first), another worker may ask at once.
				r.sc.stats.outage.unask()
			}
			<-r.sessions
			continue
		}
		<-r.sessions
		switch {
		case ctx.Err() != nil:
			return nil
		case acceptTimedOut(err):
			if code, ok := sdkCode(err); ok && code == azservicebus.CodeTimeout {
				unanswered = 0
				r.proven(live) // the broker answered: nothing to accept
			} else if unanswered++; unanswered >= unansweredAccepts {
				return errAcceptUnanswered
			}
			if wait := acceptFloor - clk.Now().Sub(start); wait > 0 {
				ch, stop := timerChan(clk, wait)
				select {
				case <-ch:
				case <-ctx.Done():
					stop()
					return nil
				}
			}
		default:
			return err
		}
	}
	return nil
}

// proven records that the broker answered an accept on live: the connection works, and the consumer
// is running.
func (r *sessionRun) proven(live *liveSessionConnection) {
	if !live.proven.Swap(true) {
		r.sc.stats.setState(StateRunning, nil)
	}
}

// acceptNext accepts the next session, bounded by acceptWindow.
func (r *sessionRun) acceptNext(ctx context.Context, live *liveSessionConnection) (SessionReceiver, error) {
	actx, cancel := context.WithTimeout(ctx, acceptWindow)
	defer cancel()
	recv, err := live.conn.AcceptNext(actx)
	if err == nil && recv == nil {
		return nil, errNilConnection
	}
	return recv, err
}

// acceptTimedOut reports an accept that found no session in its window: CodeTimeout from the broker,
// or the window's deadline.
func acceptTimedOut(err error) bool {
	code, ok := sdkCode(err)
	return (ok && code == azservicebus.CodeTimeout) || errors.Is(err, context.DeadlineExceeded)
}

// entity is the connection's entity path, else def.
func (live *liveSessionConnection) entity(def string) string {
	if live.conn.EntityPath != "" {
		return live.conn.EntityPath
	}
	return def
}

// serve holds the session of recv: it keeps its lock and handles its messages one at a time, in order,
// until the session is idle for SessionIdleTimeout (or runs dry while every worker is busy: see
// receiveNext), its lock is lost, a message is left unsettled (for redelivery, which must come before
// any later message), or stop ends. Then it closes the receiver, which gives the session up and its
// unsettled message back, in order. With durable holds or blocking on, it first reads the session's
// record and resumes what is due (sessionhold.go resume, on the record of sessiondurable.go).
func (r *sessionRun) serve(stop context.Context, accepted SessionReceiver, live *liveSessionConnection) {
	if int(r.serving.Add(1)) >= r.sc.scfg.maxSessions {
		r.lastAllBusy.Store(r.sc.cfg.clock.Now().UnixNano())
		r.allBusy.fire()
	}
	defer r.serving.Add(-1)
	recv := newSerialReceiver(accepted) // the lock's goroutine and this one share it (sessionreceiver.go)
	hs := &servedSession{recv: recv, sid: recv.SessionID(), entity: live.entity(r.sc.cfg.entityPath), sender: live.conn.Sender}
	hs.lk = r.keepSessionLock(recv, r.sc.cfg.clock.Now())
	// A call that finds the session taken again by the SDK ends it as a lost lock does.
	recv.retaken = func() { r.loseSessionLock(hs.lk, recv, errSessionRetaken) }
	// Stop renewing before closing: a renewal racing the close would only fail, and the close is what
	// gives the session and its unsettled message back.
	defer r.closeReceiver(recv)
	defer hs.lk.release()
	r.sc.cfg.logger.Debug("session accepted", slog.String("session_id", hs.sid), slog.String("entity", hs.entity))
	// One holder per session in this consumer: a worker that accepts a session another worker still
	// serves (its lock ran out at the broker before that worker noticed) waits until the other lets it
	// go, keeping the new lock meanwhile, so that its handler never runs beside the other's.
	h := r.served.enter(hs.entity, hs.sid)
	defer r.served.leave(h)
	if !h.awaitEarlier(stop, hs.lk.ctx) {
		r.sc.cfg.logger.Debug("stopped or lock lost while another worker still served the session", slog.String("session_id", hs.sid))
		return
	}
	if r.sc.scfg.durable || r.sc.scfg.block {
		if err := r.loadState(hs); err != nil {
			r.sc.stats.recordFailure(func(h *Health) { h.ReceiveFailures++ }, err)
			r.sc.cfg.logger.Warn("reading the session state failed; releasing the session", slog.String("session_id", hs.sid), errAttr(err))
			return
		}
	}
	delivered := false // the session delivered a message in this turn: only then can it run dry
	for {
		if paused, _ := r.sc.stats.outage.paused(); paused || r.breakerOpen() {
			r.sc.cfg.logger.Debug("paused or outage breaker open: releasing the session", slog.String("session_id", hs.sid))
			return
		}
		if hs.ds != nil && !hs.ds.foreign && r.resume(stop, hs) {
			return
		}
		msgs, why := r.receiveNext(stop, recv, hs.lk, delivered)
		if len(msgs) == 0 {
			r.sc.cfg.logger.Debug("releasing the session", slog.String("session_id", hs.sid), errAttr(why))
			return
		}
		// Strictly one at a time: the next message is not asked for until this one is settled, so
		// a message left unsettled is never overtaken (the receiver is closed first).
		for _, msg := range msgs {
			if !r.dispatch(stop, hs, msg) {
				return
			}
		}
		delivered = true
	}
}

// receiveNext receives the session's next message, waiting at most SessionIdleTimeout, and no longer
// than the lock lasts or stop. With no message it returns why. The wait is cut into receives of at
// most receiveSlice, so that the lock's renewals get the receiver in between (sessionreceiver.go).
// While every worker serves a session, no worker is accepting, so a session waiting for one would
// wait out the others' idle timeouts: then (and for busyMemory after), once the session has
// delivered a message in this turn (delivered; before that, a slow first delivery is not a dry
// session), a receive of drySlice that finds nothing ends the wait (errRunDry), and the worker goes
// back to accepting. A session released
// so with nothing else waiting is accepted again on its next message, by that worker.
func (r *sessionRun) receiveNext(stop context.Context, recv SessionReceiver, lk *sessionLock, delivered bool) ([]*azservicebus.ReceivedMessage, error) {
	// The wait ends at the first of: a message, the idle timeout (on the Clock), the lock's end, stop.
	// Each cause is kept, so the log says why the session was released.
	clk := r.sc.cfg.clock
	rctx, cancel := context.WithCancelCause(stop)
	defer cancel(nil)
	idle := afterFunc(clk, r.sc.scfg.idle, func() { cancel(errSessionIdle) })
	defer idle.Stop()
	unwatch := context.AfterFunc(lk.ctx, func() { cancel(context.Cause(lk.ctx)) })
	defer unwatch()
	// A session that delivers nothing for drySlice while every worker is busy is released. A slice is
	// cut short when the workers all become busy, and the next one is then drySlice long: the session
	// must have been dry for that long before it goes.
	for {
		// The busy signal is taken before the workers are looked at: serve records that they all
		// became busy before it fires the signal, so either the look sees it or the signal comes.
		busy := r.allBusy.context()
		sliceLen := receiveSlice
		if delivered && r.workersBusyLately() {
			sliceLen = drySlice
		}
		sctx, endSlice := context.WithCancelCause(rctx)
		slice := afterFunc(clk, sliceLen, func() { endSlice(errSliceOver) })
		// Only a long slice is cut when the workers become busy, which they do at every accept while
		// sessions queue for them: a receive of drySlice is left to run out. Cutting it made the dry
		// session start its 20 ms over (so it was held longer while others waited) and make one more
		// receive each time, each of which azservicebus (v1.11) ends by starting a goroutine that
		// releases what arrives for its credit until the next receive (receiver.go, newReleaserFunc).
		unwatchBusy := func() bool { return false }
		if delivered && sliceLen > drySlice {
			unwatchBusy = context.AfterFunc(busy, func() { endSlice(errAllBusy) })
		}
		start := clk.Now()
		msgs, err := recv.ReceiveMessages(sctx, 1, &receiveOptions)
		slice.Stop()
		unwatchBusy()
		cut := context.Cause(sctx)
		endSlice(nil)
		if len(msgs) > 0 {
			return msgs, nil
		}
		if cause := context.Cause(rctx); cause != nil {
			return nil, cause
		}
		if errors.Is(cut, errSliceOver) || errors.Is(cut, errAllBusy) {
			// A pause ends an idle wait at the next slice (a second at most).
			if paused, _ := r.sc.stats.outage.paused(); paused {
				return nil, errPaused
			}
			if delivered && r.workersBusyLately() && clk.Now().Sub(start) >= drySlice {
				return nil, errRunDry
			}
			continue
		}
		if err != nil {
			// A receive that fails releases the session (its message, if any, goes back); whether the
			// connection is broken is for the next accept to say.
			r.sc.stats.recordFailure(func(h *Health) { h.ReceiveFailures++ }, err)
			return nil, err
		}
		return nil, errors.New("retry: the receive returned nothing")
	}
}

// errSliceOver ends one slice of a wait for the session's next message.
var errSliceOver = errors.New("retry: receive slice over")

// errRunDry is why a session was released before its idle timeout: it delivered nothing for
// drySlice while every worker served a session.
var errRunDry = errors.New("retry: the session ran dry while every worker was busy; released so that a waiting session gets a worker")

// drySlice is how long a session may go without a message while every worker serves a session. Service
// Bus hands out a session's waiting messages at once, so a session that delivers nothing for this long
// has run dry for now, and a session waiting for a worker would otherwise wait out SessionIdleTimeout
// (10 s by default: with 8 workers and 200 sessions of 25 messages, a burst drained at about 20
// messages a second). It is the idle timeout of the hand-written session loop of BENCHMARKS.md. Asking
// the broker instead (an accept with a short window, keeping the dry session if none waits) was tried
// and dropped: azservicebus takes the accept's deadline, less at most 1 %, for the broker's timeout,
// so a short window ends on the client's deadline as often as on the broker's answer, and the SDK then
// closes the whole connection, every session on it with it.
const drySlice = 20 * time.Millisecond

// errPaused ends the wait for a session's next message when the consumer is paused.
var errPaused = errors.New("retry: the consumer was paused")

// errAllBusy cuts a receive slice short when every worker has become busy.
var errAllBusy = errors.New("retry: every worker serves a session")

// busySignal tells the dry sessions' receives when every worker has become busy: its context is
// cancelled then, and a new one made for the next time.
type busySignal struct {
	mu     sync.Mutex
	ctx    context.Context
	cancel context.CancelFunc
}

// context returns the context cancelled the next time every worker becomes busy.
func (b *busySignal) context() context.Context {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ctx == nil {
		b.ctx, b.cancel = context.WithCancel(context.Background())
	}
	return b.ctx
}

// fire cancels the current context, if anyone asked for one.
func (b *busySignal) fire() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cancel != nil {
		b.cancel()
		b.ctx, b.cancel = nil, nil
	}
}

// busyMemory is how long after every worker was last busy the run still counts as busy: sessions
// queue for workers while it is saturated, and a worker that has just been freed takes one of them,
// so the pool is briefly not all busy while sessions still wait. Releasing the dry sessions of a
// pool saturated within busyMemory lets them all go at once instead of one per accept.
const busyMemory = time.Second

// workersBusyLately reports whether every worker of the run serves a session, or did within
// busyMemory: then sessions may be waiting for a worker with none free to accept them. (A worker that
// is accepting holds a session token too, so the tokens cannot tell.)
func (r *sessionRun) workersBusyLately() bool {
	if int(r.serving.Load()) >= r.sc.scfg.maxSessions {
		return true
	}
	last := r.lastAllBusy.Load()
	return last != 0 && r.sc.cfg.clock.Now().Sub(time.Unix(0, last)) < busyMemory
}

// closeReceiver closes recv, bounded by the settle timeout.
func (r *sessionRun) closeReceiver(recv SessionReceiver) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.settleBase), r.sc.cfg.settleTimeout)
	defer cancel()
	if err := recv.Close(ctx); err != nil {
		r.sc.cfg.logger.Debug("closing the session receiver failed", slog.String("session_id", recv.SessionID()), errAttr(err))
	}
}

// sessionsServed records which sessions the workers of a run serve, so that two workers never serve
// one session at once (see serve). The zero value is ready to use.
type sessionsServed struct {
	mu     sync.Mutex
	latest map[sessionKey]*serving
}

// sessionKey names a session: its entity and its id.
type sessionKey struct{ entity, id string }

// serving is one worker's turn at a session; earlier is the turn it came after, if that worker had
// not let the session go yet.
type serving struct {
	key     sessionKey
	done    chan struct{} // closed when the worker lets the session go
	earlier *serving
}

// enter records that a worker serves the session id of entity.
func (ss *sessionsServed) enter(entity, id string) *serving {
	k := sessionKey{entity, id}
	h := &serving{key: k, done: make(chan struct{})}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.latest == nil {
		ss.latest = make(map[sessionKey]*serving)
	}
	h.earlier = ss.latest[k]
	ss.latest[k] = h
	return h
}

// leave records that h's worker let its session go. A worker that gave up waiting may leave an
// earlier turn still running: that turn, the latest unfinished one, is then what the next worker to
// accept the session waits for.
func (ss *sessionsServed) leave(h *serving) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	close(h.done)
	if ss.latest[h.key] != h {
		return
	}
	for e := h.earlier; e != nil; e = e.earlier {
		select {
		case <-e.done:
		default:
			ss.latest[h.key] = e
			return
		}
	}
	delete(ss.latest, h.key)
}

// awaitEarlier waits until every earlier turn at h's session has ended: all of them, since one
// that gave up waiting leaves its own earlier one running. It reports false when stop or lock ended
// first.
func (h *serving) awaitEarlier(stop, lock context.Context) bool {
	for e := h.earlier; e != nil; e = e.earlier {
		select {
		case <-e.done:
		case <-stop.Done():
			return false
		case <-lock.Done():
			return false
		}
	}
	return true
}
