package retry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry/internal/redact"
)

// State is the consumer's life-cycle state, as reported by [Consumer.Health].
type State int

const (
	// StateIdle: Run has not been called yet.
	StateIdle State = iota
	// StateConnecting: Run is building the first connection.
	StateConnecting
	// StateRunning: receiving and processing messages.
	StateRunning
	// StateReconnecting: the connection broke (a receive failed, or a health probe after a dropped link or
	// an idle period failed); the reconnect tries (5 s, 10 s, 15 s by default) are running.
	StateReconnecting
	// StateWatchdog: every reconnect try failed; the watchdog retries every WatchdogInterval.
	StateWatchdog
	// StateStopped: Run has returned.
	StateStopped
	// StateDraining: Run's context has ended. The consumer receives nothing more and waits for the
	// handlers and settles in flight (up to ShutdownGrace plus one SettleTimeout); it is not ready, but
	// still live, until Run returns ([StateStopped]). It follows whichever state the consumer was in.
	StateDraining
)

func (s State) String() string {
	switch s {
	case StateIdle:
		return "idle"
	case StateConnecting:
		return "connecting"
	case StateRunning:
		return "running"
	case StateReconnecting:
		return "reconnecting"
	case StateWatchdog:
		return "watchdog"
	case StateStopped:
		return "stopped"
	case StateDraining:
		return "draining"
	}
	return "unknown"
}

// Health is a snapshot of the consumer for readiness and liveness probes.
type Health struct {
	State State
	// Since is when the consumer entered State.
	Since time.Time
	// LastError is the latest connect, probe, receive or republish failure (redacted), empty if none. It
	// says why the consumer is not ready.
	LastError string
	// LastErrorTime is when LastError happened.
	LastErrorTime time.Time
	// InFlight is the number of messages received and not yet finished: handlers running, redeliveries
	// waiting for an earlier delivery of their message, and settles in flight.
	InFlight int
	// Counters since the consumer was created.
	Received, Completed, RetriesScheduled, DeadLettered, LeftForRedelivery, PossibleDuplicates uint64
	// Warnings are the connection's settings warnings (see Connection.Settings), read once per Run, each
	// naming its entity; or, when the settings could not be read, one warning saying so, naming the
	// entity and why (for the built-in connectors, the administration endpoint).
	Warnings []string
	// Connects counts successful connector calls; ConnectFailures and ReceiveFailures count failures
	// (ReceiveFailures includes link and connection errors the SDK recovered from on its own, and failed
	// health probes). SendFailures counts failed republishes of retry copies.
	Connects, ConnectFailures, ReceiveFailures, SendFailures uint64
}

// Ready reports whether the consumer is connected and receiving.
func (h Health) Ready() bool { return h.State == StateRunning }

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

// extraSettleSlots is how many more messages than MaxConcurrency may be between their handler's return
// and the end of their settle. A settle can hang for up to SettleTimeout on a lock that died with its
// connection; while it does, the consumer keeps receiving and handling, up to this many such settles.
const extraSettleSlots = 64

// gatherWindow bounds how long a receive loop waits for more prefetch places while messages received
// ahead keep its handlers busy (see receiveLoop).
const gatherWindow = 2 * time.Millisecond

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

// errFlapping breaks a connection whose links keep failing although each probe succeeds.
var errFlapping = errors.New("retry: the connection dropped twice without delivering a message")

// Consumer receives messages, runs the handler through a [Processor] with at most MaxConcurrency
// handlers at once, and recovers from connection loss by rebuilding the connection from scratch.
// Create it with [NewConsumer]; the zero value's Run returns [ErrNotConfigured]. Its methods are safe for
// concurrent use; Run may be called again after it returns.
type Consumer struct {
	connect Connector
	handler Handler
	cfg     *config
	proc    *Processor
	running atomic.Bool

	mu     sync.Mutex
	health Health // everything but the message counters, which are below (Health adds them)
	// stateMu serializes state changes with their hook calls, so that OnStateChange sees the changes in
	// the order they happened although the draining state is entered from ctx's AfterFunc.
	stateMu sync.Mutex

	// The per-message counters are atomics, so that counting costs the workers no shared lock.
	received, completed, retries, deadLettered, left, duplicates atomic.Uint64
	inFlight                                                     atomic.Int64
}

// NewConsumer returns a Consumer that gets its connections from connect and passes each message to
// handler. nil opts means defaults; invalid options return an error wrapping [ErrInvalidOptions].
func NewConsumer(connect Connector, handler Handler, opts *Options) (*Consumer, error) {
	if connect == nil {
		return nil, &OptionError{Field: "connect", Reason: "must not be nil"}
	}
	if handler == nil {
		return nil, &OptionError{Field: "handler", Reason: "must not be nil"}
	}
	cfg, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	c := &Consumer{connect: connect, handler: handler, cfg: cfg}
	c.proc = newProcessor(nil, handler, cfg)
	c.health.Since = cfg.clock.Now()
	return c, nil
}

// Health returns a snapshot of the consumer's state and counters. The message counters are read one by
// one while messages are processed, so a message may already be counted as completed and still as in
// flight; each counter on its own is exact.
func (c *Consumer) Health() Health {
	if c == nil {
		return Health{}
	}
	c.mu.Lock()
	h := c.health
	c.mu.Unlock()
	h.InFlight = int(c.inFlight.Load())
	h.Received = c.received.Load()
	h.Completed = c.completed.Load()
	h.RetriesScheduled = c.retries.Load()
	h.DeadLettered = c.deadLettered.Load()
	h.LeftForRedelivery = c.left.Load()
	h.PossibleDuplicates = c.duplicates.Load()
	return h
}

// Run receives and processes messages until ctx ends. It then reports [StateDraining] (not ready),
// stops receiving, gives in-flight handlers ShutdownGrace to finish (after which their contexts are
// cancelled) and one SettleTimeout more to return and settle, closes the connection and returns nil. If handlers are still running then, Run
// closes the connection anyway, settles nothing more, and returns a [*ShutdownError] saying how many;
// those goroutines end whenever their handlers return.
//
// Run returns [ErrAlreadyRunning] if another Run is active. Connection failures do not end Run: they
// are retried (see [State]); only a first connect that finds the entity missing or the credential
// unauthorized returns an error wrapping [ErrEntityNotFound] or [ErrUnauthorized], unless
// Options.RetryStartupErrors is set.
func (c *Consumer) Run(ctx context.Context) error {
	if c == nil || c.cfg == nil || c.connect == nil {
		return ErrNotConfigured
	}
	if !c.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer c.running.Store(false)

	// Handlers outlive ctx by the shutdown grace, so they get a context of their own; settles outlive
	// the handlers' cancellation by one settle timeout, and end when Run gives up.
	handlerCtx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()
	settleBase, abandon := context.WithCancelCause(context.WithoutCancel(ctx))
	defer abandon(nil)

	r := &run{
		c:          c,
		handlerCtx: handlerCtx,
		settleBase: settleBase,
		detached:   context.WithoutCancel(settleBase),
		slots:      make(chan struct{}, c.cfg.maxConcurrency),
		settleCap:  int64(c.cfg.maxConcurrency + extraSettleSlots),
		work:       make(chan job, c.cfg.maxConcurrency+c.cfg.prefetch),
		stopping:   make(chan struct{}),
		gatherWake: make(chan struct{}, 1),
		holders:    make(map[*slotHolder]struct{}),
	}
	r.calls.r = r
	defer r.calls.stop()
	if c.cfg.prefetch > 0 {
		r.prefetch = make(chan struct{}, c.cfg.prefetch)
	}
	// From the moment ctx ends the consumer is draining: not ready, so that a readiness probe takes it
	// out of rotation while its handlers finish, and still live until Run returns.
	drainEntered := make(chan struct{})
	stopDrain := context.AfterFunc(ctx, func() {
		defer close(drainEntered)
		c.setState(StateDraining, nil)
	})
	loopErr := r.loop(ctx)
	if ctx.Err() != nil {
		// Done closes before the AfterFunc that reports draining runs, so Run may get here first; the
		// state must still pass through draining (setState skips it if the callback already set it).
		c.setState(StateDraining, nil)
	}
	close(r.work)     // nothing is dispatched any more: idle workers exit, busy ones when done
	close(r.stopping) // messages received ahead and not started yet are left for redelivery

	// Shutdown: receiving has stopped. Handlers still running get the grace period with a live context,
	// then one settle timeout after their cancellation. Only then are the connections closed, so that
	// their settles can still go through them.
	drained := make(chan struct{})
	go func() {
		r.workers.Wait()
		close(drained)
	}()
	clk := c.cfg.clock
	select {
	case <-drained:
	case <-clk.After(c.cfg.shutdownGrace):
		c.cfg.logger.Warn("shutdown grace elapsed; cancelling in-flight handlers")
		cancelHandlers()
		select {
		case <-drained:
		case <-clk.After(c.cfg.settleTimeout):
		}
	}
	var err error
	select {
	case <-drained:
	default:
		n := int(r.busy.Load())
		err = &ShutdownError{Running: n}
		c.cfg.logger.Error("shutdown timed out; closing the connection with handlers still running", slog.Int("running", n))
		abandon(ErrShutdownTimeout)
		r.endCalls() // settle calls in flight derive from no context abandon reaches
	}
	r.closeAll(ctx)
	if !stopDrain() {
		<-drainEntered // stopped comes after draining, never before
	}
	c.setState(StateStopped, loopErr)
	return errors.Join(loopErr, err)
}

// run is the state of one Run call.
type run struct {
	c          *Consumer
	handlerCtx context.Context
	settleBase context.Context
	detached   context.Context // settleBase without its cancellation
	slots      chan struct{}   // one per running handler
	waiting    atomic.Int32    // receive loops waiting for a slot
	// prefetch has one place per message received ahead of a free handler slot (Options.Prefetch); nil
	// when prefetching is off. Such a message waits in its worker, its lock kept, until a handler slot
	// frees up.
	prefetch chan struct{}
	// stopping is closed when receiving stops: a message received ahead that has not started by then is
	// not started any more (Run gives handlers in flight the grace period, not new ones).
	stopping chan struct{}
	// aheadWaiting counts the messages received ahead that wait for a handler slot. While there are
	// some, the receive loops take no handler slot for a receive of their own: a freed slot goes to a
	// message already here, not to a receive that may wait for the idle window holding it.
	aheadWaiting atomic.Int32
	// gatherFor is, while a receive loop gathers prefetch places, how many more free places end its
	// gathering (zero when none gathers this way); a worker that frees a place, or whose message
	// received ahead stops waiting (the last such message ends a gathering), signals gatherWake, so
	// that a gathering costs the loop one wake-up rather than one per place. One loop at a time owns
	// it (several receive loops share the places on a connection with several sources); another loop
	// that gathers meanwhile takes places one by one as they free up.
	gatherFor  atomic.Int32
	gatherWake chan struct{}
	// settling counts the messages whose handler returned and whose settle is in flight, up to
	// settleCap. Nothing ever waits for one of these slots (see slotHolder), so it is a counter.
	settling  atomic.Int64
	settleCap int64
	workers   sync.WaitGroup
	busy      atomic.Int64 // messages received and not yet finished

	// Long-lived workers run the messages: a worker that finishes one waits for the next instead of
	// exiting, so that a busy consumer neither starts a goroutine per message nor grows a fresh stack
	// for each (the SDK's settle path is deep). work queues a message for an idle worker; idle counts the
	// workers waiting on it that no queued message has claimed yet, and at most maxIdleWorkers wait at a
	// time, so the goroutines stay within the messages in flight plus that constant. work is closed once
	// receiving has stopped.
	work chan job
	idle atomic.Int32

	holdersMu sync.Mutex
	holders   map[*slotHolder]struct{} // the workers' slot holders, for endCalls and calls
	calls     callWatch

	mu    sync.Mutex
	conns []*liveConnection // every connection not yet closed
}

// liveConnection is a Connection with the handlers still using it.
type liveConnection struct {
	conn     *Connection
	inFlight sync.WaitGroup
	once     sync.Once
	proven   atomic.Bool // a source delivered a message, or stayed quiet and passed a probe
	shared   bool        // more than one source: they share the handler slots
}

// sources lists what live receives from: its Receiver, then Connection.Also.
func (live *liveConnection) sources(defaultEntity string) []Source {
	entity := live.conn.EntityPath
	if entity == "" {
		entity = defaultEntity
	}
	out := make([]Source, 0, 1+len(live.conn.Also))
	out = append(out, Source{Receiver: live.conn.Receiver, EntityPath: entity})
	for _, s := range live.conn.Also {
		if s.Receiver != nil {
			out = append(out, s)
		}
	}
	return out
}

// loop is the connection loop: it connects, runs one receive loop per source of the connection, and
// rebuilds the connection when any of them finds it broken. It returns when ctx ends (nil) or when the
// first connect fails in a way that retrying cannot fix.
func (r *run) loop(ctx context.Context) error {
	c := r.c
	var (
		failures  int   // consecutive failures; reset only when a connection has shown that it works
		cause     error // the failure that broke the last connection, for the state hook
		connected bool  // whether any connect of this Run succeeded
	)
	c.setState(StateConnecting, nil)
	for {
		conn, err := c.reconnect(ctx, &failures, cause, !connected)
		if err != nil {
			return err
		}
		if conn == nil {
			return nil
		}
		if !connected && conn.Settings != nil {
			r.checkSettings(ctx, conn)
		}
		connected = true
		live := &liveConnection{conn: conn}
		r.mu.Lock()
		r.conns = append(r.conns, live)
		r.mu.Unlock()
		c.setState(StateRunning, nil)

		// One receive loop per source; the first to find the connection broken stops the others.
		sctx, stop := context.WithCancel(ctx)
		sources := live.sources(c.cfg.entityPath)
		live.shared = len(sources) > 1
		broken := make(chan error, len(sources))
		var loops sync.WaitGroup
		for _, src := range sources {
			loops.Add(1)
			go func() {
				defer loops.Done()
				if err := r.receiveLoop(sctx, live, src); err != nil {
					broken <- err
				}
			}()
		}
		var why error
		select {
		case <-ctx.Done():
		case why = <-broken:
		}
		stop()
		loops.Wait()
		if ctx.Err() != nil {
			return nil
		}
		if live.proven.Load() {
			failures = 0
		}
		failures++
		cause = redact.Wrap(why)
		c.recordFailure(func(h *Health) { h.ReceiveFailures++ }, why)
		c.cfg.logger.Warn("connection broken; rebuilding it", errAttr(why), slog.Int("failures", failures))
		r.retire(ctx, live)
	}
}

// checkSettings reads the entity's settings once and reports what weakens the crash contract.
func (r *run) checkSettings(ctx context.Context, conn *Connection) {
	c := r.c
	sctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	entity := conn.EntityPath
	if entity == "" {
		entity = c.cfg.entityPath
	}
	if entity == "" {
		entity = "(entity)"
	}
	ws, err := conn.Settings(sctx, c.cfg.settleTimeout)
	if err != nil && ctx.Err() != nil {
		return // Run is stopping: the check was cut short, not refused
	}
	if err != nil {
		// Unknown settings may be the weak ones: an operator must know the check did not run.
		text := redact.String(err.Error())
		c.cfg.logger.Warn("entity settings not checked: duplicate detection and MaxDeliveryCount are unknown",
			slog.String("entity", entity), slog.String("error", text))
		w := fmt.Sprintf("%s: settings not checked, so duplicate detection and MaxDeliveryCount are unknown: %s", entity, text)
		c.update(func(h *Health) { h.Warnings = []string{w} })
		return
	}
	for _, w := range ws {
		c.cfg.logger.Warn("entity settings weaken the crash contract", slog.String("entity", entity), slog.String("warning", w))
	}
	c.update(func(h *Health) { h.Warnings = append([]string(nil), ws...) })
}

// receiveLoop receives from one source of live and starts a handler per message, until ctx ends (nil)
// or it finds the connection broken (the reason).
func (r *run) receiveLoop(ctx context.Context, live *liveConnection, src Source) error {
	c := r.c
	clk := c.cfg.clock
	flaps := 0              // link errors swallowed by the SDK on this source since it last worked
	quietSince := clk.Now() // the last message or successful probe: the idle window counts from it
	// fresh: quietSince was set just now, with no wait since, so the idle window is whole. It saves a
	// clock read per receive on a busy loop.
	fresh := true
	tm := r.newLoopTimer()
	defer tm.release()
	// watch: on the real clock, one lazily re-armed timer keeps the idle window for this loop (see
	// idleWatch), so that neither a wait for a slot nor a receive costs a timer operation.
	watch := tm.real && !live.shared
	if watch {
		tm.idle.touch(quietSince)
	}
	for {
		// Take one free handler slot or prefetch place (waiting if needed), then any others free now, and
		// ask for that many. A nil prefetch channel (prefetching off) is never ready.
		h, pf := 0, 0 // handler slots and prefetch places taken
		slots := r.freeSlots()
		select {
		case slots <- struct{}{}:
			h = 1
		case r.prefetch <- struct{}{}:
			pf = 1
		default:
			// Say that a source is waiting, so that another source blocked in an empty receive gives
			// its slots back (see receive). While every slot is busy for long (long handlers) nothing is
			// received, so the connection is probed on the idle schedule meanwhile: an outage must not go
			// unnoticed just because handlers are slow.
			r.waiting.Add(1)
			fresh = false
			got := false
			for !got {
				var timer <-chan time.Time
				if watch {
					timer = tm.idle.due
				} else {
					timer = tm.start(max(idleProbeInterval-clk.Now().Sub(quietSince), 0))
				}
				select {
				case r.freeSlots() <- struct{}{}:
					got, h = true, 1
				case r.prefetch <- struct{}{}:
					got, pf = true, 1
				case <-ctx.Done():
					tm.stop()
					r.waiting.Add(-1)
					return nil
				case <-timer:
					if watch && clk.Now().Sub(quietSince) < idleProbeInterval {
						break // signalled for a window that a message has since restarted
					}
					if err := r.probe(ctx, live); err != nil {
						r.waiting.Add(-1)
						if ctx.Err() != nil {
							return nil
						}
						return err
					}
					quietSince = clk.Now()
					if watch {
						tm.idle.touch(quietSince)
					}
				}
				tm.stop()
			}
			r.waiting.Add(-1)
		}
		slots = r.freeSlots()
	fill:
		for h+pf < c.cfg.batchSize {
			select {
			case slots <- struct{}{}:
				h++
			default:
				break fill
			}
		}
	ahead:
		for r.prefetch != nil && h+pf < c.cfg.batchSize {
			select {
			case r.prefetch <- struct{}{}:
				pf++
			default:
				break ahead
			}
		}
		if tm.real && r.prefetch != nil && h+pf < c.cfg.batchSize/2 && r.aheadWaiting.Load() > 0 {
			// Messages received ahead keep the handlers busy, so there is time to gather places for
			// a fuller receive: a receive call costs the SDK and the broker about as much for one
			// message as for a batch. The gathering ends when half a batch is free, when the messages
			// ahead have all started, or after gatherWindow at most.
			pf = r.gatherPlaces(ctx, tm.gather(gatherWindow), h, pf, c.cfg.batchSize)
			tm.stopGather()
			pf += r.takePlaces(c.cfg.batchSize - h - pf)
		}
		n := h + pf
		idleLeft := idleProbeInterval
		if !fresh {
			idleLeft = max(idleProbeInterval-clk.Now().Sub(quietSince), 0)
		}
		msgs, idle, yielded, err := r.receive(ctx, tm, watch, src.Receiver, n, live.shared, idleLeft, h > 0)
		fresh = false
		// Give back the places the receive did not fill, prefetch places first; the filled ones are
		// given back by their messages.
		for i := len(msgs); i < n; i++ {
			if pf > 0 {
				<-r.prefetch
				pf--
				r.placeFreed() // another receive loop may be gathering
			} else {
				<-r.slots
				h--
			}
		}
		if len(msgs) > 0 {
			flaps = 0
			quietSince, fresh = clk.Now(), true
			if watch {
				tm.idle.touch(quietSince)
			}
			live.proven.Store(true)
			r.dispatch(live, src, msgs, h, n)
			fresh = len(msgs) <= n // a dispatch that waited for slots took time out of the idle window
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
				if watch {
					tm.idle.touch(quietSince)
				}
				live.proven.Store(true)
			}
		case err == nil:
			// The SDK hit a link or connection error and will recover on the next call. Probe at once:
			// after a single drop the SDK has usually recovered and messages flow again right away; a
			// connection that keeps dropping, or a namespace that is gone, is rebuilt on the schedule.
			flaps++
			c.recordFailure(func(h *Health) { h.ReceiveFailures++ }, errors.New("retry: the receive link or connection was lost"))
			if broken = r.probe(ctx, live); broken == nil && flaps > 1 {
				broken = errFlapping
			}
		default:
			broken = err
		}
		if broken == nil {
			continue
		}
		if ctx.Err() != nil {
			return nil
		}
		return broken
	}
}

// loopTimer is a receive loop's reusable timers on the real clock: one bounds the waits for a handler
// slot (channel mode), the other the receives, so that a busy loop does not make a timer per wait. On
// an injected clock, which offers only After, each wait asks the clock instead.
type loopTimer struct {
	clk  Clock
	real bool
	t    *time.Timer // channel mode, made on first use
	g    *time.Timer // bounds a gathering of prefetch places
	idle idleWatch
}

// gather returns a channel that fires after d on the real clock; call stopGather after.
func (lt *loopTimer) gather(d time.Duration) <-chan time.Time {
	if lt.g == nil {
		lt.g = time.NewTimer(d)
	} else {
		lt.g.Reset(d)
	}
	return lt.g.C
}

// stopGather stops the gathering timer.
func (lt *loopTimer) stopGather() { lt.g.Stop() }

func (r *run) newLoopTimer() *loopTimer {
	_, real := r.c.cfg.clock.(realClock)
	return &loopTimer{clk: r.c.cfg.clock, real: real, idle: idleWatch{due: make(chan time.Time, 1)}}
}

// start returns a channel that fires after d; call stop once the wait is over.
func (lt *loopTimer) start(d time.Duration) <-chan time.Time {
	if !lt.real {
		return lt.clk.After(d)
	}
	if lt.t == nil {
		lt.t = time.NewTimer(d)
	} else {
		lt.t.Reset(d)
	}
	return lt.t.C
}

// stop stops the channel timer (a no-op on an injected clock).
func (lt *loopTimer) stop() {
	if lt.t != nil {
		lt.t.Stop()
	}
}

// release stops both timers when the loop ends.
func (lt *loopTimer) release() {
	lt.stop()
	lt.idle.stop()
}

// idleWatch keeps a receive loop's idle window on the real clock with one timer that is not moved when
// a message restarts the window: when it fires early it re-arms itself for what is left. When the window
// has passed it ends the receive in flight (errIdle), or, if none is, signals due for a loop waiting for
// a handler slot. A busy loop thus touches the timer once per idle window, not once per receive or wait.
type idleWatch struct {
	mu     sync.Mutex
	t      *time.Timer
	armed  bool
	quiet  time.Time               // the start of the window: the last message or successful probe
	cancel context.CancelCauseFunc // ends the receive in flight, nil if none
	due    chan time.Time          // the window passed while no receive was in flight
}

// touch restarts the window at now.
func (w *idleWatch) touch(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.quiet = now
	if w.armed {
		return // it fires early, finds the window restarted and re-arms for the rest
	}
	w.armed = true
	if w.t == nil {
		w.t = time.AfterFunc(idleProbeInterval, w.fire)
		return
	}
	w.t.Reset(idleProbeInterval)
}

func (w *idleWatch) fire() {
	w.mu.Lock()
	if left := idleProbeInterval - time.Since(w.quiet); left > 0 {
		w.t.Reset(left)
		w.mu.Unlock()
		return
	}
	w.armed = false
	cancel := w.cancel
	w.cancel = nil
	if cancel == nil {
		select {
		case w.due <- time.Now():
		default:
		}
	}
	w.mu.Unlock()
	if cancel != nil {
		cancel(errIdle)
	}
}

// begin makes the window end the receive that cancel cancels; false if the window has already passed.
func (w *idleWatch) begin(cancel context.CancelCauseFunc) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if time.Since(w.quiet) >= idleProbeInterval {
		select {
		case <-w.due:
		default:
		}
		return false
	}
	w.cancel = cancel
	return true
}

// end says that the receive has returned.
func (w *idleWatch) end() {
	w.mu.Lock()
	w.cancel = nil
	w.mu.Unlock()
}

// stop stops the timer when the loop ends.
func (w *idleWatch) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.t != nil {
		w.t.Stop()
	}
	w.armed = false
}

// receive asks receiver for up to n messages. It ends the call after the idle window, so that a quiet
// connection gets probed; idle reports that this is why it returned nothing. When the connection has
// several sources (shared), a receive waiting on an empty entity also ends once another source waits for
// a handler slot, after at least shareWindow, so that a quiet retry queue never holds the slots its
// subscription needs; yielded reports that.
func (r *run) receive(ctx context.Context, tm *loopTimer, watch bool, receiver Receiver, n int, shared bool, idleLeft time.Duration, holdsSlots bool) (msgs []*azservicebus.ReceivedMessage, idle, yielded bool, err error) {
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if watch {
		// The common case: the loop's idle watch ends the receive; no goroutine, no timer operation.
		if !tm.idle.begin(cancel) {
			cancel(errIdle)
		}
		defer tm.idle.end()
	} else {
		go r.watchReceive(rctx, cancel, shared, idleLeft, holdsSlots)
	}
	msgs, err = receiver.ReceiveMessages(rctx, n, &receiveOptions)
	if len(msgs) == 0 && ctx.Err() == nil {
		cause := context.Cause(rctx)
		idle = errors.Is(cause, errIdle)
		yielded = errors.Is(cause, errYield)
	}
	return msgs, idle, yielded, err
}

// watchReceive ends a receive (rctx) after idleLeft, or, on a connection with several sources, once
// another source waits for a slot after at least shareWindow: a receive loop (waiting), or, when the
// receive holds handler slots (holdsSlots), a message received ahead (aheadWaiting), whose loop need not
// wait at all while it finds free prefetch places.
func (r *run) watchReceive(rctx context.Context, cancel context.CancelCauseFunc, shared bool, idleLeft time.Duration, holdsSlots bool) {
	clk := r.c.cfg.clock
	if !shared {
		select {
		case <-clk.After(idleLeft):
			cancel(errIdle)
		case <-rctx.Done():
		}
		return
	}
	for waited := time.Duration(0); ; {
		if waited >= idleLeft {
			cancel(errIdle)
			return
		}
		step := min(shareWindow, idleLeft-waited)
		select {
		case <-clk.After(step):
			waited += step
			if r.waiting.Load() > 0 || (holdsSlots && r.aheadWaiting.Load() > 0) {
				cancel(errYield)
				return
			}
		case <-rctx.Done():
			return
		}
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

// dispatch hands each received message to a worker. Each message holds a handler slot while its
// handler runs and a settling slot while its settle is in flight, so that a settle stuck on a dead lock
// (the SDK retries those for tens of seconds) never keeps new messages from being received and handled.
func (r *run) dispatch(live *liveConnection, src Source, msgs []*azservicebus.ReceivedMessage, handlerSlots, asked int) {
	c := r.c
	for i, msg := range msgs {
		if i >= asked {
			// A receiver returned more than asked for: still never exceed MaxConcurrency.
			r.slots <- struct{}{}
		}
		ahead := i >= handlerSlots && i < asked // holds a prefetch place, not a handler slot
		if ahead {
			r.aheadWaiting.Add(1) // before the loop takes its next slots (see freeSlots)
		}
		c.received.Add(1)
		c.inFlight.Add(1)
		r.busy.Add(1)
		live.inFlight.Add(1)
		j := job{live: live, src: src, msg: msg, ahead: ahead}
		if r.idle.Add(-1) >= 0 {
			r.work <- j // claimed an idle worker: it takes this or an earlier message, never blocking here
			continue
		}
		r.idle.Add(1)
		r.workers.Add(1)
		go r.worker(j)
	}
}

// job is one received message for a worker.
type job struct {
	live  *liveConnection
	src   Source
	msg   *azservicebus.ReceivedMessage
	ahead bool // received ahead: holds a prefetch place, and waits for a handler slot
}

// maxIdleWorkers is how many workers may wait for a message at once; a worker that finishes when that
// many are already waiting exits. A worker runs its message's settle too, after giving its handler slot
// back, so a busy consumer has workers in handlers and more in settles (and some holding messages
// received ahead): idle workers up to the handler and settle slots are kept, since each may be needed
// again at the next burst, and starting and stopping workers on every burst would cost a goroutine per
// message again. Idle workers are therefore at most MaxConcurrency plus the settle allowance: a constant.
func (r *run) maxIdleWorkers() int32 {
	return int32(r.c.cfg.maxConcurrency + extraSettleSlots)
}

// worker runs j, then every message handed to it, until receiving has stopped or enough other workers
// are idle.
func (r *run) worker(j job) {
	defer r.workers.Done()
	// The worker's own context under the handlers' one: the slot holder follows it once and passes its
	// end on to each handler's context, which therefore registers with no context shared by workers.
	ctx, cancel := context.WithCancel(r.handlerCtx)
	defer cancel()
	sl, unfollow := newSlotHolder(r, ctx)
	defer unfollow()
	r.holdersMu.Lock()
	r.holders[sl] = struct{}{}
	r.holdersMu.Unlock()
	defer func() {
		r.holdersMu.Lock()
		delete(r.holders, sl)
		r.holdersMu.Unlock()
	}()
	for {
		r.handle(ctx, j, sl)
		if r.idle.Load() >= r.maxIdleWorkers() {
			return
		}
		r.idle.Add(1)
		var ok bool
		if j, ok = <-r.work; !ok {
			return
		}
	}
}

// handle processes one message, which holds a handler slot or (received ahead) a prefetch place, with
// the worker's slot holder.
func (r *run) handle(ctx context.Context, j job, sl *slotHolder) {
	defer r.busy.Add(-1)
	defer j.live.inFlight.Done()
	sl.state, sl.ahead = holdsHandler, false
	if j.ahead {
		sl.state, sl.ahead = holdsPrefetch, true // dispatch counted it
	}
	res := r.c.proc.process(ctx, r.settleBase, r.detached, j.src.Receiver, j.live.conn.Sender, j.src.EntityPath, j.msg, sl)
	sl.done()
	r.c.count(res)
}

// slotHolder moves one message between a prefetch place (received ahead, until a handler slot frees up),
// a handler slot (while its handler may run) and a settling slot (while it waits for an earlier delivery
// of the same message, or for its settle). Trading never blocks on the settling pool: when it is full
// the message keeps its handler slot or place (as if settles were not pipelined), and a message waits
// for a handler slot only while holding no settling slot, so no cycle of waits between the pools can
// form.
type slotHolder struct {
	r     *run
	state int                        // holdsHandler, holdsSettling, holdsPrefetch or holdsNothing
	ahead bool                       // counted in r.aheadWaiting: received ahead, waiting for a slot
	call  atomic.Pointer[settleCall] // the worker's broker call in flight, if any

	// The worker's context and its values without its cancellation, which handlers' contexts derive
	// from: the worker's end reaches the running handler's context through its lock keeper (handler;
	// cancelHandler runs once per worker, registered with context.AfterFunc), so that starting a
	// handler costs no lock and no map insert and delete in the worker's context.
	ctx, values context.Context
	handler     atomic.Pointer[lockKeeper] // the running handler's, while it runs
}

// newSlotHolder returns the slot holder of a worker whose context is ctx, and the function that stops
// it following ctx.
func newSlotHolder(r *run, ctx context.Context) (*slotHolder, func() bool) {
	s := &slotHolder{r: r, ctx: ctx, values: context.WithoutCancel(ctx)}
	return s, context.AfterFunc(ctx, s.cancelHandler)
}

// handlerParent derives a handler's context from the worker's values when ctx is the worker's own
// context (an OnStart hook may have returned another, whose cancellation the stdlib then follows).
func (s *slotHolder) handlerParent(ctx context.Context) (parent, worker context.Context) {
	if ctx == s.ctx {
		return s.values, s.ctx
	}
	return ctx, nil
}

// runsHandler records the lock keeper of the handler the worker runs (nil: none), whose context the
// end of the worker's context cancels. The keeper's watchHandler looks at the worker's context after
// registering the handler, so a handler that starts as the worker's context ends is cancelled either
// way.
func (s *slotHolder) runsHandler(lk *lockKeeper) { s.handler.Store(lk) }

// cancelHandler runs when the worker's context ends: it cancels the running handler's context with
// the worker context's cause, as a derived context's cancellation would.
func (s *slotHolder) cancelHandler() {
	if lk := s.handler.Load(); lk != nil {
		lk.cancelHandler(context.Cause(s.ctx))
	}
}

// startCall records the worker's broker call in flight and has the run's call watch end it at its
// deadline.
func (s *slotHolder) startCall(c *settleCall) {
	s.call.Store(c)
	s.r.calls.watch(c.deadline)
}

// endCall records that the worker's call has returned.
func (s *slotHolder) endCall() { s.call.Store(nil) }

// callWatch ends the workers' broker calls at their deadlines with one runtime timer for all of them,
// armed for the earliest deadline it knows of. Calls start in deadline order, almost always (each gets
// the settle timeout), so a new call seldom moves the timer: a settle costs no timer operation. When the
// timer fires it ends the calls that are due and re-arms for the earliest that is not.
type callWatch struct {
	r       *run
	mu      sync.Mutex
	t       *time.Timer
	armedAt time.Time // zero: not armed
}

// watch makes sure the timer fires by deadline.
func (w *callWatch) watch(deadline time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.armedAt.IsZero() && !deadline.Before(w.armedAt) {
		return
	}
	w.armedAt = deadline
	if w.t == nil {
		w.t = time.AfterFunc(time.Until(deadline), w.fire)
		return
	}
	w.t.Reset(time.Until(deadline))
}

// fire ends the calls that are due. The timer counts as unarmed before the scan, so that a call that
// starts meanwhile arms it itself if the scan misses it.
func (w *callWatch) fire() {
	w.mu.Lock()
	w.armedAt = time.Time{}
	w.mu.Unlock()
	now := time.Now()
	var next time.Time
	w.r.holdersMu.Lock()
	for h := range w.r.holders {
		c := h.call.Load()
		switch {
		case c == nil:
		case !now.Before(c.deadline):
			c.expire()
		case next.IsZero() || c.deadline.Before(next):
			next = c.deadline
		}
	}
	w.r.holdersMu.Unlock()
	if !next.IsZero() {
		w.watch(next)
	}
}

// stop stops the timer when the run ends.
func (w *callWatch) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.t != nil {
		w.t.Stop()
	}
}

// endCalls ends every worker's broker call in flight: the shutdown gave up on them.
func (r *run) endCalls() {
	r.holdersMu.Lock()
	defer r.holdersMu.Unlock()
	for h := range r.holders {
		if c := h.call.Load(); c != nil {
			c.end(context.Canceled)
		}
	}
}

const (
	holdsHandler = iota
	holdsSettling
	holdsPrefetch // received ahead of a free handler slot
	holdsNothing
)

// release trades the handler slot for a settling slot, if one is free. A message received ahead holds
// none: it gives its prefetch place back and stops counting as one waiting for a slot (it waits for an
// earlier delivery, or is done without a handler), so that a receive loop blocked on the places wakes
// and may take the handler slots that free up meanwhile; if it needs a slot later, it waits for one as
// any message coming back from a wait does.
func (s *slotHolder) release() {
	if s.state == holdsPrefetch {
		// Trade the place for a settling slot, as a handler slot is traded, so that what the consumer
		// holds stays bounded; when none is free, keep the place.
		s.stopWaiting() // before the place frees: the receive loop woken by it must see the count
		if s.r.settling.Add(1) > s.r.settleCap {
			s.r.settling.Add(-1)
			return
		}
		<-s.r.prefetch
		s.r.placeFreed()
		s.state = holdsSettling
		return
	}
	if s.state != holdsHandler {
		return
	}
	if s.r.settling.Add(1) > s.r.settleCap {
		s.r.settling.Add(-1) // full: keep the handler slot
		return
	}
	<-s.r.slots
	s.state = holdsSettling
}

// gatherPlaces takes prefetch places for a receive that holds h handler slots and pf places, up to
// batch in all, until half a batch is held, no message received ahead waits any more, timer fires or
// ctx ends, and returns how many places it holds then. It sleeps until enough places are free
// (gatherFor, gatherWake) instead of taking each as it frees up, which would wake it once per place.
func (r *run) gatherPlaces(ctx context.Context, timer <-chan time.Time, h, pf, batch int) int {
	owner := false
	defer func() {
		if owner {
			r.gatherFor.Store(0)
		}
	}()
	for {
		pf += r.takePlaces(batch - h - pf)
		if h+pf >= batch/2 || r.aheadWaiting.Load() == 0 {
			return pf
		}
		need := int32(batch/2 - h - pf)
		if !owner && !r.gatherFor.CompareAndSwap(0, need) {
			// Another receive loop gathers: take the places one by one as they free up.
			select {
			case r.prefetch <- struct{}{}:
				pf++
				continue
			case <-timer:
				return pf
			case <-ctx.Done():
				return pf
			}
		}
		owner = true
		r.gatherFor.Store(need)
		// A place freed before the store did not signal: take again. A free that this take misses
		// comes, in practice, after the store and sees it (a failed take reads the channel's count
		// without its lock, so the memory model does not promise it: a wake-up lost that way costs at
		// most the gathering window). A message that stopped waiting before the store is seen by the
		// atomic load after it.
		if took := r.takePlaces(batch - h - pf); took > 0 {
			pf += took
			continue
		}
		if r.aheadWaiting.Load() == 0 {
			return pf
		}
		select {
		case <-r.gatherWake:
		case <-timer:
			return pf
		case <-ctx.Done():
			return pf
		}
	}
}

// takePlaces takes up to n free prefetch places without waiting and returns how many it took.
func (r *run) takePlaces(n int) int {
	took := 0
	for took < n {
		select {
		case r.prefetch <- struct{}{}:
			took++
		default:
			return took
		}
	}
	return took
}

// freePlaces is how many prefetch places are free.
func (r *run) freePlaces() int { return cap(r.prefetch) - len(r.prefetch) }

// placeFreed wakes a gathering receive loop once enough places are free or no message received ahead
// waits any more (see receiveLoop). Call it after freeing a place or ending a wait.
func (r *run) placeFreed() {
	if need := r.gatherFor.Load(); need > 0 && (r.freePlaces() >= int(need) || r.aheadWaiting.Load() == 0) {
		select {
		case r.gatherWake <- struct{}{}:
		default:
		}
	}
}

// freeSlots is the handler slots a receive loop may take: none while messages received ahead wait for
// one (a nil channel, never ready).
func (r *run) freeSlots() chan struct{} {
	if r.aheadWaiting.Load() > 0 {
		return nil
	}
	return r.slots
}

// holding reports whether the message holds a handler slot, which its handler needs.
func (s *slotHolder) holding() bool { return s.state == holdsHandler }

// reacquire takes a handler slot (again) before a handler runs, waiting for one if none is free; false
// if ctx has ended or the lock is over, before or while it waits (the message then holds no handler
// slot until done). A message received ahead gives its prefetch place back once it has the slot, so
// the receive loop can fetch the next. waited reports whether it had to wait: a free slot is taken
// without a select on the lock, ctx and the shutdown, which costs a lock's Done channel and the
// runtime's select set-up.
func (s *slotHolder) reacquire(ctx context.Context, lock doner) (ok, waited bool) {
	if s.state == holdsHandler {
		return true, false
	}
	if s.state == holdsSettling {
		s.r.settling.Add(-1) // waiting for a handler slot while holding a settling one could close a cycle
		s.state = holdsNothing
	}
	var stopping chan struct{} // nil (never ready) unless the message was received ahead
	if s.state == holdsPrefetch {
		// Say that a message waits for a slot: the receive loops leave freed slots to it. It does not
		// count in r.waiting: a receive that yields its slots to it (see receive) holds none.
		if !s.ahead {
			s.ahead = true
			s.r.aheadWaiting.Add(1)
		}
		defer s.stopWaiting()
		stopping = s.r.stopping
	}
	select {
	case <-stopping:
		return false, false
	default:
	}
	if ctx.Err() != nil || lock.ended() {
		return false, false
	}
	select {
	case s.r.slots <- struct{}{}:
		s.tookSlot()
		return true, false
	default:
	}
	select {
	case <-stopping:
	case s.r.slots <- struct{}{}:
		s.tookSlot()
		return true, true
	case <-ctx.Done():
	case <-lock.Done():
	}
	return false, true
}

// tookSlot records that reacquire took a handler slot; a message received ahead gives its place back.
func (s *slotHolder) tookSlot() {
	if s.state == holdsPrefetch {
		s.stopWaiting() // before the place frees: a receive loop woken by it must see the count
		<-s.r.prefetch
		s.r.placeFreed()
	}
	s.state = holdsHandler
}

// stopWaiting ends the message's count as one received ahead and waiting for a slot.
func (s *slotHolder) stopWaiting() {
	if s.ahead {
		s.ahead = false
		if s.r.aheadWaiting.Add(-1) == 0 {
			s.r.placeFreed() // a gathering ends when no message received ahead waits
		}
	}
}

// done gives back whatever slot is held.
func (s *slotHolder) done() {
	switch s.state {
	case holdsHandler:
		<-s.r.slots
	case holdsSettling:
		s.r.settling.Add(-1)
	case holdsPrefetch:
		s.stopWaiting()
		<-s.r.prefetch
		s.r.placeFreed()
	}
	s.stopWaiting()
	s.state = holdsNothing
}

// retire closes a broken connection once the handlers still using it have finished, in a goroutine
// that Run waits for.
func (r *run) retire(ctx context.Context, live *liveConnection) {
	r.workers.Add(1)
	go func() {
		defer r.workers.Done()
		live.inFlight.Wait()
		r.close(ctx, live)
	}()
}

// close closes live once.
func (r *run) close(ctx context.Context, live *liveConnection) {
	live.once.Do(func() {
		r.c.closeConnection(ctx, live.conn)
		r.mu.Lock()
		for i, l := range r.conns {
			if l == live {
				r.conns = append(r.conns[:i], r.conns[i+1:]...)
				break
			}
		}
		r.mu.Unlock()
	})
}

// closeAll closes every connection not closed yet.
func (r *run) closeAll(ctx context.Context) {
	r.mu.Lock()
	conns := append([]*liveConnection(nil), r.conns...)
	r.mu.Unlock()
	for _, l := range conns {
		r.close(ctx, l)
	}
}

// closeConnection closes conn, bounded by the settle timeout even after ctx ended.
func (c *Consumer) closeConnection(ctx context.Context, conn *Connection) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.settleTimeout)
	defer cancel()
	if err := conn.close(cctx); err != nil {
		c.cfg.logger.Debug("closing the connection failed", errAttr(err))
	}
}

// count folds one processing result into the counters.
func (c *Consumer) count(res Result) {
	switch res.Outcome {
	case OutcomeCompleted:
		c.completed.Add(1)
	case OutcomeRetryScheduled:
		c.retries.Add(1)
	case OutcomeDeadLettered:
		c.deadLettered.Add(1)
	case OutcomeLeftForRedelivery:
		c.left.Add(1)
	}
	if res.PossibleDuplicate {
		c.duplicates.Add(1)
	}
	c.inFlight.Add(-1)
	if res.Outcome == OutcomeLeftForRedelivery && res.SettleErr != nil && res.RetryMessageID != "" && !res.PossibleDuplicate &&
		!errors.Is(res.SettleErr, ErrLockLost) && !errors.Is(res.SettleErr, context.Canceled) && !errors.Is(res.SettleErr, ErrShutdownTimeout) {
		// The republish itself failed: an operator must see why (a missing Send right, a quota).
		c.recordFailure(func(h *Health) { h.SendFailures++ }, res.SettleErr)
	}
}

// update applies f to the health snapshot under the consumer's lock.
func (c *Consumer) update(f func(*Health)) {
	c.mu.Lock()
	f(&c.health)
	c.mu.Unlock()
}

// recordFailure counts a failure with f and keeps its redacted text for Health.LastError, so that a
// readiness probe can say why the consumer is not ready without leaking a key.
func (c *Consumer) recordFailure(f func(*Health), err error) {
	now := c.cfg.clock.Now()
	c.update(func(h *Health) {
		f(h)
		h.LastError = redact.String(err.Error())
		h.LastErrorTime = now
	})
}

// setState moves to s and runs the state hook outside the health lock. A draining consumer moves
// only to stopped: a reconnect that was under way as Run's context ended does not make it ready again.
func (c *Consumer) setState(s State, err error) {
	c.stateMu.Lock()
	defer c.stateMu.Unlock()
	now := c.cfg.clock.Now()
	c.mu.Lock()
	from := c.health.State
	if from == s || (from == StateDraining && s != StateStopped) {
		c.mu.Unlock()
		return
	}
	c.health.State = s
	c.health.Since = now
	c.mu.Unlock()
	c.cfg.logger.Info("consumer state changed", slog.String("from", from.String()), slog.String("to", s.String()))
	if hook := c.cfg.hooks.OnStateChange; hook != nil {
		hook(StateChangeParams{From: from, To: s, Err: err})
	}
}

var errNilConnection = errors.New("retry: connector returned no connection")
