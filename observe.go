package retry

import (
	"context"
	"log/slog"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/internal/redact"
)

// Observation: what the processor tells the hooks (hooks.go) and the log about each delivery. The
// stages of process.go call these at their edges: started and startAttempt before a handler call
// (Hooks.OnStart), settled after each broker call (Hooks.OnSettle), finish once per delivery with its
// result (Hooks.OnProcessed), log for the lines in between.

// finish reports res to the OnProcessed hook and returns it, so every path through Process is
// observed exactly once.
func (p *Processor) finish(d *delivery, env envelope.Envelope, res Result) Result {
	if hook := p.cfg.hooks.OnProcessed; hook != nil {
		hook(ProcessedParams{
			Context: d.ctx, Message: d.msg, Envelope: env, Result: res, EntityPath: d.route.entity,
			HandlerDuration: d.handlerTime, Duration: p.cfg.clock.Now().Sub(d.start),
		})
	}
	return res
}

// started runs the OnStart hook for the delivery's first attempt, whose context becomes the
// delivery's.
func (p *Processor) started(d *delivery) context.Context {
	d.base = d.ctx
	return p.startAttempt(d, 0, d.start)
}

// startAttempt runs the OnStart hook before the handler's call number rerun+1 in d, at, on the
// delivery's context before any OnStart (d.base): each attempt's context, and the deadline a hook sets
// on it, is its own.
func (p *Processor) startAttempt(d *delivery, rerun int, at time.Time) context.Context {
	d.ctx = d.base
	if hook := p.cfg.hooks.OnStart; hook != nil {
		if hctx := hook(StartParams{Context: d.base, Message: d.msg, Envelope: d.env, EntityPath: d.route.entity, Time: at, Rerun: rerun}); hctx != nil {
			d.ctx = hctx
		}
	}
	return d.ctx
}

// callStart is when a broker call for d starts, as the OnSettle hook reports it: read from the clock
// only when the hook is set.
func (p *Processor) callStart(d *delivery) time.Time {
	if p.cfg.hooks.OnSettle == nil {
		return d.now
	}
	return p.cfg.clock.Now()
}

// settled reports one broker call made for a delivery, started at start, to the OnSettle hook; copyID
// is the retry copy's MessageID when the call scheduled it.
func (p *Processor) settled(d *delivery, op, copyID string, env envelope.Envelope, start time.Time, err error) {
	if hook := p.cfg.hooks.OnSettle; hook != nil {
		hook(SettleParams{Context: d.ctx, Message: d.msg, Envelope: env, EntityPath: d.route.entity, Operation: op, RetryMessageID: copyID,
			Start: start, Duration: p.cfg.clock.Now().Sub(start), Err: err})
	}
}

// log writes one line with the message's identity. Bodies are never logged.
func (c *config) log(ctx context.Context, level slog.Level, text string, msg *azservicebus.ReceivedMessage, env envelope.Envelope, attrs ...slog.Attr) {
	lg := c.logger
	if !lg.Enabled(ctx, level) {
		return
	}
	base := []slog.Attr{
		slog.String("message_id", msg.MessageID),
		slog.String("correlation_id", env.CorrelationID),
		slog.Int("attempt", env.Attempt),
	}
	if msg.SequenceNumber != nil {
		base = append(base, slog.Int64("sequence_number", *msg.SequenceNumber))
	}
	lg.LogAttrs(ctx, level, text, append(base, attrs...)...)
}

// errAttr renders err with secrets redacted.
func errAttr(err error) slog.Attr {
	if err == nil {
		return slog.String("error", "")
	}
	return slog.String("error", redact.String(err.Error()))
}
