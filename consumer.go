package retry

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
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
	r.workers = workers{deliver: r.deliver, work: make(chan job),
		maxIdle: int32(c.cfg.maxConcurrency + c.cfg.prefetch + extraSettleSlots)}
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
	clk := c.cfg.clock
	logDrain(c.cfg, clk.Now(), int(r.busy.Load()))
	select {
	case <-drained:
	case <-clk.After(c.cfg.shutdownGrace):
		c.cfg.logger.Warn("shutdown grace elapsed; cancelling in-flight handlers", slog.Int("running", int(r.busy.Load())), slog.Duration("settle_timeout", c.cfg.settleTimeout))
		cancelHandlers(ErrShutdown)
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
		abandon(ErrShutdownTimeout) // ends every lock
		c.proc.renewals.abandon()   // and the broker calls in flight, which do not derive from settleBase
	}
	r.closeAll(ctx)
	if !stopDrain() {
		<-drainEntered // stopped comes after draining, never before
	}
	c.setState(StateStopped, loopErr)
	return errors.Join(loopErr, err)
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
	workers                workers
	retiring               sync.WaitGroup // connections waiting for their last handler to close
	busy                   atomic.Int64   // messages received and not yet finished

	mu    sync.Mutex
	conns []*liveConnection // every connection not yet closed
}
