package retry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/go-amqp"

	"github.com/sbretry/retry/internal/redact"
)

// The session consumer, file by file: session.go (this file: the options, the consumer, its Run and
// connection loop), sessionconnector.go (the connections and the built-in connectors), sessionloop.go
// (one worker: accept a session, receive its messages one at a time, release it when idle),
// sessionhold.go (one message in stages: dispatch, resume, the handler, holds in place, the decision;
// sessionoutage.go, the outage breaker's part in them),
// sessiondurable.go (the session's record: durable holds and blocks), sessionserved.go (the served
// session and its settle calls), sessionlock.go (the session lock, kept by lockrenewer.go's keeper, as
// message locks are, while the session is held).

// Defaults for [SessionOptions]. Each applies when its field is zero.
const (
	defaultMaxConcurrentSessions = 8
	defaultSessionIdleTimeout    = 10 * time.Second
	defaultMaxHold               = 5 * time.Minute
)

// SessionOptions configures what is particular to [NewSessionConsumer]. A nil *SessionOptions means all
// defaults; the zero value of every field means its documented default, and negative values are
// invalid.
type SessionOptions struct {
	// MaxConcurrentSessions is the most sessions held at once; each runs one handler at a time, so it is
	// also the most handlers running at once. Zero means 8.
	MaxConcurrentSessions int
	// SessionIdleTimeout is how long a held session may go without a message before it is closed and the
	// next available session accepted. It applies while a worker is free to accept: when every worker
	// serves a session (or did within the last second), one that has delivered and then goes 20 ms
	// without a message is released at once, so that quiet sessions never keep a waiting one from a
	// worker (it is accepted again on its next message).
	// Keeping a dry session while a worker is free saves an accept for its next message. It must leave
	// the broker time to deliver: below its round trip a session is released before its message
	// arrives. Zero means 10 s; the .NET SDK's session processor keeps an
	// idle session for its TryTimeout (60 s by default), with nothing that releases it sooner when
	// others wait, which is why ours can be shorter without churn.
	SessionIdleTimeout time.Duration
	// MaxHold is the longest one message may hold its session with retries in place, counted from its
	// first failure: a retry that would be due later is not waited for, and the message is dead-lettered
	// with DeadLetterReasons.SessionHoldExceeded (the session then goes on with its next message). Zero
	// means 5 min. With the default Backoff (Fibonacci, 10 s floor) that is about
	// six attempts.
	MaxHold time.Duration
	// DurableHolds makes a retry that cannot wait in place (due after MaxHold) a durable hold instead
	// of a dead-letter: the message is deferred in its session, what blocks the session is recorded in
	// the session state, and a wake-up message is scheduled into the session for when the retry is due;
	// the session is released meanwhile, and messages of it that arrive are deferred behind the held
	// one, in order. The hold survives the consumer: whichever consumer accepts the session next
	// resumes it, in order. It needs a connection with a Sender (the queue connectors have one). A
	// MaxHold of 1 ns makes every delayed retry durable.
	DurableHolds bool
	// BlockAfterDeadLetter keeps a session blocked after one of its messages is dead-lettered (after
	// its last attempt, a Permanent error, a dead-letter policy): its later messages are deferred, in
	// order, until an operator releases the session (sbretry sessions release, or [github.com/sbretry/retry/sessionstate.PlanRelease]).
	// False (the default) lets the session go on with its next message.
	BlockAfterDeadLetter bool
}

// sessionConfig is SessionOptions with the defaults applied.
type sessionConfig struct {
	maxSessions int
	idle        time.Duration
	maxHold     time.Duration
	durable     bool
	block       bool
}

// resolve validates o and applies the defaults.
func (o *SessionOptions) resolve() (sessionConfig, error) {
	var so SessionOptions
	if o != nil {
		so = *o
	}
	switch {
	case so.MaxConcurrentSessions < 0:
		return sessionConfig{}, &OptionError{Field: "MaxConcurrentSessions", Reason: "must not be negative"}
	case so.SessionIdleTimeout < 0:
		return sessionConfig{}, &OptionError{Field: "SessionIdleTimeout", Reason: "must not be negative"}
	case so.MaxHold < 0:
		return sessionConfig{}, &OptionError{Field: "MaxHold", Reason: "must not be negative"}
	}
	return sessionConfig{
		maxSessions: orInt(so.MaxConcurrentSessions, defaultMaxConcurrentSessions),
		idle:        orDur(so.SessionIdleTimeout, defaultSessionIdleTimeout),
		maxHold:     orDur(so.MaxHold, defaultMaxHold),
		durable:     so.DurableHolds,
		block:       so.BlockAfterDeadLetter,
	}, nil
}

// refuseForSessions reports the first [Options] field set that a session consumer cannot honour. They
// are refused rather than ignored, so that a configuration copied from a queue consumer does not
// silently mean something else.
func refuseForSessions(o *Options) error {
	if o == nil {
		return nil
	}
	switch {
	case o.MaxConcurrency != 0:
		return &OptionError{Field: "MaxConcurrency", Reason: "not used by a session consumer: set SessionOptions.MaxConcurrentSessions (one handler per session)"}
	case o.ReceiveBatchSize != 0:
		return &OptionError{Field: "ReceiveBatchSize", Reason: "not used by a session consumer: each session is received one message at a time"}
	case o.Prefetch != 0:
		return &OptionError{Field: "Prefetch", Reason: "not used by a session consumer: each session is received one message at a time"}
	case o.DisableLockRenewal:
		return &OptionError{Field: "DisableLockRenewal", Reason: "a session consumer must renew its session locks to hold a session in place"}
	}
	return nil
}

// SessionConsumer consumes a session-enabled queue or subscription: it holds up to
// MaxConcurrentSessions sessions at once and runs the handler on each session's messages strictly one
// at a time, in order. A failed attempt holds its session in place: no later message of that session
// runs while the attempt waits out its backoff (on the Clock) and is retried in this process, with
// the session lock renewed meanwhile; other sessions go on. Nothing is scheduled, so the order holds;
// the price is that a held session occupies one of the MaxConcurrentSessions, and that the wait is in
// memory: a consumer that stops during a hold gives the message back to its session (in order, its
// attempt not counted) and the next consumer starts its attempts again. With
// SessionOptions.DurableHolds a retry due after MaxHold is held in the session itself instead
// (sessiondurable.go): deferred, recorded in the session state, woken by a scheduled message, and
// resumed in order by whichever consumer takes the session next.
//
// Of the [Options], MaxAttempts, Backoff, ImmediateRetries and ImmediateDelay (the first retries of a
// hold wait ImmediateDelay instead of the backoff), Policies, RetryBudget, IgnoreExpiry, SettleTimeout,
// LockDuration and LockRenewInterval (of the session lock), IdempotencyKey, ErrorText, Logger, the
// Hooks OnStart, OnSettle, OnProcessed and OnStateChange, ReconnectDelays, WatchdogInterval,
// ShutdownGrace, DeadLetterReasons, DescriptionLimit, RetryStartupErrors and Clock apply as to a
// [Consumer]; EntityPath is taken from the connection. Outage (and Hooks.OnOutage) apply with the
// queue consumer's breaker and rules, holding in place instead of making a held copy: while the breaker
// is open no session is accepted and the message in hand waits in its session, its attempt not spent,
// until the breaker lets it run (as the probe, or once closed); [SessionConsumer.Pause] holds it the
// same way. MaxConcurrency, ReceiveBatchSize, Prefetch and DisableLockRenewal are refused;
// MaxMessageSize, OnRetryCopy and AllowReorder have no effect, since no retry copy is made.
//
// Create it with [NewSessionConsumer]; the zero value's Run returns [ErrNotConfigured]. Its methods are
// safe for concurrent use; Run may be called again after it returns.
type SessionConsumer struct {
	connect SessionConnector
	cfg     *config
	scfg    sessionConfig
	// proc decodes envelopes, picks policies, builds dead-letter decisions and runs the hooks, as for
	// the queue consumer; its receive and settle paths are not used.
	proc *Processor
	// stats keeps the health, the counters and the state hook (health.go), shared with the queue
	// consumer; its own Run is never called.
	stats   *Consumer
	running atomic.Bool
}

// NewSessionConsumer returns a SessionConsumer that gets its connections from connect and passes each
// message to handler. nil opts and nil sopts mean defaults; invalid options, and Options fields that a
// session consumer cannot honour (see [SessionConsumer]), return an error wrapping
// [ErrInvalidOptions].
func NewSessionConsumer(connect SessionConnector, handler Handler, opts *Options, sopts *SessionOptions) (*SessionConsumer, error) {
	if connect == nil {
		return nil, &OptionError{Field: "connect", Reason: "must not be nil"}
	}
	if handler == nil {
		return nil, &OptionError{Field: "handler", Reason: "must not be nil"}
	}
	if err := refuseForSessions(opts); err != nil {
		return nil, err
	}
	cfg, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	scfg, err := sopts.resolve()
	if err != nil {
		return nil, err
	}
	// The breaker is the queue consumer's: Pause, Resume and Options.Outage (sessionoutage.go admitInPlace).
	sc := &SessionConsumer{connect: connect, cfg: cfg, scfg: scfg, proc: newProcessor(nil, handler, cfg), stats: &Consumer{cfg: cfg, outage: newBreaker(cfg)}}
	sc.stats.health.Since = cfg.clock.Now()
	return sc, nil
}

// Health returns a snapshot of the consumer's state and counters, as [Consumer.Health] does.
// RetriesScheduled and Held stay zero: no copy is scheduled. PossibleDuplicates counts settles the SDK
// retried, which may not have taken (the session was released so that the message, if still there,
// runs again first); Deferred counts the messages deferred by durable holds and behind them.
func (sc *SessionConsumer) Health() Health {
	if sc == nil || sc.stats == nil {
		return Health{}
	}
	return sc.stats.Health()
}

// Pause stops the session consumer taking sessions, until [SessionConsumer.Resume]: a kill switch for
// an operator or a deployment, as [Consumer.Pause] is for a queue. No session is accepted while
// paused; a session in hand is released once its current message is settled (handlers running
// finish), so that its messages wait in the broker, in order, with no attempt spent. reason
// (redacted, truncated) shows in [Health].Outage and the OnOutage hook. It works before Run and across
// Runs; pausing a paused consumer only changes the reason. [ControlHandler] serves it over HTTP.
func (sc *SessionConsumer) Pause(reason string) {
	if sc == nil || sc.stats == nil {
		return
	}
	sc.stats.Pause(reason)
}

// Resume ends a pause: the workers accept sessions again at once. Resuming a consumer that is not
// paused does nothing.
func (sc *SessionConsumer) Resume() {
	if sc == nil || sc.stats == nil {
		return
	}
	sc.stats.Resume()
}

// sessionIDKey is the context key of the handler's session id.
type sessionIDKey struct{}

// SessionIDFromContext returns the id of the session whose message the handler that received ctx is
// handling, for handlers run by a [SessionConsumer].
func SessionIDFromContext(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(sessionIDKey{}).(string)
	return id, ok
}

// Run holds sessions and processes their messages until ctx ends. It then reports [StateDraining],
// accepts and receives nothing more, abandons the holds in progress (their messages go back to their
// sessions unsettled, in order, no attempt counted), gives the handlers running ShutdownGrace to finish
// (then cancels their contexts) and one SettleTimeout more to return and settle, closes the sessions
// and the connection and returns nil. If handlers are still running then, it settles nothing more and
// returns a [*ShutdownError]; those goroutines end whenever their handlers return.
//
// Run returns [ErrAlreadyRunning] if another Run is active. An accept that fails other than by timing
// out breaks the connection: it is closed and rebuilt on the ReconnectDelays schedule. Only the first
// contact with the broker (a connect, or, since the SDK connects lazily, the accepts before one got
// an answer) may end Run: an entity missing ([ErrEntityNotFound]), a credential unauthorized
// ([ErrUnauthorized]) or an entity that is not session-enabled returns an error, unless
// Options.RetryStartupErrors is set.
func (sc *SessionConsumer) Run(ctx context.Context) error {
	if sc == nil || sc.cfg == nil || sc.connect == nil {
		return ErrNotConfigured
	}
	if !sc.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer sc.running.Store(false)
	c := sc.stats

	// As in Consumer.Run: handlers outlive ctx by the grace; session locks and settles end only when
	// the shutdown gives up.
	handlerBase, cancelHandlers := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelHandlers(nil)
	settleBase, abandon := context.WithCancelCause(context.WithoutCancel(ctx))
	defer abandon(nil)
	r := &sessionRun{sc: sc, handlerBase: handlerBase, settleBase: settleBase, sessions: make(chan struct{}, sc.scfg.maxSessions)}

	drainEntered := c.drainingWhenDone(ctx)
	loopErr := r.loop(ctx)
	if ctx.Err() != nil {
		// The AfterFunc may not have run yet; the state must pass through draining all the same.
		c.setState(StateDraining, nil)
	}

	drained := make(chan struct{})
	go func() {
		r.workers.Wait()
		close(drained)
	}()
	var err error
	if !drain(sc.cfg, drained, func() int { return int(c.inFlight.Load()) }, cancelHandlers) {
		if n := int(c.inFlight.Load()); n > 0 {
			err = &ShutdownError{Running: n}
			sc.cfg.logger.Error("shutdown timed out; closing the connection with handlers still running", slog.Int("running", n))
		} else {
			// Every message was settled; what is left is a receiver's close that did not return.
			sc.cfg.logger.Warn("shutdown timed out closing sessions; closing the connection")
		}
		abandon(ErrShutdownTimeout) // ends every session lock
		sc.proc.renewals.abandon()  // and the settles in flight, which do not derive from settleBase
	}
	// The sessions were closed by their workers (or are given up with the client); only the clients are
	// left.
	r.mu.Lock()
	conns := r.conns
	r.conns = nil
	r.mu.Unlock()
	for _, live := range conns {
		r.closeConnection(ctx, live)
	}
	drainEntered()
	c.setState(StateStopped, loopErr)
	return errors.Join(loopErr, err)
}

// sessionRun is the state of one Run call.
type sessionRun struct {
	sc *SessionConsumer
	// handlerBase is what handler contexts derive from (it outlives Run's context by the grace);
	// settleBase is what session locks, renewals and settles derive from.
	handlerBase, settleBase context.Context
	// workers counts every goroutine of the run, so that Run returns only after they have exited.
	workers sync.WaitGroup
	// sessions holds one token per session held, MaxConcurrentSessions in all, shared by every
	// connection: the workers of a broken connection that still finish a message keep theirs, so a new
	// connection's workers never make the run hold more.
	sessions chan struct{}
	// serving counts the workers serving a session now (not accepting one), to tell when a session
	// waiting for a worker has none free (sessionloop.go, receiveNext).
	serving atomic.Int32
	// allBusy tells the receives of dry sessions when serving reaches MaxConcurrentSessions, and
	// lastAllBusy is when it last did (Unix nanoseconds on the Clock; 0: never).
	allBusy     busySignal
	lastAllBusy atomic.Int64
	// served keeps two workers from serving one session at once (sessionloop.go).
	served sessionsServed
	// conns lists every connection not yet closed, for Run to close what is left when it ends.
	mu    sync.Mutex
	conns []*liveSessionConnection
}

// liveSessionConnection is a SessionConnection with its workers.
type liveSessionConnection struct {
	conn    *SessionConnection
	workers sync.WaitGroup
	// proven: an accept on it succeeded or timed out, so the broker answered.
	proven atomic.Bool
	once   sync.Once
}

// startWorkers starts the workers of one connection: each accepts and serves one session at a time until
// ctx ends or it finds the connection broken, which it reports on the returned channel.
func (r *sessionRun) startWorkers(ctx context.Context, live *liveSessionConnection) <-chan error {
	n := r.sc.scfg.maxSessions
	broken := make(chan error, n)
	for range n {
		r.workers.Add(1)
		live.workers.Add(1)
		go func() {
			defer r.workers.Done()
			defer live.workers.Done()
			if err := r.sessionWorker(ctx, live); err != nil {
				broken <- err
			}
		}()
	}
	return broken
}

// loop connects, runs MaxConcurrentSessions workers on the connection, and rebuilds the connection when
// one finds it broken. It returns when ctx ends (nil), leaving the workers to drain, or when the first
// connect fails in a way retrying cannot fix.
func (r *sessionRun) loop(ctx context.Context) error {
	sc, c := r.sc, r.sc.stats
	var (
		failures  int
		cause     error
		connected bool
		// answered: an accept of this Run got an answer from the broker. Until then an accept's
		// error may be one retrying cannot fix: the SDK connects lazily, so the first accept is the
		// first contact.
		answered bool
	)
	c.setState(StateConnecting, nil)
	for {
		conn, err := sc.reconnect(ctx, &failures, cause, !connected)
		if err != nil || conn == nil {
			return err
		}
		connected = true
		if sc.scfg.durable && conn.Sender == nil {
			if conn.Close != nil {
				_ = conn.Close(context.WithoutCancel(ctx))
			}
			return errNoWakeSender
		}
		live := &liveSessionConnection{conn: conn}
		r.mu.Lock()
		r.conns = append(r.conns, live)
		r.mu.Unlock()
		// Running once the broker has answered an accept on it (see sessionWorker): the SDK connects
		// lazily, so a client built against a dead namespace proves nothing.

		// wctx ends the connection's workers when one finds it broken, or when ctx ends.
		wctx, stop := context.WithCancel(ctx)
		broken := r.startWorkers(wctx, live)
		var why error
		select {
		case <-ctx.Done():
			// Shutdown: Run waits for the workers, within the grace, and closes the connection.
			stop()
			return nil
		case why = <-broken:
		}
		stop() // the other workers finish their session's current message and stop
		// As for the queue consumer: the failure count is reset only by a connection that worked, so
		// that one that connects and breaks at once walks the reconnect schedule instead of looping.
		if live.proven.Load() {
			failures, answered = 0, true
		}
		if fatal := sessionStartupError(why); fatal != nil && !answered && !sc.cfg.retryStartup {
			c.recordFailure(func(h *Health) { h.ConnectFailures++ }, why)
			sc.cfg.logger.Error("first accept failed in a way retrying cannot fix", errAttr(why))
			live.workers.Wait() // no session was accepted on it: its workers stop at once
			r.closeConnection(ctx, live)
			return fatal
		}
		failures++
		cause = redact.Wrap(why)
		c.recordFailure(func(h *Health) { h.ReceiveFailures++ }, why)
		sc.cfg.logger.Warn("session connection broken; rebuilding it", errAttr(why), slog.Int("failures", failures))
		c.setState(StateReconnecting, why)
		// A handler still running on the broken connection must not hold up the others: the connection
		// is closed once its workers are done, in the background, and a new one is built now.
		r.workers.Add(1)
		go func() {
			defer r.workers.Done()
			live.workers.Wait()
			r.closeConnection(ctx, live)
		}()
	}
}

// errNoWakeSender ends Run when durable holds are on and the connection cannot schedule wake-ups.
var errNoWakeSender = &OptionError{Field: "DurableHolds", Reason: "the session connection has no Sender to schedule wake-ups with (the subscription connectors have none yet)"}

// sessionStartupError classifies an accept failure that retrying cannot fix: what startupError says
// of a connect (a missing entity, a refused credential), and an entity that refuses a session
// receiver because it does not require sessions (amqp:not-allowed). It returns nil for anything else.
func sessionStartupError(err error) error {
	if fatal := startupError(err); fatal != nil {
		return fatal
	}
	if isAMQPCondition(err, amqp.ErrCondNotAllowed) {
		return fmt.Errorf("retry: the entity refused a session receiver (is it session-enabled?): %w", err)
	}
	return nil
}

// reconnect builds a fresh connection on the reconnect-then-watchdog schedule (watchdog.go), the queue
// consumer's. On the first connect of a Run (first), a missing entity or a refused credential is
// returned as an error unless Options.RetryStartupErrors is set. It returns (nil, nil) when ctx ends.
func (sc *SessionConsumer) reconnect(ctx context.Context, failures *int, cause error, first bool) (*SessionConnection, error) {
	return redial(ctx, sc.stats, failures, cause, sc.dial, func(err error) error {
		if fatal := startupError(err); first && fatal != nil && !sc.cfg.retryStartup {
			sc.cfg.logger.Error("first connect failed in a way retrying cannot fix", errAttr(err))
			return fatal
		}
		return nil
	})
}

// dial calls the connector, bounded by connectTimeout (or the settle timeout if shorter).
func (sc *SessionConsumer) dial(ctx context.Context) (*SessionConnection, error) {
	return callConnector(ctx, sc.cfg, sc.connect, func(cctx context.Context, conn *SessionConnection) (*SessionConnection, error) {
		if conn == nil || conn.AcceptNext == nil {
			if conn != nil && conn.Close != nil {
				_ = conn.Close(cctx)
			}
			return nil, errNilConnection
		}
		return conn, nil
	})
}

// closeConnection closes live once, bounded by the settle timeout even after ctx ended.
func (r *sessionRun) closeConnection(ctx context.Context, live *liveSessionConnection) {
	r.mu.Lock()
	for i, l := range r.conns {
		if l == live {
			r.conns = append(r.conns[:i], r.conns[i+1:]...)
			break
		}
	}
	r.mu.Unlock()
	live.once.Do(func() {
		if live.conn.Close == nil {
			return
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.sc.cfg.settleTimeout)
		defer cancel()
		if err := live.conn.Close(cctx); err != nil {
			r.sc.cfg.logger.Debug("closing the session connection failed", errAttr(err))
		}
	})
}

// A SessionConsumer reports its health as a [Consumer] does, for the probe handlers.
var _ HealthReporter = (*SessionConsumer)(nil)
