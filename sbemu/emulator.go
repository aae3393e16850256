package sbemu

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/sbretry/retry/sbemu/broker"
	"github.com/sbretry/retry/sbemu/internal/fault"
)

// Defaults used by [Start] when the matching [Config] field is zero.
const (
	// DefaultAddr is the listen address used when [Config.Addr] is empty: a
	// free loopback port chosen by the kernel.
	DefaultAddr = "127.0.0.1:0"
	// DefaultKeyName is the shared access key name put into
	// [Emulator.ConnectionString] when [Config.KeyName] is empty. It matches
	// the name of the root key of a real namespace.
	DefaultKeyName = "RootManageSharedAccessKey"
	// DefaultKey is the development key put into [Emulator.ConnectionString]
	// when [Config.Key] is empty. It is the value Microsoft's own emulator
	// documents, so it is not a secret.
	DefaultKey = "SAS_KEY_VALUE"
	// DefaultQueueName is the queue created when [Config.Queues] and
	// [Config.Topics] are both empty.
	DefaultQueueName = "queue"
	// DefaultIdleTimeout is used when [Config.IdleTimeout] is zero.
	DefaultIdleTimeout = time.Minute
)

// Config configures an [Emulator]. The zero value is usable: it listens on a
// free loopback port with a single queue named [DefaultQueueName].
type Config struct {
	// Addr is the TCP address to listen on. Empty means [DefaultAddr].
	Addr string

	// TLS, when set, makes the TCP listener speak TLS (amqps), for clients
	// that cannot connect without it, such as SDKs that predate the
	// UseDevelopmentEmulator connection-string setting. The Go SDK does not
	// need it; with it set, [Emulator.ConnectionString] is still the plain
	// form, and clients must be pointed at [Emulator.Addr] themselves. Nil
	// means plain TCP.
	TLS *tls.Config

	// AdminAddr is the TCP address the administration API (HTTPS, see
	// admin.go and [Emulator.AdminClientOptions]) listens on. Empty means
	// [DefaultAddr], a free loopback port. Ignored with InMemory.
	AdminAddr string

	// InMemory opens no socket: clients connect only through
	// [Emulator.NewWebSocketConn] (or [Emulator.DialInMemory]), and
	// [Emulator.ConnectionString] names [InMemoryHost]. This is what lets
	// the SDK and the emulator run inside one testing/synctest bubble; see
	// [Clock]. Addr is ignored.
	InMemory bool

	// Queues are the queues the emulator serves. Names are matched
	// case-insensitively; every queue also has its dead-letter sub-queue
	// "<name>/$DeadLetterQueue". Empty, with no Topics either, means one
	// queue named [DefaultQueueName] with the broker's default settings.
	Queues []broker.QueueConfig

	// Topics are the topics the emulator serves, each with its
	// subscriptions and their rules. Clients send and schedule to
	// "<topic>" and receive from "<topic>/Subscriptions/<name>" and its
	// "/$DeadLetterQueue" (the SDK's NewReceiverForSubscription). Queues
	// and topics share one namespace.
	Topics []broker.TopicConfig

	// KeyName and Key are the shared access key put into
	// [Emulator.ConnectionString]. Empty means [DefaultKeyName] and
	// [DefaultKey]. They are only checked when StrictAuth is set.
	KeyName, Key string

	// StrictAuth makes the "$cbs" node verify every put-token request: the
	// token must be a SharedAccessSignature signed with Key for KeyName, not
	// yet expired on Clock, and for the entity or a prefix of it (a
	// namespace token, sr=sb://host/, covers every entity; prefixes are
	// matched by path segment, ignoring case), or the request is answered
	// 401 and links to entities without a valid token are refused. As on
	// Service Bus, a link whose token expires without a fresh put-token is
	// detached with amqp:link:detach-forced, on Clock; the SDK then puts a
	// new token and re-attaches. The administration API checks its
	// Authorization header the same way. A token carries the rights of the
	// policy that signed it (rights.go): KeyName's has every right, those of
	// AuthorizationRules and of the entities' own rules (set through the
	// administration API) what they list, and the emulator refuses what a
	// token's rights do not cover as Service Bus does. An expired token is
	// answered 401 "ExpiredToken: The token is expired. ...". False accepts
	// any token, as Microsoft's emulator does, with every right.
	StrictAuth bool

	// AuthorizationRules are the namespace's shared access policies besides
	// KeyName and Key (which always have Manage, Send and Listen): a key
	// name, keys and rights each, checked under StrictAuth. Nil means none.
	// A rule without a key name or primary key, with an unknown right or
	// none, or naming a key name already used makes [Start] fail.
	AuthorizationRules []AuthorizationRule

	// AcceptUnverifiedJWT makes StrictAuth accept tokens of type jwt, what
	// an azcore.TokenCredential (Entra ID) produces, on "$cbs" and in the
	// administration API, without checking them, with every right until
	// the expiry the client names: the emulator cannot verify them against
	// Entra ID. False refuses them under StrictAuth (401). Without
	// StrictAuth every token is accepted anyway.
	AcceptUnverifiedJWT bool

	// Clock drives the broker (lock expiry, scheduled activation, TTL,
	// duplicate detection) and token expiry checks, so a test can move time
	// through them with no real waiting. Nil means the real clock. Network
	// timing (heartbeats, idle timeout, handshake and write deadlines) and
	// the Hang and RefuseConnections faults always use real time: they model
	// the network, which a fake clock does not drive. See [Clock].
	Clock Clock

	// Logger receives connection events at Info and every frame at Debug.
	// Secrets (keys, signatures, tokens) are never logged. Nil discards logs.
	Logger *slog.Logger

	// KeepLocksOnDisconnect keeps the locks of a connection that closes or drops until they expire,
	// instead of returning its messages to the queue at once. Set, the emulator behaves as Service Bus
	// does: the SDK's own live test TestMessageSettlementUsingOnlyBackupSettlement (azservicebus v1.11.0
	// messageSettler_test.go) closes the receiving connection and then completes, abandons and
	// dead-letters its message by lock token from another connection through $management, which only
	// works if the service kept the lock; SDK maintainers also observed renewals succeeding after a
	// reconnect. Renew-lock and settlement by lock token then keep working for the closed
	// connection's messages, which are redelivered only when their locks expire.
	//
	// False (the default) returns them at once, with the delivery counted, as the Service Bus
	// documentation describes a lost lock. The default stays false although the service keeps locks,
	// because tests of this repository outside the emulator are written against it: the e2e drop
	// tests (TestDropMidHandlerCompletesWithinSeconds, TestDropAfterFailedAttemptKeepsOneSuccessor,
	// TestDropNeverRunsAMessageTwiceAtOnce, TestDropDoesNotHoldNewMessagesBehindARepublish) and
	// TestSubscriptionDropBetweenScheduleAndComplete expect a dropped connection's messages back within
	// seconds, not after their 60 s locks, and fail with the locks kept. sdklive, which runs the SDK's
	// live tests, sets it.
	//
	// Either way a session receiver's session lock ends with its link, and the messages locked under it
	// go back to the session at once, uncounted, as a closed session's do (broker/session.go).
	KeepLocksOnDisconnect bool

	// Limits bound what clients can make the emulator hold; the zero value
	// gives the defaults documented on each field of [Limits].
	Limits Limits

	// IdleTimeout is how long a connection may stay silent before the
	// emulator closes it; half of it is advertised to clients in the open
	// frame so they send heartbeats in time. Zero means
	// [DefaultIdleTimeout]; negative disables the check.
	IdleTimeout time.Duration

	// DataDir, when set, keeps entities, messages (active, scheduled and
	// dead-lettered), sequence numbers and duplicate-detection history in
	// that directory, so they survive [Emulator.Close] and a crash, even a
	// SIGKILL: the emulator acknowledges a send, a settlement or a
	// management operation only once it is on disk. Start loads what is
	// there; stored entities win over Queues and Topics of the same name,
	// new ones are added. Locks do not survive: locked messages come back
	// with the delivery counted, as if their locks had expired. Empty
	// means memory only, as Microsoft's emulator. See
	// [broker.Options.DataDir].
	//
	// The directory also keeps the admin API's certificate authority
	// ([AdminCAFile], and its key in [AdminCAKeyFile], mode 0600), made by
	// the first start and reused by every later one, so clients that trust
	// it keep trusting the emulator across restarts; and, while the
	// emulator runs (unless InMemory), its addresses in [EndpointsFile], so
	// that [AdminClientOptionsFromDir] can reach it from another process.
	DataDir string

	// TruncateDamagedJournal lets Start open a DataDir whose journal is
	// damaged in the middle, which a crash cannot cause: the journal is
	// cut at its last good record and what was dropped is logged. False
	// makes Start refuse it with a [*broker.DamageError] naming the file
	// and offset. See [broker.Options.TruncateDamagedJournal].
	TruncateDamagedJournal bool
}

// withDefaults returns a copy of c with every zero field replaced by its
// documented default.
func (c Config) withDefaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.AdminAddr == "" {
		c.AdminAddr = DefaultAddr
	}
	if len(c.Queues) == 0 && len(c.Topics) == 0 {
		c.Queues = []broker.QueueConfig{{Name: DefaultQueueName}}
	}
	if c.KeyName == "" {
		c.KeyName = DefaultKeyName
	}
	if c.Key == "" {
		c.Key = DefaultKey
	}
	if c.Clock == nil {
		c.Clock = broker.RealClock()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Limits = c.Limits.withDefaults()
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.IdleTimeout < 0 {
		c.IdleTimeout = 0
	}
	return c
}

// Emulator is a running Service Bus emulator. Create it with [Start] and stop
// it with [Emulator.Close]. All methods are safe for concurrent use.
type Emulator struct {
	// cfg has every default applied and is never modified after Start.
	cfg    Config
	log    *slog.Logger
	broker *broker.Broker
	ln     net.Listener // the TCP listener, or mem with Config.InMemory
	mem    *memListener // connections from DialInMemory
	faults fault.Injector
	admin  *adminServer // the administration API (admin.go)
	// policies are the namespace's shared access policies by lower-case
	// key name (rights.go); read-only after Start.
	policies map[string]policy

	// persistent is set with Config.DataDir: answers wait for the journal
	// (durable.go).
	persistent bool

	// mu guards the live connections, the id counter (ids start at 1 and
	// are never reused, so an id is a safe broker lock owner) and closed.
	mu         sync.Mutex
	conns      map[*conn]struct{}
	admitted   int // connections in conns within Limits.MaxConnections
	nextConnID uint64
	closed     bool

	done      chan struct{} // closed by Close
	closeOnce sync.Once
	wg        sync.WaitGroup // accept loop and every connection
}

// Start creates the broker, starts listening on cfg.Addr and serves
// connections in the background. The emulator is accepting connections when
// Start returns; call [Emulator.Close] to stop it.
func Start(cfg Config) (*Emulator, error) {
	cfg = cfg.withDefaults()
	policies, err := namespacePolicies(cfg)
	if err != nil {
		return nil, err
	}
	b, err := broker.New(broker.Options{
		Clock: cfg.Clock, Topics: cfg.Topics,
		DataDir: cfg.DataDir, TruncateDamagedJournal: cfg.TruncateDamagedJournal, Logger: cfg.Logger,
	}, cfg.Queues...)
	if err != nil {
		return nil, fmt.Errorf("sbemu: creating broker: %w", err)
	}
	mem := newMemListener()
	var ln net.Listener = mem
	if !cfg.InMemory {
		if ln, err = net.Listen("tcp", cfg.Addr); err != nil {
			b.Close()
			return nil, fmt.Errorf("sbemu: listening on %s: %w", cfg.Addr, err)
		}
		if cfg.TLS != nil {
			// The TLS handshake runs on the connection's first read, inside
			// the emulator's handshake deadline.
			ln = tls.NewListener(ln, cfg.TLS)
		}
	}
	e := &Emulator{
		cfg:    cfg,
		log:    cfg.Logger,
		broker: b,
		ln:     ln,
		mem:    mem,
		conns:  make(map[*conn]struct{}),
		done:   make(chan struct{}),

		policies: policies,

		persistent: b.Persistent(),
	}
	if err := e.startAdmin(); err != nil {
		_ = ln.Close()
		b.Close()
		return nil, err
	}
	if cfg.DataDir != "" && !cfg.InMemory {
		// Clients in other processes find the listeners here (endpoints.go).
		if err := e.writeEndpoints(); err != nil {
			e.stopAdmin()
			_ = ln.Close()
			b.Close()
			return nil, err
		}
	}
	e.log.Info("sbemu: listening", "addr", ln.Addr().String(), "queues", len(cfg.Queues), "topics", len(cfg.Topics), "strictAuth", cfg.StrictAuth, "dataDir", cfg.DataDir)
	e.wg.Add(1)
	go e.acceptLoop(ln)
	if ln != net.Listener(mem) {
		e.wg.Add(1)
		go e.acceptLoop(mem)
	}
	return e, nil
}

// Addr is the address the emulator listens on, with the port resolved; with
// [Config.InMemory] it is the in-memory endpoint, named [InMemoryHost].
func (e *Emulator) Addr() net.Addr { return e.ln.Addr() }

// ConnectionString is the connection string an azservicebus client uses to
// reach this emulator. It contains the configured key, so do not log it.
func (e *Emulator) ConnectionString() string {
	return fmt.Sprintf("Endpoint=sb://%s;SharedAccessKeyName=%s;SharedAccessKey=%s;UseDevelopmentEmulator=true",
		e.ln.Addr().String(), e.cfg.KeyName, e.cfg.Key)
}

// Broker is the in-memory broker behind the emulator, for inspecting queue,
// dead-letter and scheduled contents in tests. Its deliveries and peeks are
// decoded from the stored messages, so they are the caller's own.
func (e *Emulator) Broker() *broker.Broker { return e.broker }

// CreateQueue adds a queue while the emulator runs; clients can attach to it
// as soon as CreateQueue returns. It is validated with the existing
// entities as [Start] would; see [broker.Broker.AddQueue].
func (e *Emulator) CreateQueue(cfg broker.QueueConfig) error {
	return e.broker.AddQueue(cfg)
}

// CreateTopic adds a topic with its subscriptions while the emulator runs;
// see [Emulator.CreateQueue].
func (e *Emulator) CreateTopic(cfg broker.TopicConfig) error {
	return e.broker.AddTopic(cfg)
}

// Close stops listening, closes every connection and waits until every
// goroutine the emulator started has returned. Messages still in the broker
// are discarded, unless [Config.DataDir] keeps them; then Close also
// reports a failure to write them. Close is idempotent; later calls return
// nil.
func (e *Emulator) Close() error {
	var err error
	e.closeOnce.Do(func() {
		e.mu.Lock()
		e.closed = true
		conns := e.snapshotConnsLocked()
		e.mu.Unlock()
		close(e.done)
		// First, so that clients in other processes stop finding an
		// emulator that is going away.
		e.removeEndpoints()
		// A hang would otherwise keep connection goroutines blocked in waitHang
		// and make wg.Wait below wait for the hang's full duration.
		e.faults.EndHang()
		if cerr := e.ln.Close(); cerr != nil && !errors.Is(cerr, net.ErrClosed) {
			err = fmt.Errorf("sbemu: closing listener: %w", cerr)
		}
		_ = e.mem.Close()
		for _, c := range conns {
			c.abort()
		}
		e.wg.Wait()
		e.stopAdmin()
		// Last, after every connection has released its locks to the broker.
		e.broker.Close()
		// After Close, Sync reports how the journal's final flush went.
		if serr := e.broker.Sync(context.Background()); serr != nil && err == nil {
			err = fmt.Errorf("sbemu: %w", serr)
		}
		e.log.Info("sbemu: closed")
	})
	return err
}

// acceptLoop accepts connections from ln until it is closed.
func (e *Emulator) acceptLoop(ln net.Listener) {
	defer e.wg.Done()
	for {
		nc, err := ln.Accept()
		if err != nil {
			select {
			case <-e.done:
				return
			default:
			}
			var ne net.Error
			// Timeouts are retried silently and other errors (such as running
			// out of file descriptors) logged and retried: only Close ends
			// the loop.
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			e.log.Warn("sbemu: accept failed", "err", err)
			continue
		}
		if !e.admit(nc) {
			return
		}
	}
}

// admit serves nc as a client connection on a goroutine of its own, as
// every door does (TCP, in memory, WebSockets); it returns false, having
// closed nc, once the emulator is closed.
func (e *Emulator) admit(nc net.Conn) bool {
	// Closed before any byte is read: the client sees a reset or EOF on its
	// protocol header, as with an unreachable namespace.
	if e.faults.Refusing() {
		_ = nc.Close()
		return true
	}
	e.mu.Lock()
	// Close may have run between Accept and here; the connection must not
	// be registered after Close took its snapshot.
	if e.closed {
		e.mu.Unlock()
		_ = nc.Close()
		return false
	}
	e.nextConnID++
	c := newConn(e, e.nextConnID, nc)
	// A connection over the limit is still served up to its open, so it
	// can be told why it is closed; it does not count as admitted.
	c.overLimit = e.admitted >= e.cfg.Limits.MaxConnections
	if !c.overLimit {
		e.admitted++
	}
	e.conns[c] = struct{}{}
	e.wg.Add(1)
	e.mu.Unlock()
	go func() {
		defer e.wg.Done()
		c.serve()
		e.mu.Lock()
		delete(e.conns, c)
		if !c.overLimit {
			e.admitted--
		}
		e.mu.Unlock()
	}()
	return true
}

// snapshotConnsLocked copies the live connections; e.mu must be held.
func (e *Emulator) snapshotConnsLocked() []*conn {
	out := make([]*conn, 0, len(e.conns))
	for c := range e.conns {
		out = append(out, c)
	}
	return out
}

// snapshotConns copies the live connections.
func (e *Emulator) snapshotConns() []*conn {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.snapshotConnsLocked()
}
