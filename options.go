package retry

import (
	"context"
	"log/slog"
	"math"
	"strconv"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/envelope"
	"github.com/sbretry/retry/outage"
)

// Defaults for [Options]. Each applies when its field is zero.
const (
	defaultMaxAttempts      = 29
	defaultMaxConcurrency   = 1
	defaultSettleTimeout    = 30 * time.Second
	defaultWatchdogInterval = 60 * time.Second
	defaultShutdownGrace    = 30 * time.Second
	// defaultMaxMessageSize is the Standard tier limit (256 KiB). Set Options.MaxMessageSize for Premium.
	defaultMaxMessageSize = 256 * 1024
	// defaultDescriptionLimit bounds the dead-letter description and the last-error property.
	defaultDescriptionLimit = 1024
	// maxDescriptionLimit is the largest DescriptionLimit. Service Bus caps one property at 32 KiB and
	// all headers at 64 KiB; half the per-property cap leaves room for the message's own properties.
	maxDescriptionLimit = 16 * 1024
	// maxReceiveBatchSize is the most messages one azservicebus ReceiveMessages call may ask for.
	maxReceiveBatchSize = 5000
)

// defaultReconnectDelays returns the waits before the reconnect tries that follow a broken connection
// (5 s, 10 s, 15 s). When all fail, a watchdog retries every Options.WatchdogInterval until one
// succeeds. It returns a new slice on every call, so no caller can change another's defaults.
func defaultReconnectDelays() []time.Duration {
	return []time.Duration{5 * time.Second, 10 * time.Second, 15 * time.Second}
}

// DeadLetterReasons are the DeadLetterReason texts the processor writes. They are our own, never a
// broker reason such as MaxDeliveryCountExceeded, so operators can tell the two apart. Empty fields use
// the defaults shown.
type DeadLetterReasons struct {
	// MaxAttempts: the last attempt failed. Default "RetryMaxAttemptsExceeded".
	MaxAttempts string
	// Permanent: the handler returned [Permanent]. Default "RetryPermanentFailure".
	Permanent string
	// BudgetExhausted: the next attempt would fall after Options.RetryBudget. Default "RetryBudgetExhausted".
	BudgetExhausted string
	// InvalidEnvelope: the message carries malformed retry properties. Default "RetryInvalidProperties".
	InvalidEnvelope string
	// MessageTooLarge: the retry copy would exceed Options.MaxMessageSize. Default "RetryMessageTooLarge".
	MessageTooLarge string
	// UnsupportedBody: the body is an AMQP value, an AMQP sequence or several data sections, which a
	// retry copy cannot carry. Default "RetryUnsupportedBody".
	UnsupportedBody string
	// Expired: the next attempt would be due after the message's expiry (its producer's TimeToLive).
	// Default "RetryMessageExpired".
	Expired string
	// NoRoute: no route of a [Router] takes the message. Default "RetryNoRoute".
	NoRoute string
	// SessionHoldExceeded: a [SessionConsumer]'s next retry in place would end after
	// SessionOptions.MaxHold. Default "RetrySessionHoldExceeded".
	SessionHoldExceeded string
	// SessionBacklogFull: a message of a durably held session could not be deferred behind the hold,
	// because 10,000 messages already wait there. Default "RetrySessionBacklogFull".
	SessionBacklogFull string
}

// withDefaults fills every empty reason with its documented default.
func (r DeadLetterReasons) withDefaults() DeadLetterReasons {
	set := func(s *string, def string) {
		if *s == "" {
			*s = def
		}
	}
	set(&r.MaxAttempts, "RetryMaxAttemptsExceeded")
	set(&r.Permanent, "RetryPermanentFailure")
	set(&r.BudgetExhausted, "RetryBudgetExhausted")
	set(&r.InvalidEnvelope, "RetryInvalidProperties")
	set(&r.MessageTooLarge, "RetryMessageTooLarge")
	set(&r.UnsupportedBody, "RetryUnsupportedBody")
	set(&r.Expired, "RetryMessageExpired")
	set(&r.NoRoute, "RetryNoRoute")
	set(&r.SessionHoldExceeded, "RetrySessionHoldExceeded")
	set(&r.SessionBacklogFull, "RetrySessionBacklogFull")
	return r
}

// Options configures [NewConsumer] and [NewProcessor]. A nil *Options means all defaults. The zero value
// of every field means its documented default; negative durations and counts are invalid.
type Options struct {
	// MaxAttempts is the number of handler attempts before the message is dead-lettered: the message fails
	// for good after attempt MaxAttempts. Zero means 29.
	MaxAttempts int
	// Backoff chooses the delay after each failed attempt. Nil means Fibonacci{} (10 s floor, 7 day cap).
	Backoff backoff.Backoff
	// ImmediateRetries is how many times a failed handler is called again at once, in the same delivery,
	// before a delayed retry is scheduled, as NServiceBus's immediate retries: each counts as an attempt
	// against MaxAttempts, and the handler sees its Envelope's Attempt and LastError move on. The
	// delivery keeps its lock (renewed) and its handler slot meanwhile. A failure answered with
	// [RetryAfter] ends them: the delayed retry is scheduled at the delay it asked for. Zero (the
	// default) means none; at most 100.
	ImmediateRetries int
	// ImmediateDelay is the wait before each immediate retry, at most 1 minute. Zero means
	// none.
	ImmediateDelay time.Duration
	// Policies choose, by error, what a failure becomes: immediate retries, backoff, attempts,
	// dead-letter at once or discard (see [Policy] for the order in which they are asked). The first
	// rule whose Match takes the error decides; none matching means the fields above.
	Policies []Rule
	// Outage turns on outage mode, a breaker that pauses receiving while the handlers' failures say that
	// a dependency is down, so that an outage neither burns attempts nor fills the dead-letter queue
	// (see [outage.Options]). Nil means off; [Consumer.Pause] works either way.
	Outage *outage.Options
	// RetryBudget bounds the total time from the first enqueue to the next attempt; a retry that would be
	// due later is dead-lettered instead. Zero means no budget (MaxAttempts alone decides).
	RetryBudget time.Duration
	// MaxConcurrency is the most handlers running at once. Zero means 1. A
	// message whose handler has returned does not count while it is settled, so a settle stuck on a dead
	// lock does not stop new messages; up to MaxConcurrency handlers, Prefetch messages received ahead
	// and MaxConcurrency+64 settles can be between receive and the end of their settle.
	MaxConcurrency int
	// ReceiveBatchSize is the most messages asked for in one receive call; it is also bounded by the free
	// handler slots plus the free prefetch places (see Prefetch), so it never makes the consumer hold
	// more. While messages received ahead keep the handlers busy, the receive loop waits (up to 2 ms)
	// until half a batch of places is free. Zero means twice MaxConcurrency (at most
	// 5,000), or 1 with MaxConcurrency 1: a receive then asks for every free slot and
	// place at once, which measured 8 % (success) to 15 % (failures) more throughput on loopback than
	// batches of MaxConcurrency (BENCHMARKS.md). A single handler gains nothing from a batch of two, and
	// a receive that asks for more messages than are there waits 1 ms for the rest. Larger values are
	// invalid.
	ReceiveBatchSize int
	// Prefetch is how many messages the consumer may hold beyond its free handler slots, received ahead
	// so that a handler slot that frees up finds its next message waiting instead of waiting for a
	// receive call; their locks are renewed while they wait. Zero means MaxConcurrency (at most
	// 5,000); a negative value turns prefetching off, so the consumer never holds a
	// lock on a message it cannot start at once (worth it when handlers are slow and other consumers
	// could take those messages meanwhile).
	// There is no prefetching with DisableLockRenewal, whose waiting locks would run out. Values above
	// 5,000 are invalid. A message received ahead that has not started when Run stops
	// is not started; the broker redelivers it when its lock runs out.
	Prefetch int
	// SettleTimeout bounds every complete, dead-letter, renew and republish call. The SDK's own settle path
	// can take about 50 s after a connection drop. Zero means 30 s.
	SettleTimeout time.Duration
	// LockDuration is the lock duration of the entity (queue or subscription), as configured on it.
	// Renewal is timed from it on the local clock, so it works even when this machine's clock disagrees
	// with the broker's. Zero means inferring it from each message's LockedUntil at receive, which
	// assumes the two clocks agree within a small fraction of the lock; set it when they may not.
	LockDuration time.Duration
	// LockRenewInterval is how often a message's lock (a session's, for a [SessionConsumer]) is renewed,
	// from receive until it is settled. Zero means half the lock duration; more than two thirds of the
	// lock duration is cut to two thirds, and less than 100 ms is raised to 100 ms.
	LockRenewInterval time.Duration
	// DisableLockRenewal turns lock renewal off; a handler that outlives the lock then loses the message to
	// redelivery.
	DisableLockRenewal bool
	// EntityPath is the queue, or "topic/Subscriptions/subscription", the messages are received from. It
	// is the first half of a retry chain's identity (see [envelope.Envelope.RetryMessageID]), so two processors
	// whose copies meet in one entity must use different paths. [Consumer] takes it from the
	// [Connection] when the connector sets it. Empty is valid for a queue whose copies go back to itself.
	EntityPath string
	// IdempotencyKey returns a name for the message that handlers can use to make their effects
	// idempotent; it is carried in the envelope ([envelope.Envelope.Key]). Nil means the original MessageID (for a
	// message made by [envelope.Resubmit], the MessageID it was resubmitted from). It does
	// not decide the retry MessageID. The key is computed on the first delivery and carried after.
	IdempotencyKey func(*azservicebus.ReceivedMessage) string
	// IgnoreExpiry makes every retry copy carry the original TimeToLive:
	// each attempt then extends the producer's deadline. By default a copy gets only what is left of the
	// first delivery's lifetime, and a retry due after the expiry is dead-lettered with reason
	// DeadLetterReasons.Expired. A message without a TimeToLive never expires either way.
	IgnoreExpiry bool
	// ErrorText renders a handler error for what goes onto the broker: the last-error property of the next
	// copy and the dead-letter description. Nil means err.Error(). The result is still redacted and
	// truncated to DescriptionLimit. Logs always use err.Error(), redacted.
	ErrorText func(error) string
	// RetryStartupErrors keeps a consumer retrying when its first connect finds the entity missing or the
	// credential unauthorized, for namespaces whose entities are created after the consumer starts. By
	// default Run returns such an error at once, since retrying cannot fix a typo or a missing role.
	RetryStartupErrors bool
	// AllowReorder lets a [Consumer] run on a session-enabled entity. Its retries schedule a copy of the
	// failed message, which keeps the message's SessionID and so rejoins its session behind the
	// messages that arrived meanwhile: the session's order is lost. By default the consumer refuses
	// such an entity at connect, with an error wrapping [ErrSessionEntity], when it can tell (a
	// receiver with a SessionID method, such as one built on *azservicebus.SessionReceiver, or the
	// settings check of ConnectOptions.CheckSettings finding RequiresSession); [NewSessionConsumer]
	// keeps the order by retrying in place. Set it when the order within a session does not matter.
	// A [SessionConsumer] ignores it: it never reorders.
	AllowReorder bool
	// Logger receives structured logs. Nil means slog.Default(). Message bodies are never logged.
	Logger *slog.Logger
	// Hooks observe outcomes and state changes.
	Hooks Hooks
	// ReconnectDelays are the waits before each reconnect try after the connection broke. Nil means
	// 5 s, 10 s, 15 s; an empty non-nil slice goes straight to the watchdog.
	ReconnectDelays []time.Duration
	// WatchdogInterval is the period of the watchdog that takes over when every reconnect try failed.
	// Zero means 60 s.
	WatchdogInterval time.Duration
	// ShutdownGrace is how long in-flight handlers keep a live context after Run's context ends; then
	// their contexts are cancelled. Run waits one SettleTimeout more for them; if some still run, it
	// closes the connection, settles nothing more and returns an error wrapping [ErrShutdownTimeout].
	// Zero means 30 s.
	ShutdownGrace time.Duration
	// DeadLetterReasons overrides the reason texts.
	DeadLetterReasons DeadLetterReasons
	// DescriptionLimit bounds the dead-letter description and the last-error property, in bytes.
	// Zero means 1024; at most 16 KiB.
	DescriptionLimit int
	// MaxMessageSize is the largest retry copy, in bytes (body plus properties, estimated). A larger copy,
	// or one whose properties exceed the Service Bus header limits (32 KiB each, 64 KiB together), is
	// dead-lettered rather than failing to republish forever. Zero means 256 KiB (a Standard namespace's limit).
	MaxMessageSize int
	// Clock is the time source. Nil means the real clock.
	Clock Clock
}

// config is Options with every default applied; it is built once and shared read-only.
type config struct {
	maxAttempts       int
	backoff           backoff.Backoff
	immediate         int
	immediateDelay    time.Duration
	policies          []Rule
	outage            *outageConfig
	retryBudget       time.Duration
	maxConcurrency    int
	batchSize         int
	prefetch          int
	settleTimeout     time.Duration
	lockDuration      time.Duration
	lockRenewInterval time.Duration
	lockRenewal       bool
	entityPath        string
	ignoreExpiry      bool
	errorText         func(error) string
	retryStartup      bool
	allowReorder      bool
	key               func(*azservicebus.ReceivedMessage) string
	userKey           bool // key is Options.IdempotencyKey (which may panic), not defaultKey
	logger            *slog.Logger
	hooks             Hooks
	reconnectDelays   []time.Duration
	watchdogInterval  time.Duration
	shutdownGrace     time.Duration
	reasons           DeadLetterReasons
	descriptionLimit  int
	maxMessageSize    int
	clock             Clock
	maxDelay          time.Duration
}

// validate reports the first invalid field.
func (o *Options) validate() error {
	if o == nil {
		return nil
	}
	negInt := func(field string, v int) error {
		if v < 0 {
			return &OptionError{Field: field, Reason: "must not be negative"}
		}
		return nil
	}
	negDur := func(field string, v time.Duration) error {
		if v < 0 {
			return &OptionError{Field: field, Reason: "must not be negative"}
		}
		return nil
	}
	for _, err := range []error{
		negInt("MaxAttempts", o.MaxAttempts),
		negInt("MaxConcurrency", o.MaxConcurrency),
		negInt("ReceiveBatchSize", o.ReceiveBatchSize),
		negInt("DescriptionLimit", o.DescriptionLimit),
		negInt("MaxMessageSize", o.MaxMessageSize),
		negInt("ImmediateRetries", o.ImmediateRetries),
		negDur("ImmediateDelay", o.ImmediateDelay),
		negDur("RetryBudget", o.RetryBudget),
		negDur("SettleTimeout", o.SettleTimeout),
		negDur("LockRenewInterval", o.LockRenewInterval),
		negDur("LockDuration", o.LockDuration),
		negDur("WatchdogInterval", o.WatchdogInterval),
		negDur("ShutdownGrace", o.ShutdownGrace),
	} {
		if err != nil {
			return err
		}
	}
	for i, d := range o.ReconnectDelays {
		if d < 0 {
			return &OptionError{Field: "ReconnectDelays", Reason: "delay " + strconv.Itoa(i) + " must not be negative"}
		}
	}
	// Attempts travel as AMQP longs but are decoded into [1, MaxInt32] (see envelope.Decode); a larger
	// limit could never be reached and would hide a typo.
	if o.DescriptionLimit > maxDescriptionLimit {
		return &OptionError{Field: "DescriptionLimit", Reason: "must not exceed " + strconv.Itoa(maxDescriptionLimit) + " bytes (the Service Bus property limit)"}
	}
	if o.Prefetch > maxReceiveBatchSize {
		return &OptionError{Field: "Prefetch", Reason: "must not exceed " + strconv.Itoa(maxReceiveBatchSize)}
	}
	if o.ReceiveBatchSize > maxReceiveBatchSize {
		return &OptionError{Field: "ReceiveBatchSize", Reason: "must not exceed " + strconv.Itoa(maxReceiveBatchSize) + " (the SDK's limit per receive call)"}
	}
	if o.MaxAttempts > math.MaxInt32 {
		return &OptionError{Field: "MaxAttempts", Reason: "must fit in 32 bits"}
	}
	if v, ok := o.Backoff.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return &OptionError{Field: "Backoff", Reason: err.Error()}
		}
	}
	if o.ImmediateRetries > maxImmediateRetries {
		return &OptionError{Field: "ImmediateRetries", Reason: "must not exceed " + strconv.Itoa(maxImmediateRetries)}
	}
	if o.ImmediateDelay > maxImmediateDelay {
		return &OptionError{Field: "ImmediateDelay", Reason: "must not exceed " + maxImmediateDelay.String() + "; use the delayed retries for longer waits"}
	}
	if err := validateRules("Policies", o.Policies); err != nil {
		return err
	}
	return validateOutage(o.Outage)
}

// resolve validates o and applies the defaults.
func (o *Options) resolve() (*config, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	var opts Options
	if o != nil {
		opts = *o
	}
	c := &config{
		maxAttempts:       orInt(opts.MaxAttempts, defaultMaxAttempts),
		backoff:           opts.Backoff,
		immediate:         opts.ImmediateRetries,
		immediateDelay:    opts.ImmediateDelay,
		policies:          append([]Rule(nil), opts.Policies...),
		outage:            resolveOutage(opts.Outage),
		retryBudget:       opts.RetryBudget,
		maxConcurrency:    orInt(opts.MaxConcurrency, defaultMaxConcurrency),
		settleTimeout:     orDur(opts.SettleTimeout, defaultSettleTimeout),
		lockDuration:      opts.LockDuration,
		lockRenewInterval: opts.LockRenewInterval,
		lockRenewal:       !opts.DisableLockRenewal,
		entityPath:        opts.EntityPath,
		ignoreExpiry:      opts.IgnoreExpiry,
		errorText:         opts.ErrorText,
		retryStartup:      opts.RetryStartupErrors,
		allowReorder:      opts.AllowReorder,
		key:               opts.IdempotencyKey,
		userKey:           opts.IdempotencyKey != nil,
		logger:            opts.Logger,
		hooks:             opts.Hooks,
		reconnectDelays:   opts.ReconnectDelays,
		watchdogInterval:  orDur(opts.WatchdogInterval, defaultWatchdogInterval),
		shutdownGrace:     orDur(opts.ShutdownGrace, defaultShutdownGrace),
		reasons:           opts.DeadLetterReasons.withDefaults(),
		descriptionLimit:  orInt(opts.DescriptionLimit, defaultDescriptionLimit),
		maxMessageSize:    orInt(opts.MaxMessageSize, defaultMaxMessageSize),
		clock:             opts.Clock,
	}
	// The default batch follows MaxConcurrency, which may legitimately exceed what one receive call can
	// ask for; the consumer then simply receives in several calls.
	defaultBatch := 2 * c.maxConcurrency
	if c.maxConcurrency == 1 {
		defaultBatch = 1
	}
	c.batchSize = min(orInt(opts.ReceiveBatchSize, defaultBatch), maxReceiveBatchSize)
	switch {
	case opts.Prefetch < 0 || !c.lockRenewal:
		c.prefetch = 0
	case opts.Prefetch == 0:
		c.prefetch = min(c.maxConcurrency, maxReceiveBatchSize)
	default:
		c.prefetch = opts.Prefetch
	}
	if c.backoff == nil {
		c.backoff = backoff.Fibonacci{}
	}
	// Every delay (RetryAfter ones, and those of a custom Backoff without bounds) is capped by the
	// backoff's own cap, or DefaultCap, so nothing schedules past the window the user sized for it.
	c.maxDelay = backoff.DefaultCap
	if b, ok := c.backoff.(backoff.DelayBounds); ok {
		_, c.maxDelay = b.Bounds()
	}
	if c.key == nil {
		c.key = defaultKey
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	if c.reconnectDelays == nil {
		c.reconnectDelays = defaultReconnectDelays()
	}
	// Copy the slice: the caller may reuse or change its Options after the constructor returns, and the
	// consumer reads the delays from another goroutine.
	c.reconnectDelays = append([]time.Duration(nil), c.reconnectDelays...)
	if c.clock == nil {
		c.clock = realClock{}
	}
	return c, nil
}

func orInt(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

func orDur(v, def time.Duration) time.Duration {
	if v == 0 {
		return def
	}
	return v
}

// defaultKey is the idempotency key without Options.IdempotencyKey: the MessageID, or for a
// resubmitted dead letter the key of its original.
func defaultKey(m *azservicebus.ReceivedMessage) string {
	if v, ok := m.ApplicationProperties[envelope.PropResubmittedFrom].(string); ok && v != "" && len(v) <= envelope.MaxIdentifierLength {
		return v // a resubmitted dead letter keeps the key of its original
	}
	return m.MessageID
}

// Defaults for [outage.Options], chosen against the peers' breakers. Theirs stop an endpoint whose
// failures would otherwise be lost or redelivered at once; ours pauses a consumer whose failures are
// already spread by delayed retries, so a false trip costs more than a late one, and an outage is close
// to 100 % failures anyway. Hence a higher rate than MassTransit's 10 % (of 100 in 1 minute), Polly's
// 10 % or Wolverine's 15 %, over MassTransit's one-minute window; a consecutive-failure rule like
// Dapr's (more than 5) for consumers too quiet to reach the minimum; and a pause between Polly's 5 s
// and MassTransit's and Dapr's 60 s, growing to Wolverine's 5 minutes while probes keep failing.
const (
	defaultOutageConsecutiveFailures = 10
	defaultOutageFailureRate         = 0.5
	defaultOutageWindow              = time.Minute
	defaultOutageMinAttempts         = 20
	defaultOutageOpenFor             = 30 * time.Second
	defaultOutageMaxOpenFor          = 5 * time.Minute
	defaultOutageHealthCheckTimeout  = 10 * time.Second
)

// outageConfig is outage.Options with the defaults applied.
type outageConfig struct {
	consecutive  int // 0: rule off
	rate         float64
	window       time.Duration
	minAttempts  int
	openFor      time.Duration
	maxOpenFor   time.Duration
	healthCheck  func(context.Context) error
	checkTimeout time.Duration
	counts       func(error) bool
}

func validateOutage(o *outage.Options) error {
	if o == nil {
		return nil
	}
	field := func(name string) string { return "Outage." + name }
	switch {
	case o.ConsecutiveFailures < 0 && o.FailureRate < 0:
		return &OptionError{Field: field("ConsecutiveFailures"), Reason: "and FailureRate must not both be off"}
	case math.IsNaN(o.FailureRate) || o.FailureRate > 1:
		return &OptionError{Field: field("FailureRate"), Reason: "must be at most 1"}
	case o.Window < 0:
		return &OptionError{Field: field("Window"), Reason: "must not be negative"}
	case o.MinAttempts < 0:
		return &OptionError{Field: field("MinAttempts"), Reason: "must not be negative"}
	case o.OpenFor < 0:
		return &OptionError{Field: field("OpenFor"), Reason: "must not be negative"}
	case o.MaxOpenFor < 0:
		return &OptionError{Field: field("MaxOpenFor"), Reason: "must not be negative"}
	case o.HealthCheckTimeout < 0:
		return &OptionError{Field: field("HealthCheckTimeout"), Reason: "must not be negative"}
	}
	if c := resolveOutage(o); c.maxOpenFor < c.openFor {
		return &OptionError{Field: field("MaxOpenFor"), Reason: "must not be below OpenFor (" + c.openFor.String() + ")"}
	}
	return nil
}

func resolveOutage(o *outage.Options) *outageConfig {
	if o == nil {
		return nil
	}
	c := &outageConfig{
		consecutive: orInt(o.ConsecutiveFailures, defaultOutageConsecutiveFailures),
		rate:        o.FailureRate,
		window:      orDur(o.Window, defaultOutageWindow),
		minAttempts: orInt(o.MinAttempts, defaultOutageMinAttempts),
		openFor:     orDur(o.OpenFor, defaultOutageOpenFor),
		maxOpenFor:  orDur(o.MaxOpenFor, defaultOutageMaxOpenFor),
		healthCheck: o.HealthCheck, checkTimeout: orDur(o.HealthCheckTimeout, defaultOutageHealthCheckTimeout),
		counts: o.Counts,
	}
	if c.consecutive < 0 {
		c.consecutive = 0
	}
	switch {
	case c.rate == 0:
		c.rate = defaultOutageFailureRate
	case c.rate < 0:
		c.rate = 0
	}
	return c
}
