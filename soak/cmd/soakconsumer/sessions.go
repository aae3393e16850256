package main

import (
	"context"
	"errors"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbretry/retry"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/soak/internal/ledger"
	"github.com/sbretry/retry/soak/internal/sessionmode"
)

// newSessionConsumer is the sessions soak's consumer: a retry.SessionConsumer on the session-enabled
// queue, with the same handler, options and hooks as the queue soak's (minus MaxConcurrency, which a
// session consumer refuses: one handler per session, MaxConcurrentSessions of them).
func newSessionConsumer(connStr string, s settings, h *handler, opts *retry.Options) (*retry.SessionConsumer, error) {
	sopts, err := sessionOptions(s)
	if err != nil {
		return nil, err
	}
	connect, err := retry.NewNamespace(connStr, nil).SessionQueue(s.queue)
	if err != nil {
		return nil, err
	}
	return retry.NewSessionConsumer(connect, h.handle, opts, sopts)
}

// sessionOptions maps the flags to retry.SessionOptions: -session-mode durable turns on DurableHolds,
// with MaxHold 1 ns unless -max-hold says otherwise, so that every delayed retry is held durably.
func sessionOptions(s settings) (*retry.SessionOptions, error) {
	mode, err := sessionmode.Parse(s.sessionMode)
	if err != nil {
		return nil, err
	}
	so := &retry.SessionOptions{MaxConcurrentSessions: s.maxSessions, SessionIdleTimeout: s.sessionIdle, MaxHold: s.maxHold}
	switch mode {
	case sessionmode.InPlace:
		// The default: a failure holds its session in place, in memory, up to MaxHold.
	case sessionmode.Durable:
		so.DurableHolds = true
		if so.MaxHold == 0 {
			so.MaxHold = time.Nanosecond
		}
	}
	return so, nil
}

// recordSessionSuccess appends the O record of a session message's success (fsynced before it returns).
func recordSessionSuccess(ctx context.Context, w *ledger.Writer, msg *azservicebus.ReceivedMessage, env envelope.Envelope) error {
	sid, ok := retry.SessionIDFromContext(ctx)
	if !ok {
		return retry.Permanent(errors.New("soak: a session handler without a session id"))
	}
	index, err := ledger.IndexFromProperties(msg.ApplicationProperties)
	if err != nil {
		return retry.Permanent(err)
	}
	return w.SessionSuccess(chainID(msg, env), sid, index, env.Attempt, seqOf(msg))
}

// recordSessionDeadLetter appends the D record of a session message the consumer dead-lettered. It runs
// in OnProcessed, which the session consumer calls before it receives the session's next message, so the
// record precedes every later index's.
func recordSessionDeadLetter(w *ledger.Writer, p retry.ProcessedParams) error {
	msg := p.Message
	sid := ""
	if msg.SessionID != nil {
		sid = *msg.SessionID
	}
	index, err := ledger.IndexFromProperties(msg.ApplicationProperties)
	if err != nil {
		index = -1 // a message that is not the soak's: the checker names it
	}
	return w.SessionDeadLettered(chainID(msg, p.Envelope), sid, index, p.Envelope.Attempt, p.Result.DeadLetterReason)
}
