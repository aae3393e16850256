package retry

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sbretry/retry/backoff"
	"github.com/sbretry/retry/internal/redact"
)

// Policies: what a failed attempt becomes, chosen by its error. The processor asks, in this order:
//
//  1. [Permanent]: the handler said the message cannot succeed; it is dead-lettered at once.
//  2. The rules of the [Route] that took the message (see [Router]), then Options.Policies: the first
//     [Rule] whose Match reports true decides.
//  3. The Options themselves (ImmediateRetries, ImmediateDelay, Backoff, MaxAttempts) when no rule
//     matches; a matching rule's zero fields take the Options' values too.
//
// [RetryAfter] then replaces the chosen backoff's delay for that one retry, within the backoff's cap.

// Action is what a [Policy] does with a failed attempt.
type Action int

const (
	// ActionRetry (the zero value): immediate retries, then a delayed retry, until MaxAttempts.
	ActionRetry Action = iota
	// ActionDeadLetter dead-letters the message at once, with Policy.Reason.
	ActionDeadLetter
	// ActionDiscard completes the message without success and logs a warning: for messages whose
	// failure nobody needs to see again (an event about something deleted since, say). The result is
	// [OutcomeDiscarded].
	ActionDiscard
)

func (a Action) String() string {
	switch a {
	case ActionRetry:
		return "retry"
	case ActionDeadLetter:
		return "dead-letter"
	case ActionDiscard:
		return "discard"
	}
	return "unknown"
}

// Limits of a [Policy]'s immediate retries: they run in the same delivery, holding its lock and its
// handler slot, so they are meant to be few and quick; longer waits belong to the delayed retries.
const (
	maxImmediateRetries = 100
	maxImmediateDelay   = time.Minute
)

// Policy says what a failed attempt becomes. Zero fields take the [Options]' values, so a rule states
// only what differs.
type Policy struct {
	// Action is what happens to the message: [ActionRetry] (the zero value), [ActionDeadLetter] or
	// [ActionDiscard].
	Action Action
	// ImmediateRetries is how many times the handler is called again at once, in the same delivery,
	// before a delayed retry is scheduled; each counts as an attempt (the handler sees the Envelope's
	// Attempt grow and LastError set); a [RetryAfter] answer ends them. Zero means
	// Options.ImmediateRetries; negative means none.
	ImmediateRetries int
	// ImmediateDelay is the wait before each immediate retry, at most 1 minute. Zero means
	// Options.ImmediateDelay.
	ImmediateDelay time.Duration
	// Backoff chooses the delayed retry's delay. Nil means Options.Backoff. Its cap bounds the delay,
	// RetryAfter's included.
	Backoff backoff.Backoff
	// MaxAttempts is the attempt after which the message is dead-lettered. Zero means
	// Options.MaxAttempts.
	MaxAttempts int
	// Reason is the dead-letter reason of [ActionDeadLetter]. Empty means DeadLetterReasons.Permanent.
	Reason string
	// NotOutage keeps the failures this policy takes out of the outage breaker's count (see
	// [outage.Options]): a bad message is not an outage. Permanent failures never count.
	NotOutage bool
}

// Rule gives the errors Match reports true for their own [Policy].
type Rule struct {
	// Name names the rule in logs and in [Result].Policy. Empty means "rule <index>".
	Name string
	// Match reports whether the rule takes the error; [ErrorIs] and [ErrorAs] build the common ones.
	// It must not be nil.
	Match  func(error) bool
	Policy Policy
}

// ErrorIs returns a Match function for the errors that are target, by [errors.Is].
func ErrorIs(target error) func(error) bool {
	return func(err error) bool { return errors.Is(err, target) }
}

// ErrorAs returns a Match function for the errors that have an E in their chain, by [errors.As]:
// ErrorAs[*net.OpError]().
func ErrorAs[E error]() func(error) bool {
	return func(err error) bool {
		var e E
		return errors.As(err, &e)
	}
}

// policy is a Policy with the Options' values filled in, and its backoff's cap.
type policy struct {
	name        string
	action      Action
	immediate   int
	immDelay    time.Duration
	backoff     backoff.Backoff
	maxDelay    time.Duration
	maxAttempts int
	reason      string
	notOutage   bool
}

// validatePolicy reports the first invalid field of p; field names the policy in the error.
func validatePolicy(field string, p Policy) error {
	switch {
	case p.Action < ActionRetry || p.Action > ActionDiscard:
		return &OptionError{Field: field + ".Action", Reason: "unknown action " + strconv.Itoa(int(p.Action))}
	case p.ImmediateRetries > maxImmediateRetries:
		return &OptionError{Field: field + ".ImmediateRetries", Reason: "must not exceed " + strconv.Itoa(maxImmediateRetries)}
	case p.ImmediateDelay < 0:
		return &OptionError{Field: field + ".ImmediateDelay", Reason: "must not be negative"}
	case p.ImmediateDelay > maxImmediateDelay:
		return &OptionError{Field: field + ".ImmediateDelay", Reason: "must not exceed " + maxImmediateDelay.String() + "; use the delayed retries for longer waits"}
	case p.MaxAttempts < 0:
		return &OptionError{Field: field + ".MaxAttempts", Reason: "must not be negative"}
	}
	if v, ok := p.Backoff.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return &OptionError{Field: field + ".Backoff", Reason: err.Error()}
		}
	}
	return nil
}

// validateRules reports the first invalid rule; field names the list ("Policies", or a route's).
func validateRules(field string, rules []Rule) error {
	for i, r := range rules {
		name := field + "[" + strconv.Itoa(i) + "]"
		if r.Match == nil {
			return &OptionError{Field: name + ".Match", Reason: "must not be nil"}
		}
		if err := validatePolicy(name+".Policy", r.Policy); err != nil {
			return err
		}
	}
	return nil
}

// fallbackPolicy is the policy of a failure no rule takes: the Options'.
func (c *config) fallbackPolicy() policy {
	return policy{action: ActionRetry, immediate: c.immediate, immDelay: c.immediateDelay, backoff: c.backoff,
		maxDelay: c.maxDelay, maxAttempts: c.maxAttempts, reason: c.reasons.Permanent}
}

// resolve fills r's zero fields from the Options; i is its index, for a rule without a name.
func (r Rule) resolve(c *config, i int) policy {
	p := c.fallbackPolicy()
	p.name = r.Name
	if p.name == "" {
		p.name = "rule " + strconv.Itoa(i)
	}
	q := r.Policy
	p.action = q.Action
	switch {
	case q.ImmediateRetries < 0:
		p.immediate = 0
	case q.ImmediateRetries > 0:
		p.immediate = q.ImmediateRetries
	}
	if q.ImmediateDelay > 0 {
		p.immDelay = q.ImmediateDelay
	}
	if q.Backoff != nil {
		p.backoff, p.maxDelay = q.Backoff, backoff.DefaultCap
		if b, ok := q.Backoff.(backoff.DelayBounds); ok {
			_, p.maxDelay = b.Bounds()
		}
	}
	if q.MaxAttempts > 0 {
		p.maxAttempts = q.MaxAttempts
	}
	if q.Reason != "" {
		p.reason = q.Reason
	}
	p.notOutage = q.NotOutage
	return p
}

// policyFor returns the policy of a failed attempt's error: the first matching rule of the route that
// took the message (if a [Router] did), then of Options.Policies, else the Options'. A Match that
// panics is treated as not matching, and logged, so that one bad rule cannot lose a message.
func (c *config) policyFor(err error) policy {
	if IsPermanent(err) {
		return c.fallbackPolicy() // the handler's own word comes first: no rule is asked
	}
	if re := routeOf(err); re != nil {
		for i, r := range re.route.rules {
			if c.matches(r, err) {
				return r.resolve(c, i)
			}
		}
	}
	for i, r := range c.policies {
		if c.matches(r, err) {
			return r.resolve(c, i)
		}
	}
	return c.fallbackPolicy()
}

// routeOf returns the route error in err's chain, if a Router's route handled the message: errors.As
// without its allocation (its target escapes), which every failure would pay.
func routeOf(err error) *routeError {
	for err != nil {
		switch e := err.(type) {
		case *routeError:
			return e
		case interface{ Unwrap() error }:
			err = e.Unwrap()
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				if re := routeOf(inner); re != nil {
					return re
				}
			}
			return nil
		default:
			return nil
		}
	}
	return nil
}

// matches calls r.Match, recovering from a panic.
func (c *config) matches(r Rule, err error) (ok bool) {
	defer func() {
		if v := recover(); v != nil {
			c.logger.Error("a retry policy's Match panicked; treating it as not matching", "rule", r.Name, "panic", redact.String(fmt.Sprint(v)))
			ok = false
		}
	}()
	return r.Match(err)
}
