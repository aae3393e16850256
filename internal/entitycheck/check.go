package entitycheck

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"

	"github.com/sbretry/retry/internal/entitypath"
)

// Getter is the part of *admin.Client that [Check] calls.
type Getter interface {
	GetQueue(ctx context.Context, queueName string, options *admin.GetQueueOptions) (*admin.GetQueueResponse, error)
	GetSubscription(ctx context.Context, topicName string, subscriptionName string, options *admin.GetSubscriptionOptions) (*admin.GetSubscriptionResponse, error)
}

var _ Getter = (*admin.Client)(nil)

// Defaults for [Options]; each applies when its field is zero.
const (
	// DefaultSettleTimeout matches the consumer's default SettleTimeout (30 s).
	DefaultSettleTimeout = 30 * time.Second
	// DefaultHandlerAllowance is the handler run time assumed when the
	// caller does not know its own.
	DefaultHandlerAllowance = time.Minute
	// DefaultMinMaxDeliveryCount is the lowest MaxDeliveryCount not warned
	// about.
	DefaultMinMaxDeliveryCount = 5
)

// Options tune the thresholds. The zero value gives the defaults.
type Options struct {
	// SettleTimeout is the consumer's settle timeout. Zero means
	// [DefaultSettleTimeout].
	SettleTimeout time.Duration
	// HandlerAllowance is the longest the handler runs. Zero means
	// [DefaultHandlerAllowance].
	HandlerAllowance time.Duration
	// MinMaxDeliveryCount is the lowest MaxDeliveryCount accepted without
	// a warning. Zero means [DefaultMinMaxDeliveryCount].
	MinMaxDeliveryCount int32
	// RetryQueue, for a subscription, is the queue its retry copies are
	// sent to (retry.Namespace.Subscription's retry queue): duplicate
	// detection is checked there, with the longer of the two lock
	// durations. Empty checks the subscription alone (copies to a topic
	// are not checked here). Ignored for a queue, whose copies go back to
	// the queue itself.
	RetryQueue string
}

// Code identifies a kind of [Warning].
type Code string

// The warnings [Check] can return.
const (
	DuplicateDetectionOff         Code = "DuplicateDetectionOff"
	DuplicateDetectionWindowShort Code = "DuplicateDetectionWindowShort"
	MaxDeliveryCountLow           Code = "MaxDeliveryCountLow"
	// RequiresSession is an entity that requires sessions: retry copies scheduled to it rejoin their
	// session behind later messages. It comes first, before the crash-contract warnings.
	RequiresSession Code = "RequiresSession"
)

// Warning is one setting that weakens the crash contract.
type Warning struct {
	Code Code
	// Entity is the path whose setting it is.
	Entity string
	// Message explains the risk and the setting to change, for a log line.
	Message string
}

// ErrNotFound reports an entity the administration API does not know.
var ErrNotFound = errors.New("entitycheck: entity not found")

// settings are the fields Check reads, from a queue or a subscription.
type settings struct {
	path             string
	lock             time.Duration
	maxDelivery      int32
	dedup            bool
	dedupWindow      time.Duration
	dedupApplicable  bool // queues only: subscriptions cannot detect duplicates
	maxDeliveryKnown bool
	requiresSession  bool
}

// Check reads entity ("queue" or "topic/Subscriptions/sub") and, for a
// subscription with opts.RetryQueue, that queue, and returns the warnings
// in a stable order; none means the settings fit the crash contract. It
// makes one or two GET calls, bounded by ctx.
func Check(ctx context.Context, client Getter, entity string, opts *Options) ([]Warning, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.SettleTimeout <= 0 {
		o.SettleTimeout = DefaultSettleTimeout
	}
	if o.HandlerAllowance <= 0 {
		o.HandlerAllowance = DefaultHandlerAllowance
	}
	if o.MinMaxDeliveryCount <= 0 {
		o.MinMaxDeliveryCount = DefaultMinMaxDeliveryCount
	}
	main, err := read(ctx, client, entity)
	if err != nil {
		return nil, err
	}
	var warnings []Warning
	if main.requiresSession {
		warnings = append(warnings, Warning{Code: RequiresSession, Entity: main.path, Message: "RequiresSession is set: " +
			"a retry copy keeps its SessionID and rejoins its session behind the messages that arrived meanwhile, so the session's order is lost"})
	}
	if main.maxDeliveryKnown && main.maxDelivery < o.MinMaxDeliveryCount {
		warnings = append(warnings, Warning{Code: MaxDeliveryCountLow, Entity: main.path, Message: fmt.Sprintf(
			"MaxDeliveryCount is %d, below %d: redeliveries after lost locks or dropped connections will dead-letter messages whose handler never failed; use the default 10 or more",
			main.maxDelivery, o.MinMaxDeliveryCount)})
	}
	target, lock := main, main.lock
	if !main.dedupApplicable {
		if o.RetryQueue == "" {
			return warnings, nil
		}
		rq, err := read(ctx, client, o.RetryQueue)
		if err != nil {
			return nil, err
		}
		target, lock = rq, max(lock, rq.lock)
	}
	need := lock + o.SettleTimeout + o.HandlerAllowance
	switch {
	case !target.dedup:
		warnings = append(warnings, Warning{Code: DuplicateDetectionOff, Entity: target.path, Message: fmt.Sprintf(
			"duplicate detection is off: a crash between scheduling a retry copy and completing the original can leave two copies of one attempt; create the entity with RequiresDuplicateDetection and a window of at least %v",
			need)})
	case target.dedupWindow < need:
		warnings = append(warnings, Warning{Code: DuplicateDetectionWindowShort, Entity: target.path, Message: fmt.Sprintf(
			"the duplicate detection window %v is shorter than lock duration %v + settle timeout %v + handler allowance %v = %v: a copy republished after a crash may not be dropped",
			target.dedupWindow, lock, o.SettleTimeout, o.HandlerAllowance, need)})
	}
	return warnings, nil
}

// read fetches a queue's or a subscription's settings.
func read(ctx context.Context, client Getter, path string) (settings, error) {
	e, err := entitypath.Parse(path)
	if err != nil {
		return settings{}, fmt.Errorf("entitycheck: %w", err)
	}
	if e.IsSubscription() {
		resp, err := client.GetSubscription(ctx, e.Topic, e.Subscription, nil)
		switch {
		case err != nil:
			return settings{}, fmt.Errorf("entitycheck: reading %s: %w", path, err)
		case resp == nil:
			return settings{}, fmt.Errorf("%w: %s", ErrNotFound, path)
		}
		s := settings{path: path, requiresSession: resp.RequiresSession != nil && *resp.RequiresSession}
		if s.lock, err = duration(resp.LockDuration); err != nil {
			return settings{}, fmt.Errorf("entitycheck: %s LockDuration: %w", path, err)
		}
		if resp.MaxDeliveryCount != nil {
			s.maxDelivery, s.maxDeliveryKnown = *resp.MaxDeliveryCount, true
		}
		return s, nil
	}
	resp, err := client.GetQueue(ctx, path, nil)
	switch {
	case err != nil:
		return settings{}, fmt.Errorf("entitycheck: reading %s: %w", path, err)
	case resp == nil:
		return settings{}, fmt.Errorf("%w: %s", ErrNotFound, path)
	}
	s := settings{path: path, dedupApplicable: true, requiresSession: resp.RequiresSession != nil && *resp.RequiresSession}
	if s.lock, err = duration(resp.LockDuration); err != nil {
		return settings{}, fmt.Errorf("entitycheck: %s LockDuration: %w", path, err)
	}
	if resp.MaxDeliveryCount != nil {
		s.maxDelivery, s.maxDeliveryKnown = *resp.MaxDeliveryCount, true
	}
	s.dedup = resp.RequiresDuplicateDetection != nil && *resp.RequiresDuplicateDetection
	if s.dedup {
		if s.dedupWindow, err = duration(resp.DuplicateDetectionHistoryTimeWindow); err != nil {
			return settings{}, fmt.Errorf("entitycheck: %s DuplicateDetectionHistoryTimeWindow: %w", path, err)
		}
	}
	return s, nil
}
