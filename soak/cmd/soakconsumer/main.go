// Command soakconsumer is the consumer process of the soak (see soak/README.md): a retry.Consumer built
// from this repository, with a handler whose behaviour each message names (package ledger's classes),
// recording every success durably before it returns. The soak driver starts it, SIGKILLs it at random
// times and starts it again; SIGTERM or SIGINT shut it down gracefully. With -sessions it consumes a
// session-enabled queue with a retry.SessionConsumer instead (sessions.go).
//
// The connection string comes from SOAK_CONNECTION_STRING (it holds a key, so not a flag); the rest are
// flags:
//
//	SOAK_CONNECTION_STRING='Endpoint=sb://127.0.0.1:5672;...' soakconsumer -queue soak -ledger /tmp/ledger.log
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/soak/internal/ledger"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "soakconsumer:", err)
		os.Exit(1)
	}
}

// settings are the flags.
type settings struct {
	queue, ledger    string
	maxAttempts      int
	concurrency      int
	backoffBase      time.Duration
	backoffCap       time.Duration
	reconnect        string
	watchdog         time.Duration
	settleTimeout    time.Duration
	shutdownGrace    time.Duration
	workMax, slowMax time.Duration
	slowShare        float64
	logLevel         string
	// The sessions soak's (sessions.go).
	sessions    bool
	sessionMode string
	maxSessions int
	sessionIdle time.Duration
	maxHold     time.Duration
}

func parseFlags() settings {
	var s settings
	flag.StringVar(&s.queue, "queue", "soak", "queue to consume")
	flag.StringVar(&s.ledger, "ledger", "", "the log successes and outcomes are appended to (required)")
	flag.IntVar(&s.maxAttempts, "max-attempts", 4, "retry.Options.MaxAttempts")
	flag.IntVar(&s.concurrency, "concurrency", 16, "retry.Options.MaxConcurrency")
	flag.DurationVar(&s.backoffBase, "backoff-base", 50*time.Millisecond, "Fibonacci backoff base and floor")
	flag.DurationVar(&s.backoffCap, "backoff-cap", time.Second, "Fibonacci backoff cap")
	flag.StringVar(&s.reconnect, "reconnect-delays", "", "comma-separated retry.Options.ReconnectDelays; empty means the library's default (5s,10s,15s)")
	flag.DurationVar(&s.watchdog, "watchdog", 0, "retry.Options.WatchdogInterval; 0 means the default (60s)")
	flag.DurationVar(&s.settleTimeout, "settle-timeout", 0, "retry.Options.SettleTimeout; 0 means the default (30s)")
	flag.DurationVar(&s.shutdownGrace, "shutdown-grace", 5*time.Second, "retry.Options.ShutdownGrace")
	flag.DurationVar(&s.workMax, "work", 5*time.Millisecond, "a handler works up to this long")
	flag.DurationVar(&s.slowMax, "slow-work", time.Second, "a slow handler works up to this long")
	flag.Float64Var(&s.slowShare, "slow-share", 0.01, "share of handler runs that are slow")
	flag.StringVar(&s.logLevel, "log-level", "info", "debug, info, warn or error")
	flag.BoolVar(&s.sessions, "sessions", false, "consume a session-enabled queue with retry.SessionConsumer (-concurrency is then unused)")
	flag.StringVar(&s.sessionMode, "session-mode", "inplace", "with -sessions: how a failure holds its session: inplace, or durable (SessionOptions.DurableHolds)")
	flag.DurationVar(&s.maxHold, "max-hold", 0, "with -sessions: SessionOptions.MaxHold; 0 means the library's default (5m) in place, 1ns with -session-mode durable")
	flag.IntVar(&s.maxSessions, "max-sessions", 16, "with -sessions: retry.SessionOptions.MaxConcurrentSessions")
	flag.DurationVar(&s.sessionIdle, "session-idle", 500*time.Millisecond, "with -sessions: retry.SessionOptions.SessionIdleTimeout")
	flag.Parse()
	return s
}

func run() error {
	s := parseFlags()
	connStr := os.Getenv("SOAK_CONNECTION_STRING")
	if connStr == "" || s.ledger == "" {
		return errors.New("SOAK_CONNECTION_STRING and -ledger are required")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(s.logLevel)); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	var delays []time.Duration
	if s.reconnect != "" {
		for _, f := range strings.Split(s.reconnect, ",") {
			d, err := time.ParseDuration(strings.TrimSpace(f))
			if err != nil {
				return fmt.Errorf("-reconnect-delays: %w", err)
			}
			delays = append(delays, d)
		}
	}

	w, err := ledger.OpenWriter(s.ledger)
	if err != nil {
		return err
	}
	defer w.Close()

	h := &handler{w: w, s: s}
	opts := &retry.Options{
		MaxAttempts:      s.maxAttempts,
		Backoff:          backoff.Fibonacci{Base: s.backoffBase, Floor: s.backoffBase, Cap: s.backoffCap},
		ReconnectDelays:  delays,
		WatchdogInterval: s.watchdog,
		SettleTimeout:    s.settleTimeout,
		ShutdownGrace:    s.shutdownGrace,
		Logger:           logger,
		Hooks: retry.Hooks{
			OnProcessed: func(p retry.ProcessedParams) {
				if isProbe(p.Message) {
					return
				}
				res := p.Result
				if err := w.Processed(chainID(p.Message, p.Envelope), p.Envelope.Attempt, seqOf(p.Message), res.Outcome.String(), res.Inherited, res.PossibleDuplicate); err != nil {
					logger.Error("soak: writing the ledger failed", "error", err)
				}
				if s.sessions && res.Outcome == retry.OutcomeDeadLettered {
					if err := recordSessionDeadLetter(w, p); err != nil {
						logger.Error("soak: writing the ledger failed", "error", err)
					}
				}
			},
			OnSettle: func(p retry.SettleParams) {
				if p.Err == nil || isProbe(p.Message) {
					return
				}
				if err := w.SettleFailed(chainID(p.Message, p.Envelope), p.Envelope.Attempt, p.Operation); err != nil {
					logger.Error("soak: writing the ledger failed", "error", err)
				}
			},
		},
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	var consumer interface {
		Run(context.Context) error
		Health() retry.Health
	}
	if s.sessions {
		if consumer, err = newSessionConsumer(connStr, s, h, opts); err != nil {
			return err
		}
	} else {
		connect, err := retry.NewNamespace(connStr, nil).Queue(s.queue)
		if err != nil {
			return err
		}
		opts.MaxConcurrency = s.concurrency
		if consumer, err = retry.NewConsumer(connect, h.handle, opts); err != nil {
			return err
		}
	}
	logger.Info("soak: consumer starting", "pid", os.Getpid(), "sessions", s.sessions)
	runErr := consumer.Run(ctx)
	hl := consumer.Health()
	logger.Info("soak: consumer stopped", "received", hl.Received, "completed", hl.Completed, "retries", hl.RetriesScheduled,
		"dead_lettered", hl.DeadLettered, "left_for_redelivery", hl.LeftForRedelivery, "possible_duplicates", hl.PossibleDuplicates,
		"connects", hl.Connects, "connect_failures", hl.ConnectFailures, "receive_failures", hl.ReceiveFailures, "send_failures", hl.SendFailures)
	return runErr
}

// handler is the soak's handler: it does what the message's class says and records each success.
type handler struct {
	w *ledger.Writer
	s settings
}

var (
	errTransient = errors.New("soak: transient failure")
	errPermanent = errors.New("soak: permanent failure")
)

func (h *handler) handle(ctx context.Context, msg *azservicebus.ReceivedMessage) error {
	env, _ := envelope.FromContext(ctx)
	class, failAttempts, err := ledger.FromProperties(msg.ApplicationProperties)
	if err != nil {
		return retry.Permanent(err)
	}
	work := time.Duration(rand.Int64N(int64(h.s.workMax) + 1))
	if rand.Float64() < h.s.slowShare {
		work = time.Duration(rand.Int64N(int64(h.s.slowMax) + 1))
	}
	t := time.NewTimer(work)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
		return context.Cause(ctx) // lock lost or shutdown: nothing done, nothing recorded
	}
	switch {
	case class == ledger.ClassPermanent:
		return retry.Permanent(errPermanent)
	case ledger.Fails(class, failAttempts, env.Attempt):
		return errTransient
	}
	// Durable before the handler returns: a success the consumer is killed after is still counted.
	if h.s.sessions {
		return recordSessionSuccess(ctx, h.w, msg, env)
	}
	return h.w.Success(chainID(msg, env), env.Attempt, seqOf(msg))
}

// chainID is the chain's original MessageID.
func chainID(msg *azservicebus.ReceivedMessage, env envelope.Envelope) string {
	if env.OriginalMessageID != "" {
		return env.OriginalMessageID
	}
	return msg.MessageID
}

func seqOf(msg *azservicebus.ReceivedMessage) int64 {
	if msg.SequenceNumber == nil {
		return -1
	}
	return *msg.SequenceNumber
}

// isProbe reports the connection check's send-rights probe (retry.PropProbe), which is not a soak message.
func isProbe(msg *azservicebus.ReceivedMessage) bool {
	return msg != nil && msg.ApplicationProperties[retry.PropProbe] == retry.ProbeValue
}
