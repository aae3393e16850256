package inspect

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// Defaults applied by [New] to zero fields of [Options].
const (
	// DefaultMaxPeek is the default bound on the messages one call peeks from each entity it reads.
	DefaultMaxPeek = 10_000
	// DefaultPeekBatchSize is the default number of messages asked for in one peek request. Service Bus
	// may return fewer (it caps a reply by size); the scan simply asks again.
	DefaultPeekBatchSize = 250
	// DefaultPageLimit is the page size of [Inspector.ListPending] when [PageOptions.Limit] is zero.
	DefaultPageLimit = 100
	// DefaultMaxSessions is the default bound on the sessions [Inspector.ListHeldSessions] reads.
	DefaultMaxSessions = 1000
	// closeTimeout bounds closing the links a call opened, even when the call's context is done.
	closeTimeout = 10 * time.Second
)

// Options configures an [Inspector]. A nil *Options means every default.
type Options struct {
	// MaxPeek bounds how many messages one call peeks from each entity it reads (the entity, its
	// retry queue when that is another queue, and its dead-letter queue), so that inspecting a huge
	// entity costs a known amount and ends. When a scan stops at the bound, its [Scan] says Truncated.
	// Zero means [DefaultMaxPeek] (10,000); negative is invalid.
	MaxPeek int

	// PeekBatchSize is how many messages one peek request asks for. Zero means
	// [DefaultPeekBatchSize] (250); it is capped at MaxPeek; negative is invalid.
	PeekBatchSize int

	// RetryQueue is the queue on which the consumer schedules its retry copies (the entity of its
	// Sender), when that is not the inspected entity itself. For a queue, empty means the queue: the
	// retry library's queue connectors republish to the queue they receive from. A subscription cannot
	// be sent to, so its copies are scheduled on a queue of its own (the retryQueue argument of
	// [retry.Namespace.Subscription]), and its last attempts are dead-lettered there: RetryQueue
	// is required for a subscription, and [New] refuses one without it ([ErrNoRetryQueue]). It must
	// name a queue: a topic cannot be peeked.
	RetryQueue string

	// SessionConsumer says the entity is consumed by a retry.SessionConsumer, which holds its retries
	// in the session (in memory, or durably in the session state) and schedules no retry copies: its
	// messages and its dead letters are all in the entity itself. A subscription then needs no
	// RetryQueue, which must be empty, and has no pending retry to cancel. The entity requires sessions,
	// so only its dead-letter queue can be peeked as a whole; the calls that would peek the entity
	// itself (ListPending, Status, Counts) return [ErrSessionEntity], and its sessions are read with
	// ListHeldSessions.
	SessionConsumer bool

	// MaxSessions bounds how many sessions one [Inspector.ListHeldSessions] reads: each costs an accept
	// of the session, a read of its state and a peek, so that listing a session entity with many
	// sessions costs a known amount and ends. When the listing stops at the bound, [HeldSessions] says
	// Truncated. Zero means [DefaultMaxSessions] (1,000); negative is invalid.
	MaxSessions int

	// WakeTo is, for a session subscription (SessionConsumer), the topic (or a queue or topic
	// forwarding into it) [Inspector.Release] sends a session's wake-up to. A subscription cannot be
	// sent to, and a send to its topic reaches every subscription whose rules accept it, so the wake-up
	// carries [PropWakeTo], the subscription's path, for rules to route it by: set WakeTo only where
	// the topic's rules deliver a message carrying PropWakeTo to the subscription it names and to no
	// other (docs/console.md has such rules). Release then checks that the wake-up reached the
	// session before it writes the state. Empty means a subscription's sessions cannot be released
	// ([ErrUnknownEntity]); it must be empty for a queue (whose wake-ups go to the queue itself) and
	// name a queue or a topic.
	WakeTo string

	// Observer, when set, is told about every broker call the Inspector makes (each peek request,
	// cancel, session accept, state read and write, and wake-up send) and, through [Inspector.Observer], every call of a redrive or purge of its selections:
	// github.com/sbretry/retry/retryotel's Instrumentation traces and measures them. Nil means none.
	Observer Observer
}

// withDefaults validates o and returns a copy with every zero field replaced by its default.
func (o *Options) withDefaults() (Options, error) {
	var c Options
	if o != nil {
		c = *o
	}
	switch {
	case c.MaxPeek < 0:
		return c, fmt.Errorf("%w: MaxPeek %d is negative", ErrInvalidOptions, c.MaxPeek)
	case c.MaxSessions < 0:
		return c, fmt.Errorf("%w: MaxSessions %d is negative", ErrInvalidOptions, c.MaxSessions)
	case c.PeekBatchSize < 0:
		return c, fmt.Errorf("%w: PeekBatchSize %d is negative", ErrInvalidOptions, c.PeekBatchSize)
	case strings.Contains(c.RetryQueue, "/"):
		return c, fmt.Errorf("%w: RetryQueue %q must name a queue", ErrInvalidOptions, c.RetryQueue)
	case strings.Contains(c.WakeTo, "/"):
		return c, fmt.Errorf("%w: WakeTo %q must name a topic or a queue", ErrInvalidOptions, c.WakeTo)
	case c.WakeTo != "" && !c.SessionConsumer:
		return c, fmt.Errorf("%w: WakeTo %q without SessionConsumer: only a session consumer's sessions are released", ErrInvalidOptions, c.WakeTo)
	case c.SessionConsumer && c.RetryQueue != "":
		return c, fmt.Errorf("%w: RetryQueue %q with SessionConsumer: a session consumer schedules no retry copies", ErrInvalidOptions, c.RetryQueue)
	}
	if c.MaxPeek == 0 {
		c.MaxPeek = DefaultMaxPeek
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = DefaultMaxSessions
	}
	if c.PeekBatchSize == 0 {
		c.PeekBatchSize = DefaultPeekBatchSize
	}
	c.PeekBatchSize = min(c.PeekBatchSize, c.MaxPeek)
	return c, nil
}

// peeker lists the method of *azservicebus.Receiver the inspector calls: it only ever peeks.
type peeker interface {
	PeekMessages(ctx context.Context, maxMessageCount int, options *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	Close(ctx context.Context) error
}

// canceller lists the method of *azservicebus.Sender that [Inspector.Cancel] calls.
type canceller interface {
	CancelScheduledMessages(ctx context.Context, sequenceNumbers []int64, options *azservicebus.CancelScheduledMessagesOptions) error
	Close(ctx context.Context) error
}

// Compile-time proof that the SDK's types satisfy the interfaces above.
var (
	_ peeker    = (*azservicebus.Receiver)(nil)
	_ canceller = (*azservicebus.Sender)(nil)
)

// source is one entity a scan reads.
type source int

const (
	sourceEntity          source = iota // the queue or subscription
	sourceRetryQueue                    // Options.RetryQueue, when it is another entity
	sourceDeadLetter                    // the entity's dead-letter queue
	sourceRetryDeadLetter               // the retry queue's dead-letter queue, when it is another entity
)

// links opens the receivers and senders an Inspector uses; tests substitute fakes.
type links interface {
	peeker(s source) (peeker, error)
	// canceller opens a sender on the queue behind s (sourceEntity for a queue, or sourceRetryQueue).
	canceller(s source) (canceller, error)
}

// Inspector reads the retry state of one entity: the entity, its retry queue when that is another
// queue (always, for a subscription, unless a session consumer consumes it: [Options.SessionConsumer]),
// and the dead-letter queues of both. Create it with [New]; the
// zero value is not usable. It is safe for concurrent use and holds no resources between calls (see
// the package documentation), so it needs no Close; close the client when done.
type Inspector struct {
	entity Entity
	opts   Options
	links  links
	// sessions opens the session links of [Inspector.ListHeldSessions] and the release; nil when the
	// links given to newInspector have none (the fakes of the peek tests).
	sessions sessionLinks
}

// New returns an Inspector over entity (a queue name, or "topic/Subscriptions/subscription") through
// client. It does not contact Service Bus: a missing entity or a credential without Listen rights is
// reported by the first call. Errors wrap [ErrInvalidEntity], [ErrInvalidOptions], or for a
// subscription without [Options.RetryQueue] (nor [Options.SessionConsumer]), [ErrNoRetryQueue].
func New(client *azservicebus.Client, entity string, opts *Options) (*Inspector, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil client", ErrInvalidOptions)
	}
	e, err := ParseEntity(entity)
	if err != nil {
		return nil, err
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if e.IsSubscription() && o.RetryQueue == "" && !o.SessionConsumer {
		return nil, fmt.Errorf("%w %s: set Options.RetryQueue to the queue its consumer schedules retries on (or Options.SessionConsumer, if a retry.SessionConsumer consumes it)", ErrNoRetryQueue, e)
	}
	if o.WakeTo != "" && !e.IsSubscription() {
		return nil, fmt.Errorf("%w: WakeTo %q for queue %s: a queue's wake-ups go to the queue itself", ErrInvalidOptions, o.WakeTo, e)
	}
	return newInspector(e, o, &clientLinks{client: client, entity: e, retryQueue: o.RetryQueue, wakeTo: o.WakeTo}), nil
}

func newInspector(e Entity, o Options, l links) *Inspector {
	in := &Inspector{entity: e, opts: o, links: l}
	in.sessions, _ = l.(sessionLinks)
	return in
}

// Entity returns the inspected entity.
func (in *Inspector) Entity() Entity { return in.entity }

// separateRetryQueue reports whether the retry queue is an entity of its own that scans must read.
func (in *Inspector) separateRetryQueue() bool {
	rq := in.opts.RetryQueue
	return rq != "" && !strings.EqualFold(rq, in.entity.Queue)
}

// sourcePath names the entity behind s, as Scan and the result types report it.
func (in *Inspector) sourcePath(s source) string {
	switch s {
	case sourceRetryQueue:
		return in.opts.RetryQueue
	case sourceDeadLetter:
		return in.entity.DeadLetterPath()
	case sourceRetryDeadLetter:
		return in.opts.RetryQueue + "/$DeadLetterQueue"
	}
	return in.entity.Path()
}

// clientLinks opens links on an *azservicebus.Client.
type clientLinks struct {
	client     *azservicebus.Client
	entity     Entity
	retryQueue string
	wakeTo     string // Options.WakeTo
}

func (c *clientLinks) peeker(s source) (peeker, error) {
	// Peek-lock is the SDK's default mode; the inspector never receives on these links, it only
	// peeks, which neither locks nor settles anything in any mode.
	var opts azservicebus.ReceiverOptions
	if s == sourceDeadLetter || s == sourceRetryDeadLetter {
		opts.SubQueue = azservicebus.SubQueueDeadLetter
	}
	switch {
	case s == sourceRetryQueue || s == sourceRetryDeadLetter:
		return c.client.NewReceiverForQueue(c.retryQueue, &opts)
	case c.entity.IsSubscription():
		return c.client.NewReceiverForSubscription(c.entity.Topic, c.entity.Subscription, &opts)
	default:
		return c.client.NewReceiverForQueue(c.entity.Queue, &opts)
	}
}

func (c *clientLinks) canceller(s source) (canceller, error) {
	if s == sourceRetryQueue {
		return c.client.NewSender(c.retryQueue, nil)
	}
	if c.entity.IsSubscription() {
		return nil, fmt.Errorf("inspect: %s is a subscription, which cannot be sent to", c.entity)
	}
	return c.client.NewSender(c.entity.Queue, nil)
}

// closeQuietly closes a link the call opened, bounded even when ctx is already done: the close
// errors of a read-only link change nothing for the caller.
func closeQuietly(ctx context.Context, c interface{ Close(context.Context) error }) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	_ = c.Close(cctx)
}
