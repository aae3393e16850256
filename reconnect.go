package retry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/Azure/go-amqp"

	"github.com/sbretry/retry/internal/redact"
)

// The connection loop: connect, run one receive loop per source of the connection, and when one finds
// the connection broken, retire it and build a fresh one on the reconnect schedule (5 s, 10 s, 15 s by
// default, then a watchdog every WatchdogInterval). A broken connection is closed and never reused,
// because the SDK's recovery cannot always heal a client whose connection was lost.

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
			if err := r.checkSettings(ctx, conn); err != nil {
				c.recordFailure(func(h *Health) { h.ConnectFailures++ }, err)
				c.cfg.logger.Error("the entity requires sessions; not consuming it", errAttr(err))
				c.closeConnection(ctx, conn)
				return err
			}
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
		c.outage.setEntity(sources[0].EntityPath)
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

// checkSettings reads the entity's settings once and reports what weakens the crash contract. It
// returns an error only for an entity that requires sessions without Options.AllowReorder (wrapping
// [ErrSessionEntity]), which Run cannot consume.
func (r *run) checkSettings(ctx context.Context, conn *Connection) error {
	c := r.c
	sctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	entity := conn.EntityPath
	if entity == "" {
		entity = c.cfg.entityPath
	}
	entity = orUnnamed(entity)
	ws, err := conn.Settings(sctx, c.cfg.settleTimeout)
	if errors.Is(err, ErrSessionEntity) {
		if !c.cfg.allowReorder {
			return err
		}
		ws, err = append(ws, sessionSettingsWarning(entity)), nil
	}
	if err != nil && ctx.Err() != nil {
		return nil // Run is stopping: the check was cut short, not refused
	}
	if err != nil {
		// Unknown settings may be the weak ones: an operator must know the check did not run.
		text := redact.String(err.Error())
		c.cfg.logger.Warn("entity settings not checked: duplicate detection and MaxDeliveryCount are unknown",
			slog.String("entity", entity), slog.String("error", text))
		w := fmt.Sprintf("%s: settings not checked, so duplicate detection and MaxDeliveryCount are unknown: %s", entity, text)
		c.update(func(h *Health) { h.Warnings = []string{w} })
		return nil
	}
	for _, w := range ws {
		c.cfg.logger.Warn("entity settings weaken the crash contract", slog.String("entity", entity), slog.String("warning", w))
	}
	c.update(func(h *Health) { h.Warnings = append([]string(nil), ws...) })
	return nil
}

// reconnect builds a fresh connection on the reconnect-then-watchdog schedule (watchdog.go). On the
// first connect of a Run (first), a missing entity or a refused credential is returned as an error,
// since waiting cannot fix it, unless Options.RetryStartupErrors is set; a connection that receives
// from a session ends Run at any connect. It returns (nil, nil) when ctx ends.
func (c *Consumer) reconnect(ctx context.Context, failures *int, cause error, first bool) (*Connection, error) {
	return redial(ctx, c, failures, cause, c.dial, func(err error) error {
		if errors.Is(err, ErrSessionEntity) {
			// Configuration, not the environment: no retry, first connect or not, can fix it.
			c.cfg.logger.Error("the connection receives from a session; not consuming it", errAttr(err))
			return err
		}
		if fatal := queueStartupError(err); first && fatal != nil && !c.cfg.retryStartup {
			c.cfg.logger.Error("first connect failed in a way retrying cannot fix", errAttr(err))
			return fatal
		}
		return nil
	})
}

// queueStartupError is startupError for the queue consumer's connect, which also knows the refusal of
// a plain receiver by an entity that requires sessions: Service Bus refuses the link with
// amqp:not-allowed, which the SDK passes through as a go-amqp *amqp.Error (as sessionStartupError
// reads the opposite refusal), and the built-in connectors' check (a peek) meets it at once. A topic's
// name where a queue is expected is refused the same way, and the condition alone cannot tell them
// apart (explainRefusedReceiver asks the settings), so the error names both and wraps no sentinel.
func queueStartupError(err error) error {
	if fatal := startupError(err); fatal != nil {
		return fatal
	}
	if isAMQPCondition(err, amqp.ErrCondNotAllowed) {
		return fmt.Errorf("retry: the entity refused the receiver (amqp:not-allowed): a queue or subscription that requires sessions is consumed by NewSessionConsumer, a topic through its subscriptions (with ConnectOptions.CheckSettings the settings tell which, and a session entity's error wraps ErrSessionEntity): %w", err)
	}
	return nil
}

// explainRefusedReceiver turns the failed check of a first connection whose receiver the entity refused
// (amqp:not-allowed, see queueStartupError) into an error wrapping [ErrSessionEntity] when the
// connection's settings check says the entity requires sessions; otherwise it returns nil. Only the
// settings tell a session entity from another refusal, such as a topic's.
func (c *Consumer) explainRefusedReceiver(ctx context.Context, conn *Connection, checkErr error) error {
	if conn.Settings == nil || !isAMQPCondition(checkErr, amqp.ErrCondNotAllowed) {
		return nil
	}
	_, err := conn.Settings(ctx, c.cfg.settleTimeout)
	if !errors.Is(err, ErrSessionEntity) {
		return nil
	}
	return fmt.Errorf("%w; the connection's receiver holds no session, so only a Connector of your own whose receivers hold sessions can consume it with AllowReorder (the check: %w)", err, checkErr)
}

// dial calls the connector and its check, bounded by connectTimeout (or the settle timeout if shorter).
func (c *Consumer) dial(ctx context.Context) (*Connection, error) {
	return callConnector(ctx, c.cfg, c.connect, func(cctx context.Context, conn *Connection) (*Connection, error) {
		if conn == nil || conn.Receiver == nil || conn.Sender == nil {
			if conn != nil && conn.Close != nil {
				_ = conn.Close(cctx)
			}
			return nil, errNilConnection
		}
		// Before the check, which would touch the entity (a peek, a scheduled probe).
		if err := c.cfg.refuseSessionReceivers(conn, c.cfg.entityPath); err != nil {
			_ = conn.close(cctx)
			return nil, err
		}
		if conn.Check == nil {
			return conn, nil
		}
		err := conn.Check(cctx)
		if err == nil {
			return conn, nil
		}
		var warn *CheckWarning
		if errors.As(err, &warn) {
			c.cfg.logger.Warn("connection check warning; connecting anyway", errAttr(err))
			now := c.cfg.clock.Now()
			c.update(func(h *Health) { h.LastError, h.LastErrorTime = redact.String(err.Error()), now })
			return conn, nil
		}
		if serr := c.explainRefusedReceiver(cctx, conn, err); serr != nil {
			_ = conn.close(cctx)
			return nil, redact.Wrap(serr)
		}
		_ = conn.close(cctx)
		return nil, redact.Wrap(fmt.Errorf("retry: connection check failed: %w", err))
	})
}

// retire closes a broken connection once the handlers still using it have finished, in a goroutine
// that Run waits for.
func (r *run) retire(ctx context.Context, live *liveConnection) {
	r.retiring.Add(1)
	go func() {
		defer r.retiring.Done()
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

// errNilConnection is the failure of a connector that returned no connection, or one without a
// receiver or sender.
var errNilConnection = errors.New("retry: connector returned no connection")

// A Consumer retries by scheduling a copy of the failed message (decision.go). On a session-enabled
// entity the copy keeps the message's SessionID, so it rejoins its session behind every message that
// arrived meanwhile: the session's order is lost. The consumer refuses such an entity when it can tell,
// unless Options.AllowReorder accepts the reordering; [SessionConsumer] is the consumer that keeps the
// order. Both halves of that refusal are here: checkSettings (above) reads the entity's settings, and
// refuseSessionReceivers (below) the receivers a connection holds.

// sessionHolder is what a receiver of one session has and a plain receiver lacks: its session's id, as
// *azservicebus.SessionReceiver (and retrytest's SessionReceiver) report it. A Receiver built on one
// (the SDK's session receiver has no RenewMessageLock, so it takes an adapter that embeds it) shows it.
type sessionHolder interface {
	SessionID() string
}

// refuseSessionReceivers returns an error wrapping [ErrSessionEntity] when a receiver of conn (its
// Receiver or a Source's) holds a session and Options.AllowReorder is not set. entity names conn's
// Receiver when its EntityPath is empty.
func (c *config) refuseSessionReceivers(conn *Connection, entity string) error {
	if c.allowReorder {
		return nil
	}
	if conn.EntityPath != "" {
		entity = conn.EntityPath
	}
	check := func(r Receiver, entity string) error {
		if s, ok := r.(sessionHolder); ok {
			return fmt.Errorf("%w (the receiver of %s holds session %q)", ErrSessionEntity, orUnnamed(entity), s.SessionID())
		}
		return nil
	}
	if err := check(conn.Receiver, entity); err != nil {
		return err
	}
	for _, s := range conn.Sources {
		if s.Receiver == nil {
			continue
		}
		if err := check(s.Receiver, s.EntityPath); err != nil {
			return err
		}
	}
	return nil
}

// sessionSettingsWarning is the Health warning of a consumer that runs on a session-enabled entity with
// Options.AllowReorder.
func sessionSettingsWarning(entity string) string {
	return entity + ": the entity requires sessions; retry copies rejoin their session behind later messages (Options.AllowReorder)"
}

// orUnnamed is entity, or a placeholder for a connection that does not name it.
func orUnnamed(entity string) string {
	if entity == "" {
		return "(entity)"
	}
	return entity
}
