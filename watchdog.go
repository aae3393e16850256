package retry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"

	"github.com/sbretry/retry/internal/redact"
)

// reconnect builds a fresh connection, waiting before each try according to how many consecutive
// failures (receive or connect) came before it: none waits nothing (the first connect), the next ones
// wait ReconnectDelays in turn (5 s, 10 s, 15 s by default), and once those are spent a single watchdog
// takes over, trying every WatchdogInterval until a try succeeds. The watchdog is this same loop, so a
// failure while it runs cannot start a second one. The failure count is reset by the receive loop only
// when the new connection has shown that it works (it delivered a message, or stayed quiet and passed a
// probe), because a connection can pass its check and still drop at once. It returns (nil, nil) when
// ctx ends. On the first connect of a Run (first), a missing entity or a refused credential is returned
// as an error, since waiting cannot fix it, unless Options.RetryStartupErrors is set.
func (c *Consumer) reconnect(ctx context.Context, failures *int, cause error, first bool) (*Connection, error) {
	for {
		wait := c.reconnectWait(*failures, cause)
		if wait > 0 {
			select {
			case <-c.cfg.clock.After(wait):
			case <-ctx.Done():
				return nil, nil
			}
		} else if ctx.Err() != nil {
			return nil, nil
		}
		conn, err := c.dial(ctx)
		if err == nil {
			c.update(func(h *Health) { h.Connects++ })
			return conn, nil
		}
		if ctx.Err() != nil {
			return nil, nil
		}
		if fatal := startupError(err); first && fatal != nil && !c.cfg.retryStartup {
			c.recordFailure(func(h *Health) { h.ConnectFailures++ }, err)
			c.cfg.logger.Error("first connect failed in a way retrying cannot fix", errAttr(err))
			return nil, fatal
		}
		*failures++
		cause = err
		c.recordFailure(func(h *Health) { h.ConnectFailures++ }, err)
		c.cfg.logger.Warn("connect failed", errAttr(err), slog.Int("failures", *failures),
			slog.Duration("next_try_in", c.reconnectWait(*failures, cause)))
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

// connectTimeout bounds a connector call with its check. The SDK retries a refused or unreachable
// connection with its own backoff until the context ends (about 30 s with its default RetryOptions), so
// an unbounded check would stretch every reconnect try of the schedule by that much; the check's
// timeout error then says what the endpoint answered (see explainTimeouts).
const connectTimeout = 10 * time.Second

// startupError classifies a connect failure that retrying cannot fix: a missing entity, or a
// credential without the rights needed. It returns nil for anything else.
func startupError(err error) error {
	code, ok := sdkCode(err)
	switch {
	case errors.Is(err, ErrEntityNotFound), errors.Is(err, ErrUnauthorized):
		return err
	case ok && code == azservicebus.CodeNotFound, isAMQPCondition(err, amqp.ErrCondNotFound):
		// The SDK maps a 404 from the management node to CodeNotFound, but passes the attach refusal
		// for a missing entity through as the AMQP error amqp:not-found (azservicebus v1.11,
		// internal/errors.go TransformError).
		return fmt.Errorf("%w: %w", ErrEntityNotFound, err)
	case ok && code == azservicebus.CodeUnauthorizedAccess:
		return fmt.Errorf("%w: %w", ErrUnauthorized, err)
	}
	return nil
}

// dial calls the connector and its check, bounded by connectTimeout (or the settle timeout if shorter).
func (c *Consumer) dial(ctx context.Context) (conn *Connection, err error) {
	cctx, cancel := context.WithTimeout(ctx, min(c.cfg.settleTimeout, connectTimeout))
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			conn, err = nil, fmt.Errorf("retry: connector panicked: %v", r)
		}
	}()
	conn, err = c.connect(cctx)
	if err != nil {
		return nil, redact.Wrap(err)
	}
	if conn == nil || conn.Receiver == nil || conn.Sender == nil {
		if conn != nil && conn.Close != nil {
			_ = conn.Close(cctx)
		}
		return nil, errNilConnection
	}
	if conn.Check != nil {
		if err := conn.Check(cctx); err != nil {
			var warn *CheckWarning
			if errors.As(err, &warn) {
				c.cfg.logger.Warn("connection check warning; connecting anyway", errAttr(err))
				now := c.cfg.clock.Now()
				c.update(func(h *Health) { h.LastError, h.LastErrorTime = redact.String(err.Error()), now })
				return conn, nil
			}
			_ = conn.close(cctx)
			return nil, redact.Wrap(fmt.Errorf("retry: connection check failed: %w", err))
		}
	}
	return conn, nil
}

// isAMQPCondition reports whether err carries an AMQP error with the given condition: a typed check on
// go-amqp's *amqp.Error, the type the SDK wraps for errors it does not translate.
func isAMQPCondition(err error, cond amqp.ErrCond) bool {
	var amqpErr *amqp.Error
	return errors.As(err, &amqpErr) && amqpErr.Condition == cond
}
