package retry

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/sbretry/retry/internal/redact"
)

// Consumer receives messages, runs the handler through a [Processor] with at most MaxConcurrency
// handlers at once, and recovers from connection loss by rebuilding the connection from scratch.
// Create it with [NewConsumer]; the zero value's Run returns [ErrNotConfigured]. Its methods are safe for
// concurrent use; Run may be called again after it returns.
type Consumer struct {
	connect Connector
	handler Handler
	cfg     *config
	proc    *Processor
	outage  *breaker // outage.go; shared with proc
	running atomic.Bool

	mu     sync.Mutex
	health Health // everything but the message counters, which are below (Health adds them)
	// stateMu serializes state changes with their hook calls, so that OnStateChange sees the changes in
	// the order they happened although the draining state is entered from ctx's AfterFunc.
	stateMu sync.Mutex

	// The per-message counters are atomics, so that counting costs the workers no shared lock.
	received, completed, retries, deadLettered, left, duplicates, held, discarded, deferred atomic.Uint64
	inFlight                                                                                atomic.Int64
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
	c.outage = newBreaker(cfg)
	c.proc.outage = c.outage
	c.health.Since = cfg.clock.Now()
	return c, nil
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
// Options.RetryStartupErrors is set; so does a first connect whose check the entity refuses with
// amqp:not-allowed (a receiver that holds no session, on an entity that requires sessions; a topic).
// A connection that receives from a session-enabled entity (a receiver with a SessionID method, or a
// settings check that finds RequiresSession) ends Run with an error wrapping [ErrSessionEntity] before
// anything is received, unless Options.AllowReorder is set.
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
	handlerCtx, cancelHandlers := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelHandlers(nil)
	settleBase, abandon := context.WithCancelCause(context.WithoutCancel(ctx))
	defer abandon(nil)

	r := &run{c: c, handlerCtx: handlerCtx, settleBase: settleBase, slots: newSlots(c.cfg)}
	r.workers = workers[job]{deliver: r.deliver, work: make(chan job),
		maxIdle: int32(c.cfg.maxConcurrency + c.cfg.prefetch + extraSettleSlots)}
	drainEntered := c.drainingWhenDone(ctx)
	loopErr := r.loop(ctx)
	if ctx.Err() != nil {
		// Done closes before the AfterFunc that reports draining runs, so Run may get here first; the
		// state must still pass through draining (setState skips it if the callback already set it).
		c.setState(StateDraining, nil)
	}
	close(r.slots.stopping) // messages received ahead and not started yet are left for redelivery
	r.workers.close()       // nothing is dispatched any more: idle workers exit, busy ones when done

	// Shutdown: receiving has stopped. Handlers still running get the grace period with a live context,
	// then one settle timeout after their cancellation. Only then are the connections closed, so that
	// their settles can still go through them.
	drained := make(chan struct{})
	go func() {
		r.workers.wait()
		r.retiring.Wait()
		close(drained)
	}()
	var err error
	if !drain(c.cfg, drained, func() int { return int(r.busy.Load()) }, cancelHandlers) {
		n := int(r.busy.Load())
		err = &ShutdownError{Running: n}
		c.cfg.logger.Error("shutdown timed out; closing the connection with handlers still running", slog.Int("running", n))
		abandon(ErrShutdownTimeout) // ends every lock
		c.proc.renewals.abandon()   // and the broker calls in flight, which do not derive from settleBase
	}
	r.closeAll(ctx)
	drainEntered() // stopped comes after draining, never before
	c.setState(StateStopped, loopErr)
	return errors.Join(loopErr, err)
}

// drainingWhenDone moves the consumer to draining the moment ctx ends: not ready, so that a readiness
// probe takes it out of rotation while its handlers finish, and still live until Run returns. The
// function it returns waits until that move is made (or cancels it if ctx never ended), so that
// stopped always comes after draining.
func (c *Consumer) drainingWhenDone(ctx context.Context) (wait func()) {
	entered := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(entered)
		c.setState(StateDraining, nil)
	})
	return func() {
		if !stop() {
			<-entered
		}
	}
}

// drain is the shutdown of both consumers once receiving has stopped: the messages in hand (inHand
// counts them) get the shutdown grace with live handler contexts, then their handlers are cancelled
// (cause [ErrShutdown]) and get one settle timeout more. It reports whether drained closed in time;
// the caller then gives up on what is left.
func drain(cfg *config, drained <-chan struct{}, inHand func() int, cancelHandlers context.CancelCauseFunc) bool {
	clk := cfg.clock
	logDrain(cfg, clk.Now(), inHand())
	grace, stopGrace := timerChan(clk, cfg.shutdownGrace)
	defer stopGrace()
	select {
	case <-drained:
		return true
	case <-grace:
	}
	cfg.logger.Warn("shutdown grace elapsed; cancelling in-flight handlers", slog.Int("running", inHand()), slog.Duration("settle_timeout", cfg.settleTimeout))
	cancelHandlers(ErrShutdown)
	last, stopLast := timerChan(clk, cfg.settleTimeout)
	defer stopLast()
	select {
	case <-drained:
		return true
	case <-last:
	}
	// Both may be ready at once, and select picks either: what finished in time did.
	select {
	case <-drained:
		return true
	default:
		return false
	}
}

// Pause stops the consumer receiving, as an open outage breaker does, until [Consumer.Resume]: a kill
// switch for an operator or a deployment. Messages already in hand are held for later without
// spending an attempt (see [OutcomeHeld]); handlers running finish. reason (redacted, truncated) shows in
// [Health].Outage and the OnOutage hook. It works with or without Options.Outage, before Run and across
// Runs; pausing a paused consumer only changes the reason.
func (c *Consumer) Pause(reason string) {
	if c == nil || c.outage == nil {
		return
	}
	c.outage.pause(reason)
}

// Resume ends a pause, whether [Consumer.Pause] or the outage breaker opened it: the consumer receives
// again at once. Resuming a consumer that is not paused does nothing.
func (c *Consumer) Resume() {
	if c == nil || c.outage == nil {
		return
	}
	c.outage.resume()
}

// run is the state of one Run call.
type run struct {
	c *Consumer
	// handlerCtx is what the handlers' contexts derive from: it outlives Run's context by the shutdown
	// grace. settleBase is what every lock, settle and renewal derives from: cancelled only when a
	// shutdown gives up, so that nothing is settled after Run returned.
	handlerCtx, settleBase context.Context
	slots                  *slots
	workers                workers[job]
	retiring               sync.WaitGroup // connections waiting for their last handler to close
	busy                   atomic.Int64   // messages received and not yet finished

	mu    sync.Mutex
	conns []*liveConnection // every connection not yet closed
}

// logDrain says, when a shutdown begins, what it waits for: how many messages are still in hand
// (handlers running, settles in flight) and until when their handlers keep a live context, so that
// the silence between "draining" and the end of the grace is explained.
func logDrain(cfg *config, now time.Time, inHand int) {
	if inHand == 0 {
		cfg.logger.Info("draining: no message in hand; closing")
		return
	}
	cfg.logger.Info("draining: waiting for the messages in hand to finish",
		slog.Int("in_hand", inHand), slog.Time("grace_until", now.Add(cfg.shutdownGrace)),
		slog.Duration("shutdown_grace", cfg.shutdownGrace))
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
	h.Held = c.held.Load()
	h.Discarded = c.discarded.Load()
	h.Deferred = c.deferred.Load()
	if c.outage != nil {
		h.Outage = c.outage.status()
	}
	return h
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
	case OutcomeHeld:
		c.held.Add(1)
	case OutcomeDiscarded:
		c.discarded.Add(1)
	case OutcomeDeferred:
		c.deferred.Add(1)
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

// A Consumer reports its health as a [SessionConsumer] does (session.go), for the probe handlers.
var _ HealthReporter = (*Consumer)(nil)

// liveConnection is a Connection with the handlers still using it.
type liveConnection struct {
	conn     *Connection
	inFlight sync.WaitGroup
	once     sync.Once
	proven   atomic.Bool // a source delivered a message, or stayed quiet and passed a probe
	shared   bool        // more than one source: they share the handler slots
}

// sources lists what live receives from: its Receiver, then [Connection.Sources].
func (live *liveConnection) sources(defaultEntity string) []Source {
	entity := live.conn.EntityPath
	if entity == "" {
		entity = defaultEntity
	}
	out := make([]Source, 0, 1+len(live.conn.Sources))
	out = append(out, Source{Receiver: live.conn.Receiver, EntityPath: entity})
	for _, s := range live.conn.Sources {
		if s.Receiver != nil {
			out = append(out, s)
		}
	}
	return out
}

// job is one received message on its way to a worker.
type job struct {
	live  *liveConnection
	rt    route
	msg   *azservicebus.ReceivedMessage
	place place
}

// deliver processes one message (process.go) and gives back its slot: what a worker does with a job.
func (r *run) deliver(j job) {
	res := r.c.proc.process(r.handlerCtx, r.settleBase, j.msg, j.rt, &j.place)
	j.place.done()
	r.c.count(res)
	j.live.inFlight.Done()
	r.busy.Add(-1)
}
