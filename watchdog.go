package retry

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/sbretry/retry/internal/redact"
)

// The reconnect-then-watchdog loop, one for both consumers: after a connection breaks, or a connect
// fails, a fresh connection is built from scratch on a schedule: ReconnectDelays in turn (5 s, 10 s,
// 15 s by default), then a single watchdog that tries every WatchdogInterval (60 s) until a try
// succeeds. The watchdog is this same loop, so a failure while it runs cannot start a second one. A
// broken connection is never reused: the SDK's recovery cannot always heal a client whose connection
// was lost. The callers (the connection loops of reconnect.go and session.go) reset the failure count
// only when a new connection has shown that it works, because a connection can pass its check and
// still drop at once.

// redial builds a fresh connection with dial, waiting before each try according to how many
// consecutive failures (of connections or connects) came before it: none waits nothing (the first
// connect), then the schedule above. Each failure is counted in Health and logged with the wait
// before the next try. fatal says which failures no retry can fix (a missing entity, a refused
// credential on the first connect): such a failure ends the loop with fatal's error. It returns the
// zero C and a nil error when ctx ends.
func redial[C any](ctx context.Context, c *Consumer, failures *int, cause error, dial func(context.Context) (C, error), fatal func(error) error) (C, error) {
	var zero C
	wait := c.reconnectWait(*failures, cause)
	for {
		if wait > 0 {
			ch, stopTimer := timerChan(c.cfg.clock, wait)
			select {
			case <-ch:
			case <-ctx.Done():
				stopTimer()
				return zero, nil
			}
		}
		if ctx.Err() != nil {
			return zero, nil
		}
		conn, err := dial(ctx)
		if err == nil {
			c.update(func(h *Health) { h.Connects++ })
			return conn, nil
		}
		if ctx.Err() != nil {
			return zero, nil
		}
		c.recordFailure(func(h *Health) { h.ConnectFailures++ }, err)
		if f := fatal(err); f != nil {
			return zero, f
		}
		*failures++
		cause = err
		wait = c.reconnectWait(*failures, cause)
		c.cfg.logger.Warn("connect failed", errAttr(err), slog.Int("failures", *failures), slog.Duration("next_try_in", wait))
	}
}

// reconnectWait returns the wait before the next connect after n consecutive failures, and moves the
// consumer into the matching state, reporting cause (the latest failure) to the state hook.
func (c *Consumer) reconnectWait(n int, cause error) time.Duration {
	delays := c.cfg.reconnectDelays
	switch {
	case n == 0:
		return 0
	case n <= len(delays):
		c.setState(StateReconnecting, cause)
		return delays[n-1]
	default:
		c.setState(StateWatchdog, cause)
		return c.cfg.watchdogInterval
	}
}

// callConnector calls a connector, bounded by connectTimeout (or the settle timeout if shorter), turning
// a panic into an error and keeping secrets out of the error. cctx, which bounds the call, is handed on
// to check, which finishes the connection within the same bound.
func callConnector[C any](ctx context.Context, cfg *config, connect func(context.Context) (C, error), check func(cctx context.Context, conn C) (C, error)) (conn C, err error) {
	cctx, cancel := context.WithTimeout(ctx, min(cfg.settleTimeout, connectTimeout))
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			var zero C
			conn, err = zero, fmt.Errorf("retry: connector panicked: %v", r)
		}
	}()
	conn, err = connect(cctx)
	if err != nil {
		var zero C
		return zero, redact.Wrap(err)
	}
	return check(cctx, conn)
}

// connectTimeout bounds a connector call with its check. The SDK retries a refused or unreachable
// connection with its own backoff until the context ends (about 30 s with its default RetryOptions), so
// an unbounded check would stretch every reconnect try of the schedule by that much; the check's
// timeout error then says what the endpoint answered (see explainTimeouts).
const connectTimeout = 10 * time.Second
