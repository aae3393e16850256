package console

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/sbretry/retry/inspect"
	"github.com/sbretry/retry/internal/dlqaction"
)

// Defaults applied by [New] to zero fields of [Options].
const (
	// DefaultPollInterval is how often [Console.Run] reads every entity for the overview's charts.
	DefaultPollInterval = 15 * time.Second
	// DefaultWindow is how far back the overview's charts reach.
	DefaultWindow = time.Hour
	// DefaultMaxPeek bounds the messages one read peeks from each entity: lower than the CLI's,
	// because a page reads every time it is shown.
	DefaultMaxPeek = inspect.DefaultMaxPeek
	// DefaultPageSize is the number of rows of a paged list.
	DefaultPageSize = 50
	// DefaultAlertThreshold is the dead-letter count at which an entity is flagged.
	DefaultAlertThreshold = 1
	// DefaultActionTimeout bounds one redrive, purge or cancel request, or one batch of a run of more
	// than BatchSize messages.
	DefaultActionTimeout = 2 * time.Minute
	// DefaultBatchSize is how many messages one batch of a run acts on.
	DefaultBatchSize = 100
)

// ErrInvalidOptions is wrapped by the errors [New] returns for invalid [Options] or entities.
var ErrInvalidOptions = errors.New("console: invalid options")

// Entity is one queue or subscription the console shows.
type Entity struct {
	// Path is a queue name, or "topic/Subscriptions/subscription".
	Path string
	// RetryQueue is the queue the entity's consumer schedules its retry copies on, when that is not the
	// entity itself: required for a subscription, unless SessionConsumer is set (see
	// [inspect.Options.RetryQueue]).
	RetryQueue string
	// RedriveTo is the queue a redrive sends fresh deliveries to. Empty means the queue itself, and for
	// a subscription its RetryQueue, which reaches that subscription's consumer only (its topic would
	// deliver to every subscription and is refused); a session subscription has none, and its redrives
	// are refused until RedriveTo names a queue.
	RedriveTo string
	// SessionConsumer says the entity requires sessions and a retry.SessionConsumer consumes it
	// ([inspect.Options.SessionConsumer]): it has no retry queue (RetryQueue must be empty, even for
	// a subscription), its retries are held in its sessions, shown on its held-sessions page, and a
	// queue's held sessions can be released there. Without it, an entity that refuses a plain receiver
	// and lists sessions is recognised as one at its first read.
	SessionConsumer bool
	// WakeTo is, for a session subscription, the topic (or a queue or topic forwarding into it) a
	// release of one of its held sessions sends the wake-up to, the wake-up carrying the application
	// property sbretry-wake-to ([inspect.PropWakeTo]) with the subscription's path: set it only where
	// the topic's rules deliver such a message to this subscription and to no other (docs/console.md
	// shows the rules). The release writes the session's state only once the wake-up is in the
	// session. Empty means a subscription's sessions are listed but not released (a plain send to its
	// topic would reach every subscription). It must be empty for a queue.
	WakeTo string
	// MaxAttempts is the entity's consumer's retry.Options.MaxAttempts, so that the search page says
	// "attempt n of m" of the entity's events. Zero means not given: the page says "attempt n" alone
	// (the console cannot read the bound from the broker); negative is invalid.
	MaxAttempts int
}

// Options configures a [Console]. A nil *Options means every default; a zero field means its default.
type Options struct {
	// PollInterval is how often [Console.Run] reads the entities. Zero means [DefaultPollInterval]
	// (15 s); negative is invalid.
	PollInterval time.Duration
	// Window is how much history the overview keeps in memory and charts: Window/PollInterval samples.
	// Zero means [DefaultWindow] (1 h); negative, or shorter than PollInterval, is invalid.
	Window time.Duration
	// MaxPeek bounds the messages one read peeks from each entity ([inspect.Options.MaxPeek]). Zero
	// means [DefaultMaxPeek] (10,000); negative is invalid.
	MaxPeek int
	// PageSize is the rows of a paged list. Zero means [DefaultPageSize] (50); negative is invalid.
	PageSize int
	// AlertThreshold is the dead-letter count at which the overview flags an entity (it also flags one
	// whose count grew since the previous poll). Zero means [DefaultAlertThreshold] (1); negative is
	// invalid.
	AlertThreshold int
	// ShowBodies shows message bodies on the message page. Off by default: bodies hold customer data.
	ShowBodies bool
	// FilterBodies lets the dead-letter and pending pages filter by body text (and act on all the
	// messages whose body matches). Off by default: bodies hold customer data, and a filter by body
	// reads and compares every body of the messages read (never shown, logged or audited: the audit
	// record says only that a body filter of so many characters was used). Without it a body filter is
	// refused with 400.
	FilterBodies bool
	// BatchSize is how many messages one batch of a run acts on: a run of more (an action on all
	// matching, or a large group) is carried out a batch at a time, each bounded by ActionTimeout, and
	// its page shows the progress after each batch as it goes. Zero means [DefaultBatchSize] (100);
	// negative is invalid.
	BatchSize int
	// AccessToken, when set, is required on every request (see the package documentation): it is one
	// operator token, named "access-token" in the audit log. Empty means none. Set Tokens instead to
	// give readers and operators tokens of their own; setting both is invalid.
	AccessToken string
	// Tokens are the console's access tokens, each with a name and a [Role]: with any, every request
	// must present one of them, a [RoleReader] token reads only (no action buttons; actions refused with
	// 403), and the audit log names the token of every action. Invalid tokens (see [Token]) make [New]
	// fail. Nil, with AccessToken empty too, means no token: the console answers only to loopback
	// names and AllowedHosts, and everyone it answers may act, as an operator without a name.
	Tokens []Token
	// AllowedHosts are the Host names (without port) the console answers to without tokens.
	// Empty means loopback names only (localhost, 127.0.0.1, [::1]): a console without a token relies on
	// being reachable from this machine only, and DNS rebinding defeats that (a page of another site,
	// its name made to resolve to 127.0.0.1, would be same-origin with the console under that name).
	// Set it to the names your own middleware protects when you mount the console behind it. With an
	// access token, every Host is accepted.
	AllowedHosts []string
	// ReceiveWait is how long a redrive or purge waits for a dead letter to be received
	// ([dlqaction.Options.Wait]). Zero means [dlqaction.DefaultWait] (5 s); negative is invalid.
	ReceiveWait time.Duration
	// ActionTimeout bounds one action request, or one batch of a run of more than BatchSize messages.
	// Zero means [DefaultActionTimeout] (2 min); negative is invalid.
	ActionTimeout time.Duration
	// AuditFile is the path of the audit log: every action (redrive, purge, cancel, release), refused
	// ones included, is appended to it as one JSON line ([AuditRecord]) and synced to disk, and the
	// audit page reads it back. The file is created (mode 0600) if need be, and only ever appended to;
	// [New] fails if it cannot be opened for appending, and a run whose record cannot be written is not
	// carried out. Empty means the audit page shows the last 1,000 records (listing at most 100,000
	// messages in all) kept in memory, lost when the process ends; the log lines (Logger) are written
	// either way.
	AuditFile string
	// Logger receives one structured line per audited action ([AuditRecord]'s fields; never a token's
	// secret, never a message body). Nil means slog.Default().
	Logger *slog.Logger
	// Observer, when set, is told about every broker call the console makes for its pages and
	// actions ([inspect.Options].Observer): github.com/sbretry/retry/retryotel's Instrumentation
	// traces and measures them. Nil means none.
	Observer inspect.Observer
	// Index, when set, answers the search page (/search) from a retry-state index instead of a scan of
	// the broker: a [retryindex.Store] (retryindex.OpenSQLite with ReadOnly, or retryindex/postgres)
	// kept by the consumers' recorders or a tailer. Each answer then has the event's attempt history
	// and says how fresh it is; every action it offers is still previewed against the broker. The
	// console never closes it. Nil means the search page scans each entity up to MaxPeek messages and
	// says when the answer is partial.
	Index Index
	// IndexDedicated says the Index holds the events of this console's one entity only: the pages then
	// list and count the whole index instead of the entity's events, and a page that meets another
	// entity's event says so and leaves it out. It requires Index and exactly one entity. False means
	// every page lists and counts by source entity, which the stores answer from their indexes and
	// counts by source, as fast as the whole index at any backlog (BenchmarkPagesFromIndex).
	//
	// Deprecated: it made a console on a large index fast when the stores could only filter by
	// source with a scan; they index by source now. It still works as described, for existing
	// deployments, and will be removed in a later major version.
	IndexDedicated bool
}

// withDefaults validates o and returns a copy with every zero field replaced by its default.
func (o *Options) withDefaults() (Options, error) {
	var c Options
	if o != nil {
		c = *o
	}
	for name, d := range map[string]time.Duration{"PollInterval": c.PollInterval, "Window": c.Window, "ReceiveWait": c.ReceiveWait, "ActionTimeout": c.ActionTimeout} {
		if d < 0 {
			return c, fmt.Errorf("%w: %s %v is negative", ErrInvalidOptions, name, d)
		}
	}
	for name, n := range map[string]int{"MaxPeek": c.MaxPeek, "PageSize": c.PageSize, "AlertThreshold": c.AlertThreshold, "BatchSize": c.BatchSize} {
		if n < 0 {
			return c, fmt.Errorf("%w: %s %d is negative", ErrInvalidOptions, name, n)
		}
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	defInt := func(n *int, v int) {
		if *n == 0 {
			*n = v
		}
	}
	def(&c.PollInterval, DefaultPollInterval)
	def(&c.Window, DefaultWindow)
	def(&c.ReceiveWait, dlqaction.DefaultWait)
	def(&c.ActionTimeout, DefaultActionTimeout)
	defInt(&c.MaxPeek, DefaultMaxPeek)
	defInt(&c.PageSize, DefaultPageSize)
	defInt(&c.AlertThreshold, DefaultAlertThreshold)
	defInt(&c.BatchSize, DefaultBatchSize)
	if _, err := validateTokens(c); err != nil {
		return c, err
	}
	if c.Window < c.PollInterval {
		return c, fmt.Errorf("%w: Window %v is shorter than PollInterval %v", ErrInvalidOptions, c.Window, c.PollInterval)
	}
	return c, nil
}

// validate checks an entity and returns its parsed path and redrive target.
func (e Entity) validate() (inspect.Entity, string, error) {
	pe, err := inspect.ParseEntity(e.Path)
	if err != nil {
		return pe, "", fmt.Errorf("%w: entity: %w", ErrInvalidOptions, err)
	}
	if strings.Contains(e.RetryQueue, "/") || strings.Contains(e.RedriveTo, "/") {
		return pe, "", fmt.Errorf("%w: entity %s: RetryQueue and RedriveTo must name queues", ErrInvalidOptions, e.Path)
	}
	if strings.Contains(e.WakeTo, "/") || (e.WakeTo != "" && !pe.IsSubscription()) {
		return pe, "", fmt.Errorf("%w: entity %s: WakeTo names the topic a subscription's wake-ups are sent to (a queue's go to the queue)", ErrInvalidOptions, e.Path)
	}
	if e.MaxAttempts < 0 {
		return pe, "", fmt.Errorf("%w: entity %s: MaxAttempts %d is negative", ErrInvalidOptions, e.Path, e.MaxAttempts)
	}
	if e.SessionConsumer && e.RetryQueue != "" {
		return pe, "", fmt.Errorf("%w: entity %s: a session consumer has no RetryQueue", ErrInvalidOptions, e.Path)
	}
	if pe.IsSubscription() && e.RetryQueue == "" && !e.SessionConsumer {
		return pe, "", fmt.Errorf("%w: subscription %s needs its RetryQueue", ErrInvalidOptions, e.Path)
	}
	// A subscription's default target is its retry queue: the one queue known to reach that
	// subscription's consumer only. Its topic would fan the message out to every subscription.
	to := e.RedriveTo
	if to == "" && pe.IsSubscription() {
		if e.SessionConsumer {
			// No queue is known to reach this subscription's consumer only: redrives are refused
			// until RedriveTo names one.
			return pe, "", nil
		}
		to = e.RetryQueue
	}
	target, err := dlqaction.Target(pe, to)
	if err != nil {
		return pe, "", fmt.Errorf("%w: entity %s: %w", ErrInvalidOptions, e.Path, err)
	}
	return pe, target, nil
}
