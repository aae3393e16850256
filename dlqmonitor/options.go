package dlqmonitor

import (
	"errors"
	"fmt"
	"time"

	"github.com/sbretry/retry"
)

// Defaults for [Options]; each applies when its field is zero.
const (
	// DefaultInterval is the time between two polls.
	DefaultInterval = time.Minute
	// DefaultThreshold is the dead-letter count that calls the hook: one,
	// because even one message should trigger a look.
	DefaultThreshold = 1
	// DefaultTimeout bounds the call for one entity in one poll.
	DefaultTimeout = 30 * time.Second
)

// Options configure a [Monitor]. Nil options, and every zero field, mean
// the documented default.
type Options struct {
	// Interval is the time from the start of one poll to the start of the
	// next (a poll that takes longer delays the next one, polls never
	// overlap). Zero means [DefaultInterval]; negative is an error.
	Interval time.Duration

	// Threshold is the dead-letter count at or above which OnDeadLetters
	// is called, on every poll while the count stays there. Zero means
	// [DefaultThreshold] (one message); negative is an error.
	Threshold int64

	// Timeout bounds the administration call for one entity in one poll;
	// a call that takes longer is reported to OnError as
	// context.DeadlineExceeded. Zero means [DefaultTimeout], capped at
	// Interval; negative is an error.
	Timeout time.Duration

	// Clock is the source of time: Now stamps the hook parameters and
	// After paces the polls. github.com/benbjohnson/clock's clock.New()
	// and *clock.Mock fit as they are. Nil means [retry.SystemClock],
	// which also works inside testing/synctest.
	Clock retry.Clock

	// OnDeadLetters is called, from the goroutine running [Monitor.Run],
	// for every entity whose dead-letter count is at least Threshold after
	// a poll. It should return quickly (hand slow work such as paging
	// someone to a goroutine of your own): the next entity waits for it.
	// Nil means no call, which makes sense only with OnPoll.
	OnDeadLetters func(DeadLetterParams)

	// OnError is called for every failed read of an entity's count, with
	// the error redacted (a connection string or SAS token in it is
	// replaced by REDACTED) but still matching errors.Is and errors.As. The
	// entity keeps its last known count, so the next successful poll
	// reports what arrived meanwhile as new. Nil means errors are dropped.
	OnError func(ErrorParams)

	// OnPoll is called after every poll with every entity's result, for
	// metrics (dead-letter depth gauges) and tests. Nil means no call.
	OnPoll func(PollParams)
}

// DeadLetterParams describe one entity over the threshold after a poll.
// More fields may be added.
type DeadLetterParams struct {
	// Entity is the path as configured: "orders" or
	// "events/Subscriptions/billing".
	Entity string
	// Count is the entity's DeadLetterMessageCount.
	Count int64
	// New is how much Count grew since the previous successful poll of the
	// entity (the first poll counts from zero, so everything already there
	// is new); zero when it stayed or shrank. It is a net figure: two dead
	// letters arriving while one is purged show as one.
	New int64
	// Time is when the count was read, on [Options.Clock].
	Time time.Time
}

// ErrorParams describe a failed read. More fields may be added.
type ErrorParams struct {
	// Entity is the path as configured.
	Entity string
	// Err is the redacted error; [ErrNotFound] when the entity does not
	// exist. It names the entity and, when the administration client's
	// error carries a request URL, the endpoint ("dlqmonitor: reading
	// orders at https://ns.servicebus.windows.net/: ..."). Every failed
	// read also counts in [Monitor.Health].
	Err error
	// Time is when the read failed.
	Time time.Time
}

// PollParams summarise one poll. More fields may be added.
type PollParams struct {
	// Results holds one entry per configured entity, in configuration order.
	Results []Result
	// Duration is how long the poll took on the real clock.
	Duration time.Duration
}

// Result is what one poll learnt about one entity.
type Result struct {
	Entity string
	Count  int64 // valid when Err is nil
	New    int64 // valid when Err is nil
	Err    error // redacted
}

// ErrNotFound reports an entity the administration API does not know (the
// SDK answers such a read with a nil response).
var ErrNotFound = errors.New("dlqmonitor: entity not found")

// withDefaults validates o and fills in the defaults.
func (o Options) withDefaults() (Options, error) {
	switch {
	case o.Interval < 0:
		return o, fmt.Errorf("dlqmonitor: negative Interval %v", o.Interval)
	case o.Threshold < 0:
		return o, fmt.Errorf("dlqmonitor: negative Threshold %d", o.Threshold)
	case o.Timeout < 0:
		return o, fmt.Errorf("dlqmonitor: negative Timeout %v", o.Timeout)
	}
	if o.Interval == 0 {
		o.Interval = DefaultInterval
	}
	if o.Threshold == 0 {
		o.Threshold = DefaultThreshold
	}
	if o.Timeout == 0 {
		o.Timeout = min(DefaultTimeout, o.Interval)
	}
	if o.Clock == nil {
		o.Clock = retry.SystemClock()
	}
	return o, nil
}
