package broker

import (
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// Defaults applied to zero fields of [QueueConfig]; they are the Service Bus
// defaults so an emulated queue behaves like a freshly created real one.
const (
	DefaultLockDuration     = 60 * time.Second
	DefaultMaxDeliveryCount = 10
	DefaultMaxMessageSize   = 256 * 1024

	// MaxLockDuration is the longest lock Service Bus allows; longer
	// configurations are rejected so tests cannot rely on impossible locks.
	MaxLockDuration = 5 * time.Minute
)

// QueueConfig describes one queue. The zero value of every field except Name
// means "the Service Bus default"; see each field.
type QueueConfig struct {
	// Name is the entity path, compared case-insensitively like Service Bus
	// does. It must be non-empty and must not contain '/', which is reserved
	// for the "<queue>/$DeadLetterQueue" sub-queue path.
	Name string

	// LockDuration is how long a peek-lock delivery stays locked before the
	// message returns to the queue. Zero means 60s; the maximum is 5 minutes.
	LockDuration time.Duration

	// MaxDeliveryCount is how many deliveries a message gets before it is
	// dead-lettered with reason "MaxDeliveryCountExceeded". Zero means 10.
	MaxDeliveryCount int

	// DuplicateDetectionWindow enables duplicate detection on MessageId when
	// positive: a send whose MessageId was accepted less than the window ago
	// succeeds but is dropped. Zero turns duplicate detection off. Unlike
	// Service Bus (20s minimum) any positive window is accepted, to keep
	// tests short.
	DuplicateDetectionWindow time.Duration

	// DefaultTTL is the time-to-live of messages that do not set header TTL.
	// Zero means messages never expire unless they set their own TTL.
	DefaultTTL time.Duration

	// DeadLetterOnExpiration moves expired messages to the dead-letter queue
	// with reason "TTLExpiredException" instead of dropping them.
	DeadLetterOnExpiration bool

	// MaxMessageSize is the largest encoded message accepted, in bytes.
	// Zero means 256 KiB (the Standard tier limit).
	MaxMessageSize int

	// ForwardTo, when set, names a queue or topic that every message
	// becoming available here is moved to at once (auto-forwarding): the
	// queue itself then never delivers. Scheduled messages wait here until
	// due. The target must exist and the forwarding must not loop.
	ForwardTo string

	// ForwardDeadLetteredMessagesTo, when set, names a queue or topic that
	// receives the messages this queue dead-letters (with their
	// DeadLetterReason), instead of its own dead-letter queue.
	ForwardDeadLetteredMessagesTo string

	// RequiresSession makes the queue session-aware (session.go): every
	// message must carry a session id (the SDK's SessionID), only session
	// receivers receive, one per session at a time, in sequence order
	// within the session. It is fixed at creation, as on Service Bus. The
	// dead-letter queue is never session-aware. False: no sessions.
	RequiresSession bool

	// Status is the queue's status (status.go): Disabled, SendDisabled and
	// ReceiveDisabled refuse sends, receives or both with
	// [ErrEntityDisabled], keeping the messages. It can change with
	// [Broker.UpdateQueue]. Zero means Active.
	Status EntityStatus
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c QueueConfig) withDefaults() QueueConfig {
	if c.LockDuration == 0 {
		c.LockDuration = DefaultLockDuration
	}
	if c.MaxDeliveryCount == 0 {
		c.MaxDeliveryCount = DefaultMaxDeliveryCount
	}
	if c.MaxMessageSize == 0 {
		c.MaxMessageSize = DefaultMaxMessageSize
	}
	return c
}

// validate reports the first problem with c, wrapped in [ErrInvalidConfig].
func (c QueueConfig) validate() error {
	return c.validateAs("queue")
}

// validateAs is validate with the entity named as what (queue, topic,
// subscription) in errors.
func (c QueueConfig) validateAs(what string) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s %q: %s", ErrInvalidConfig, what, c.Name, fmt.Sprintf(format, args...))
	}
	switch {
	case strings.TrimSpace(c.Name) == "":
		return bad("empty name")
	case strings.Contains(c.Name, "/"):
		return bad("name must not contain '/'")
	case c.LockDuration < 0:
		return bad("negative LockDuration %v", c.LockDuration)
	case c.LockDuration > MaxLockDuration:
		return bad("LockDuration %v exceeds the Service Bus maximum %v", c.LockDuration, MaxLockDuration)
	case c.MaxDeliveryCount < 0:
		return bad("negative MaxDeliveryCount %d", c.MaxDeliveryCount)
	case c.DuplicateDetectionWindow < 0:
		return bad("negative DuplicateDetectionWindow %v", c.DuplicateDetectionWindow)
	case c.DefaultTTL < 0:
		return bad("negative DefaultTTL %v", c.DefaultTTL)
	case c.MaxMessageSize < 0:
		return bad("negative MaxMessageSize %d", c.MaxMessageSize)
	case !c.Status.valid():
		return bad("entity status %q: want Active, Disabled, SendDisabled or ReceiveDisabled", string(c.Status))
	}
	return nil
}

// Options configures a [Broker]. The zero value is ready to use.
type Options struct {
	// Topics are served alongside the queues given to [New], each with its
	// subscriptions. Nil means no topics.
	Topics []TopicConfig

	// Clock is the source of time for locks, schedules, TTL and duplicate
	// detection windows. Nil means the real clock ([RealClock]); tests pass
	// a fake clock (such as github.com/benbjohnson/clock's *Mock) to drive
	// time explicitly.
	Clock Clock

	// DataDir, when set, keeps the broker's state in that directory
	// (created if missing) so that it survives a restart or a crash: the
	// entities, every message with its properties, delivery count and
	// schedule, dead-letter queues, sequence counters and the
	// duplicate-detection history. [New] loads what is there; stored
	// entities win over the configured ones with the same name, and
	// configured entities not stored yet are added. Locks do not survive:
	// locked messages come back as if their locks had expired. A change is
	// durable once [Broker.Sync] returns or [Broker.AfterSync] calls back;
	// see persist.go. One broker at a time may use a directory. Empty means
	// memory only.
	DataDir string

	// CompactAfter is how many bytes the journal may grow before the
	// broker writes a snapshot of its state and starts a new, empty
	// journal (at least the size of the last snapshot, so snapshots of a
	// large state stay rare). Zero means [DefaultCompactAfter] (64 MiB);
	// negative is invalid. Only used with DataDir.
	CompactAfter int64

	// TruncateDamagedJournal lets [New] start on a data directory whose
	// journal is damaged in the middle (not a torn tail, which is always
	// cut off; see persist_damage.go): the journal is cut at the last good
	// record, what was dropped (file, offset, bytes) is logged at Warn
	// level, the damaged files are kept as <name>.damaged, and the
	// records after the damage, which may have been acknowledged, are
	// lost. False (the default) makes New refuse such a directory with a
	// [*DamageError]. A damaged snapshot is refused either way. Only used
	// with DataDir.
	TruncateDamagedJournal bool

	// ShareBodies made deliveries share the stored message's body while
	// the broker kept messages decoded. The broker now keeps each message
	// encoded, so every message it hands out is decoded afresh and
	// entirely the caller's own, which callers may change freely.
	//
	// Deprecated: it has no effect; it is kept so that code setting it
	// still compiles.
	ShareBodies bool

	// Logger receives what persistence has to say: a torn tail cut off at
	// open (Info), a truncation (Warn), the failure that stopped the
	// journal (Error). Nil discards it. Only used with DataDir.
	Logger *slog.Logger
}
