package retry

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

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
	// StateReconnecting: a receive failed; the reconnect tries (5 s, 10 s, 15 s by default) are running.
	StateReconnecting
	// StateWatchdog: every reconnect try failed; the watchdog retries every WatchdogInterval.
	StateWatchdog
	// StateStopped: Run has returned.
	StateStopped
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
	}
	return "unknown"
}

// Health is a snapshot of the consumer for readiness and liveness probes.
type Health struct {
	State State
	// Since is when the consumer entered State.
	Since time.Time
	// LastError is the latest connect or receive failure (redacted), empty if none.
	LastError string
	// LastErrorTime is when LastError happened.
	LastErrorTime time.Time
	// InFlight is the number of handlers running now.
	InFlight int
	// Counters since the consumer was created.
	Received, Completed, RetriesScheduled, DeadLettered, LeftForRedelivery, PossibleDuplicates uint64
	// Connects counts successful connector calls; ConnectFailures and ReceiveFailures count failures.
	Connects, ConnectFailures, ReceiveFailures uint64
}

// Ready reports whether the consumer is connected and receiving.
func (h Health) Ready() bool { return h.State == StateRunning }

// Consumer receives messages, runs the handler through a [Processor] with at most MaxConcurrency
// handlers at once, and recovers from connection loss by rebuilding the connection from scratch.
// Create it with [NewConsumer]; the zero value is not usable. Its methods are safe for concurrent use;
// Run may be called again after it returns.
type Consumer struct {
	connect Connector
	handler Handler
	cfg     *config
	running atomic.Bool

	mu     sync.Mutex
	health Health
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
	c.health.Since = cfg.clock.Now()
	return c, nil
}

// Health returns a snapshot of the consumer's state and counters.
func (c *Consumer) Health() Health {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.health
}

// Run receives and processes messages until ctx ends. It then stops receiving, gives in-flight handlers
// ShutdownGrace to finish (after which their contexts are cancelled), waits for every goroutine it
// started, closes the connection and returns nil. It returns [ErrAlreadyRunning] if another Run is
// active. Connection failures never end Run: they are retried (see [State]).
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer c.running.Store(false)

	// Handlers outlive ctx by the shutdown grace, so they get a context of their own.
	handlerCtx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()

	var workers sync.WaitGroup
	sem := make(chan struct{}, c.cfg.maxConcurrency)
	conn := c.loop(ctx, handlerCtx, &workers, sem)

	// Shutdown: receiving has stopped. Handlers still running get the grace period with a live context;
	// a timer goroutine cancels them when it ends, unless they drain first. Only then is the connection
	// closed, so that their settles can still go through it.
	graceDone := make(chan struct{})
	drained := make(chan struct{})
	go func() {
		defer close(graceDone)
		select {
		case <-c.cfg.clock.After(c.cfg.shutdownGrace):
			c.cfg.logger.Warn("shutdown grace elapsed; cancelling in-flight handlers")
			cancelHandlers()
		case <-drained:
		}
	}()
	workers.Wait()
	close(drained)
	<-graceDone
	if conn != nil {
		c.closeConnection(ctx, conn.conn)
	}
	c.setState(StateStopped, nil)
	return nil
}

// liveConnection is a Connection with its processor and the handlers still using it.
type liveConnection struct {
	conn      *Connection
	processor *Processor
	inFlight  sync.WaitGroup
}

// loop is the receive loop. It returns the connection in use when ctx ends (nil if none).
func (c *Consumer) loop(ctx, handlerCtx context.Context, workers *sync.WaitGroup, sem chan struct{}) *liveConnection {
	var (
		live     *liveConnection
		failures int
		cause    error // the failure that broke the last connection, for the state hook
	)
	c.setState(StateConnecting, nil)
	for {
		if live == nil {
			conn := c.reconnect(ctx, &failures, cause)
			if conn == nil {
				return nil
			}
			live = &liveConnection{conn: conn, processor: newProcessor(conn.Sender, c.handler, c.cfg)}
			c.setState(StateRunning, nil)
		}
		// Take one free slot (waiting if needed), then any others free now, and ask for that many.
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return live
		}
		slots := 1
	fill:
		for slots < c.cfg.batchSize {
			select {
			case sem <- struct{}{}:
				slots++
			default:
				break fill
			}
		}
		msgs, err := live.conn.Receiver.ReceiveMessages(ctx, slots, nil)
		// Give back the slots the receive did not fill; the filled ones are released by their handlers.
		for i := len(msgs); i < slots; i++ {
			<-sem
		}
		if err != nil {
			if ctx.Err() != nil {
				return live
			}
			failures++
			cause = redact.Wrap(err)
			c.recordFailure(func(h *Health) { h.ReceiveFailures++ }, err)
			c.cfg.logger.Warn("receive failed; rebuilding the connection", errAttr(err), slog.Int("failures", failures))
			c.retire(ctx, workers, live)
			live = nil
			continue
		}
		failures = 0    // a receive worked: the next failure starts the reconnect schedule over
		current := live // the goroutines keep this connection even after live moves on
		for i, msg := range msgs {
			if i >= slots {
				// A receiver returned more than asked for: still never exceed MaxConcurrency.
				sem <- struct{}{}
			}
			c.update(func(h *Health) { h.Received++; h.InFlight++ })
			workers.Add(1)
			current.inFlight.Add(1)
			go func() {
				defer workers.Done()
				defer current.inFlight.Done()
				defer func() { <-sem }()
				res := current.processor.Process(handlerCtx, current.conn.Receiver, msg)
				c.count(res)
			}()
		}
	}
}

// retire closes a broken connection once the handlers still using it have finished, in a goroutine
// that Run waits for.
func (c *Consumer) retire(ctx context.Context, workers *sync.WaitGroup, live *liveConnection) {
	workers.Add(1)
	go func() {
		defer workers.Done()
		live.inFlight.Wait()
		c.closeConnection(ctx, live.conn)
	}()
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
	c.update(func(h *Health) {
		h.InFlight--
		switch res.Outcome {
		case OutcomeCompleted:
			h.Completed++
		case OutcomeRetryScheduled:
			h.RetriesScheduled++
		case OutcomeDeadLettered:
			h.DeadLettered++
		case OutcomeLeftForRedelivery:
			h.LeftForRedelivery++
		}
		if res.PossibleDuplicate {
			h.PossibleDuplicates++
		}
	})
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

// setState moves to s and runs the state hook outside the lock.
func (c *Consumer) setState(s State, err error) {
	now := c.cfg.clock.Now()
	c.mu.Lock()
	from := c.health.State
	if from == s {
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
